package tensor

import (
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/alloc"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// tagCounter is a Tracer that counts allocations by category and label.
type tagCounter struct{ n map[snapshot.Category]int }

func (c *tagCounter) SetPhase(snapshot.Phase)                            {}
func (c *tagCounter) TagNextAlloc(cat snapshot.Category, _ string)       { c.n[cat]++ }
func (c *tagCounter) SetCategory(int, uint64, snapshot.Category, string) {}
func (c *tagCounter) PushScope(string)                                   {}
func (c *tagCounter) PopScope()                                          {}

func TestAutocastPolicyAndCache(t *testing.T) {
	tc := &tagCounter{n: map[snapshot.Category]int{}}
	rt := NewRuntime(device.NewSimulated(device.Meta, 0, 1<<30, 0, alloc.DefaultConfig()), tc, 1)
	w := rt.Zeros(F32, []int{64, 32}, "w", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("w")
	b := rt.Zeros(F32, []int{64}, "b", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("b")
	// x requires grad (so the matmuls save their weights) but is no leaf (so its casts are not cached).
	leaf := rt.Zeros(F32, []int{16, 32}, "x", snapshot.CategoryInput).SetRequiresGrad(true)
	x := Scale(leaf, 1)
	base := allocated(rt)

	var y1, y2, p, ln *Tensor
	rt.Autocast(F16, func() {
		y1 = Linear(x, w, b)
		y2 = Linear(x, w, b) // the weight and bias casts come from the cache
		p = Softmax(y1)      // float32 policy
		ln = LayerNorm(y2, nil, nil, 1e-5)
	})
	if got := tc.n[snapshot.CategoryAMPCache]; got != 2 {
		t.Errorf("%d casts into the autocast cache for two uses of one weight and bias, want 2", got)
	}
	for name, tt := range map[string]struct {
		t    *Tensor
		want DType
	}{"linear": {y1, F16}, "softmax": {p, F32}, "layer_norm": {ln, F32}} {
		if tt.t.DType() != tt.want {
			t.Errorf("%s under autocast gives %v, want %v", name, tt.t.DType(), tt.want)
		}
	}
	// Outside the region: the bias cast is gone (nothing saved it); the weight cast lives on in the graph.
	var castWeights int
	for _, st := range rt.SavedTensors() {
		if st.Category == "amp_cache" {
			castWeights++
			if st.Bytes != 64*32*2 {
				t.Errorf("cast weight %s takes %d bytes, want %d", st.Label, st.Bytes, 64*32*2)
			}
		}
	}
	if castWeights != 1 {
		t.Errorf("%d cast weights kept for backward, want 1 shared by both linears", castWeights)
	}
	for _, r := range []*Tensor{y1, y2, p, ln} {
		r.Release()
	}
	if got := allocated(rt); got != base {
		t.Errorf("%d bytes left after releasing the outputs", got-base)
	}
	w.Release()
	b.Release()
	x.Release()
	leaf.Release()
}
