package nn

import (
	"math"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// ampGrads runs one forward (under autocast to dtype unless it is F32) and backward of a small GPT on the cpu
// device, and returns every parameter's gradient.
func ampGrads(t *testing.T, dtype tensor.DType) map[string][]float32 {
	rt := gptRuntime(device.CPU)
	g, err := NewGPT(rt, smallGPT("naive", 0))
	if err != nil {
		t.Fatal(err)
	}
	idx := tokens(rt, 2, 8, 13)
	var loss *tensor.Tensor
	if dtype == tensor.F32 {
		loss = g.Loss(idx, idx)
	} else {
		rt.Autocast(dtype, func() { loss = g.Loss(idx, idx) })
	}
	if loss.DType() != tensor.F32 {
		t.Errorf("loss under autocast is %v, want f32 (cross-entropy runs in float32)", loss.DType())
	}
	loss.Backward(false)
	grads := map[string][]float32{}
	for _, p := range g.Parameters() {
		if p.Tensor.Grad().DType() != tensor.F32 {
			t.Errorf("gradient of %s is %v, want f32 like its parameter", p.Name, p.Tensor.Grad().DType())
		}
		grads[p.Name] = p.Tensor.Grad().Values()
	}
	loss.Release()
	idx.Release()
	g.Release()
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d references left after releasing everything", n)
	}
	return grads
}

func TestAutocastGradientsAreCloseToFP32(t *testing.T) {
	full := ampGrads(t, tensor.F32)
	for _, tc := range []struct {
		dtype tensor.DType
		tol   float64 // relative error of each gradient, in norm
	}{{tensor.F16, 0.01}, {tensor.BF16, 0.05}} {
		t.Run(tc.dtype.String(), func(t *testing.T) {
			half := ampGrads(t, tc.dtype)
			for name, g := range full {
				var diff, norm float64
				for i := range g {
					d := float64(g[i] - half[name][i])
					diff += d * d
					norm += float64(g[i]) * float64(g[i])
				}
				if rel := math.Sqrt(diff / max(norm, 1e-30)); rel > tc.tol {
					t.Errorf("%s: relative gradient error %.4f > %.3f", name, rel, tc.tol)
				}
			}
		})
	}
}

// categoryCounter is a Tracer that counts allocations per category.
type categoryCounter struct{ counts map[snapshot.Category]int }

func (c *categoryCounter) SetPhase(snapshot.Phase) {}
func (c *categoryCounter) TagNextAlloc(cat snapshot.Category, _ string) {
	c.counts[cat]++
}
func (c *categoryCounter) SetCategory(int, uint64, snapshot.Category, string) {}
func (c *categoryCounter) PushScope(string)                                   {}
func (c *categoryCounter) PopScope()                                          {}

func TestAutocastCastsEachWeightOncePerForward(t *testing.T) {
	for _, attention := range []string{"naive", "flash"} {
		t.Run(attention, func(t *testing.T) {
			counter := &categoryCounter{counts: map[snapshot.Category]int{}}
			rt := tensor.NewRuntime(device.NewSimulated(device.Meta, 0, 8<<30, 0, allocator.DefaultConfig()), counter, 1)
			cfg := smallGPT(attention, 0.1)
			g, _ := NewGPT(rt, cfg)
			idx := tokens(rt, 2, 8, 13)
			for step := range 2 {
				counter.counts = map[snapshot.Category]int{}
				var loss *tensor.Tensor
				rt.Autocast(tensor.BF16, func() { loss = g.Loss(idx, idx) })
				// Four Linear layers per block with a weight and a bias each, and the LM head's (tied) weight.
				if want := 8*cfg.Layers + 1; counter.counts[snapshot.CategoryAMPCache] != want {
					t.Errorf("step %d: %d casts into the autocast cache, want %d", step, counter.counts[snapshot.CategoryAMPCache], want)
				}
				// Weights saved by their matmuls outlive the cache; biases do not.
				var kept int
				for _, st := range rt.SavedTensors() {
					if st.Category == "amp_cache" {
						kept++
						if !strings.Contains(st.Label, "bf16[") {
							t.Errorf("cached cast %s is not bf16", st.Label)
						}
					}
				}
				if want := 4*cfg.Layers + 1; kept != want {
					t.Errorf("step %d: %d cast weights saved for backward, want %d", step, kept, want)
				}
				loss.Backward(false)
				loss.Release()
				for _, p := range g.Parameters() {
					p.Tensor.SetGrad(nil)
				}
				if len(rt.SavedTensors()) != 0 {
					t.Errorf("step %d: saved tensors left after backward", step)
				}
			}
			idx.Release()
			g.Release()
			if n := rt.LiveHandles(); n != 0 {
				t.Errorf("%d references left", n)
			}
		})
	}
}
