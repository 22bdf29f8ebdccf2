package tensor

import (
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
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
	rt := NewRuntime(device.NewSimulated(device.Meta, 0, 1<<30, 0, allocator.DefaultConfig()), tc, 1)
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

// allocLog is a Tracer that keeps the label of every allocation, in order, with the phase it was made in.
type allocLog struct {
	phase  snapshot.Phase
	labels []string
	phases []snapshot.Phase
}

func (l *allocLog) SetPhase(p snapshot.Phase) { l.phase = p }
func (l *allocLog) TagNextAlloc(_ snapshot.Category, label string) {
	l.labels = append(l.labels, label)
	l.phases = append(l.phases, l.phase)
}
func (l *allocLog) SetCategory(int, uint64, snapshot.Category, string) {}
func (l *allocLog) PushScope(string)                                   {}
func (l *allocLog) PopScope()                                          {}

// take returns the labels logged since the last take.
func (l *allocLog) take() []string {
	out := l.labels
	l.labels, l.phases = nil, nil
	return out
}

func newLogged(kind device.Kind) (*Runtime, *allocLog) {
	l := &allocLog{}
	return NewRuntime(device.NewSimulated(kind, 0, 1<<30, 0, allocator.DefaultConfig()), l, 7), l
}

// TestSoftmaxHalfToFloat follows aten/src/ATen/native/SoftMax.cpp: softmax(input, dim, dtype) with a float16
// CUDA input and dtype float32 (what autocast's fp32_set_opt_dtype asks for) calls _softmax(input, dim,
// half_to_float=true): no float32 copy of the input, a float32 result, and a backward
// (_softmax_backward_data(grad, result, dim, input_dtype)) that writes the float16 gradient itself. Any other
// 16-bit input (bfloat16) is converted first (input_.toType(dtype)) and its gradient converted back.
func TestSoftmaxHalfToFloat(t *testing.T) {
	tests := map[DType]struct{ forward, backward []string }{
		F16: {
			forward:  []string{"f32[4,6] softmax.out"},
			backward: []string{"f32[] grad.seed", "f16[4,6] softmax.out.grad"},
		},
		BF16: {
			forward:  []string{"f32[4,6] to.f32", "f32[4,6] softmax.out"},
			backward: []string{"f32[] grad.seed", "f32[4,6] softmax.out.grad", "bf16[4,6] to.bf16"},
		},
	}
	for dtype, want := range tests {
		t.Run(dtype.String(), func(t *testing.T) {
			rt, log := newLogged(device.Meta)
			x := rt.Zeros(dtype, []int{4, 6}, "x", snapshot.CategoryInput).SetRequiresGrad(true)
			log.take()
			var p *Tensor
			rt.Autocast(dtype, func() { p = Softmax(x) })
			if got := log.take(); !slices.Equal(got, want.forward) {
				t.Errorf("forward allocated %q, want %q", got, want.forward)
			}
			s := Sum(p)
			log.take()
			s.Backward(false)
			if got := log.take(); !slices.Equal(got, want.backward) {
				t.Errorf("backward allocated %q, want %q", got, want.backward)
			}
			if x.Grad().DType() != dtype {
				t.Errorf("the input's gradient is %v, want %v", x.Grad().DType(), dtype)
			}
			s.Release()
			p.Release()
			x.Release()
		})
	}
}

// TestCrossEntropyKeepsTheLogitsDType follows cross_entropy_loss_symint in aten/src/ATen/native/LossNLL.cpp:
// log_softmax(self, class_dim, self.scalar_type()) with the dtype given, which autocast's
// fp32_set_opt_dtype leaves alone, then nll_loss, which autocast's fp32 list converts to float32. So under
// autocast the 16-bit logits give 16-bit log-probabilities (saved by LogSoftmaxBackward0) and a float32 copy
// (saved by NllLossBackward0): 6 bytes per logit, derived here from two class counts. In float32 the one
// log_softmax result is saved by both: 4 bytes per logit.
func TestCrossEntropyKeepsTheLogitsDType(t *testing.T) {
	const rows = 6
	saved := func(ac DType, classes int) uint64 {
		rt := newMeta(t, 1<<30)
		dtype := ac
		logits := rt.Zeros(dtype, []int{rows, classes}, "logits", snapshot.CategoryInput).SetRequiresGrad(true)
		target := rt.Zeros(I64, []int{rows}, "target", snapshot.CategoryInput)
		var loss *Tensor
		if ac == F32 {
			loss = CrossEntropy(logits, target)
		} else {
			rt.Autocast(ac, func() { loss = CrossEntropy(logits, target) })
		}
		if loss.DType() != F32 {
			t.Errorf("%v: the loss is %v, want f32", ac, loss.DType())
		}
		var n uint64
		for _, st := range rt.SavedTensors() {
			if !strings.Contains(st.Label, "i64") && st.Label != "f32[] nll_loss.total_weight" {
				n += st.Bytes
			}
		}
		return n
	}
	for ac, want := range map[DType]uint64{F32: 4, F16: 6, BF16: 6} {
		if got := (saved(ac, 1000) - saved(ac, 200)) / (rows * 800); got != want {
			t.Errorf("%v: %d bytes saved per logit, want %d", ac, got, want)
		}
	}
}

// TestAutocastCachesWeightsUnderNoGrad follows cached_cast in aten/src/ATen/autocast_mode.cpp: a cast is
// cached whenever its source is a float32 leaf that requires grad and is not a view, in whatever grad mode;
// the cache lives until the outermost autocast region ends. So under no_grad (an evaluation, a checkpointed
// forward) a weight used twice is cast once, and its cast stays allocated after the op's output is gone.
func TestAutocastCachesWeightsUnderNoGrad(t *testing.T) {
	rt, log := newLogged(device.Meta)
	w := rt.Zeros(F32, []int{64, 32}, "w", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("w")
	b := rt.Zeros(F32, []int{64}, "b", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("b")
	x := rt.Zeros(F32, []int{16, 32}, "x", snapshot.CategoryInput)
	base := allocated(rt)
	log.take()
	rt.NoGrad(func() {
		rt.Autocast(BF16, func() {
			Linear(x, w, b).Release()
			Linear(x, w, b).Release()
			if got, want := allocated(rt)-base, block(64*32*2)+block(64*2); got != want {
				t.Errorf("%d bytes held in the region after the outputs are gone, want %d (the cached weight and bias casts)", got, want)
			}
		})
	})
	var casts []string
	for _, l := range log.take() {
		if strings.HasSuffix(l, " to.bf16") {
			casts = append(casts, l)
		}
	}
	if want := []string{"bf16[64] to.bf16", "bf16[64,32] to.bf16", "bf16[16,32] to.bf16", "bf16[16,32] to.bf16"}; !slices.Equal(casts, want) {
		t.Errorf("casts %q, want %q: the input twice, the weight and bias once", casts, want)
	}
	if got := allocated(rt); got != base {
		t.Errorf("%d bytes left after the autocast region ended", got-base)
	}
	w.Release()
	b.Release()
	x.Release()
}
