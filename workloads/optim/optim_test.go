package optim

import (
	"fmt"
	"math"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/alloc"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

func runtimeOn(kind device.Kind) *tensor.Runtime {
	return tensor.NewRuntime(device.NewSimulated(kind, 0, 1<<30, 0, alloc.DefaultConfig()), nil, 1)
}

// params makes two parameters with fixed values and gives them fixed gradients.
func params(rt *tensor.Runtime, values [][]float32, grads [][]float32) []*nn.Parameter {
	var ps []*nn.Parameter
	for i, v := range values {
		name := fmt.Sprintf("p%d", i)
		t := rt.FromValues(tensor.F32, []int{len(v)}, v, name, snapshot.CategoryParameter).SetRequiresGrad(true).SetName(name)
		ps = append(ps, &nn.Parameter{Name: name, Tensor: t})
	}
	setGrads(rt, ps, grads)
	return ps
}

func setGrads(rt *tensor.Runtime, ps []*nn.Parameter, grads [][]float32) {
	for i, p := range ps {
		p.Tensor.SetGrad(rt.FromValues(tensor.F32, []int{len(grads[i])}, grads[i], "grad", snapshot.CategoryGradient))
	}
}

func TestOptimizersMatchPyTorch(t *testing.T) {
	values := [][]float32{{0.5, -1.25, 2, 0.125}, {-0.75, 3}}
	grads := [][][]float32{ // three steps
		{{0.1, -0.2, 0.3, -0.4}, {1, -2}},
		{{0.5, 0.5, -0.5, 0}, {-1, 0.25}},
		{{-0.3, 0.1, 0.2, 0.05}, {0.5, 0.5}},
	}
	tests := map[string]optCase{
		"sgd":        {Config{Kind: SGD, LR: 0.1}, "torch.optim.SGD(ps, lr=0.1, foreach=True)"},
		"momentum":   {Config{Kind: Momentum, LR: 0.1}, "torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)"},
		"sgd decay":  {Config{Kind: SGD, LR: 0.1, WeightDecay: 0.1}, "torch.optim.SGD(ps, lr=0.1, weight_decay=0.1, foreach=True)"},
		"adam":       {Config{Kind: Adam, LR: 0.01}, "torch.optim.Adam(ps, lr=0.01, foreach=True)"},
		"adam decay": {Config{Kind: Adam, LR: 0.01, WeightDecay: 0.1}, "torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=True)"},
		"adamw":      {Config{Kind: AdamW, LR: 0.01}, "torch.optim.AdamW(ps, lr=0.01, foreach=True)"},
	}
	// One PyTorch run computes every case: importing torch is the slow part.
	script := fmt.Sprintf(`
import json, torch
out = {}
for name, make in %s.items():
    ps = [torch.nn.Parameter(torch.tensor(v, dtype=torch.float32)) for v in %s]
    opt = make(ps)
    steps = []
    for gs in %s:
        for p, g in zip(ps, gs):
            p.grad = torch.tensor(g, dtype=torch.float32)
        opt.step()
        steps.append([p.detach().tolist() for p in ps])
    out[name] = steps
print(json.dumps(out))`, pyOptimizers(tests), pyList(values), pyList3(grads))
	var torchSteps map[string][][][]float64
	torchtest.Run(t, script, &torchSteps)

	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			want := torchSteps[name]
			if len(want) != len(grads) {
				t.Fatalf("PyTorch returned %d steps", len(want))
			}
			rt := runtimeOn(device.CPU)
			ps := params(rt, values, grads[0])
			opt, err := New(rt, ps, tc.cfg)
			if err != nil {
				t.Fatal(err)
			}
			for step := range grads {
				if step > 0 {
					setGrads(rt, ps, grads[step])
				}
				opt.Step()
				for i, p := range ps {
					got := p.Tensor.Values()
					for j := range got {
						if d := math.Abs(float64(got[j]) - want[step][i][j]); d > 1e-6 {
							t.Errorf("step %d param %d[%d] = %.7f, PyTorch %.7f", step+1, i, j, got[j], want[step][i][j])
						}
					}
				}
			}
		})
	}
}

// pyOptimizers renders the cases as a Python dict of name -> constructor.
func pyOptimizers(tests map[string]optCase) string {
	s := "{"
	for name, tc := range tests {
		s += fmt.Sprintf("%q: lambda ps: %s, ", name, tc.torch)
	}
	return s + "}"
}

// optCase is an optimizer configuration and the PyTorch expression that builds its twin.
type optCase struct {
	cfg   Config
	torch string
}

func pyList(v [][]float32) string { return fmt.Sprint(floatsToPy(v)) }

func pyList3(v [][][]float32) string {
	s := "["
	for i, x := range v {
		if i > 0 {
			s += ","
		}
		s += pyList(x)
	}
	return s + "]"
}

func floatsToPy(v [][]float32) string {
	s := "["
	for i, x := range v {
		if i > 0 {
			s += ","
		}
		s += "["
		for j, f := range x {
			if j > 0 {
				s += ","
			}
			s += fmt.Sprint(f)
		}
		s += "]"
	}
	return s + "]"
}

// peakDuring returns the peak allocated bytes while f runs (memory_stats' peak after a reset).
func peakDuring(rt *tensor.Runtime, f func()) int64 {
	a := rt.Device().Allocator()
	a.ResetPeakStats()
	f()
	st := a.Stats()
	return st.AllocatedBytes.All().Peak
}

func allocatedNow(rt *tensor.Runtime) int64 {
	st := rt.Device().Allocator().Stats()
	return st.AllocatedBytes.All().Current
}

func TestOptimizerMemory(t *testing.T) {
	// Parameters of 64 KiB and 128 KiB: small-pool blocks, so block size == bytes and the sums are exact.
	const p0, p1 = 16 << 10, 32 << 10 // elements
	const P = (p0 + p1) * 4           // bytes of all parameters
	tests := map[string]struct {
		cfg                    Config
		firstPeak, secondPeak  int64 // above parameters + gradients
		firstAfter, afterSteps int64 // state left after the first step and after the second
	}{
		"sgd":      {Config{Kind: SGD}, 0, 0, 0, 0},
		"momentum": {Config{Kind: Momentum}, P, P, P, P},
		// Adam: exp_avg and exp_avg_sq allocated at the first step, then every sqrt temporary alive at once.
		"adam":       {Config{Kind: Adam}, 3 * P, 3 * P, 2 * P, 2 * P},
		"adam decay": {Config{Kind: Adam, WeightDecay: 0.1}, 3 * P, 3 * P, 2 * P, 2 * P},
		"adamw":      {Config{Kind: AdamW}, 3 * P, 3 * P, 2 * P, 2 * P},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			rt := runtimeOn(device.Meta)
			ps := params(rt, [][]float32{make([]float32, p0), make([]float32, p1)}, [][]float32{make([]float32, p0), make([]float32, p1)})
			base := allocatedNow(rt)
			if base != 2*P {
				t.Fatalf("parameters and gradients take %d bytes, want %d", base, 2*P)
			}
			opt, _ := New(rt, ps, tc.cfg)
			if got := peakDuring(rt, opt.Step) - base; got != tc.firstPeak {
				t.Errorf("first step peaks %d bytes above params+grads, want %d", got, tc.firstPeak)
			}
			if got := allocatedNow(rt) - base; got != tc.firstAfter {
				t.Errorf("after the first step %d bytes of state, want %d", got, tc.firstAfter)
			}
			if got := peakDuring(rt, opt.Step) - base; got != tc.secondPeak {
				t.Errorf("second step peaks %d bytes above params+grads, want %d", got, tc.secondPeak)
			}
			if got := allocatedNow(rt) - base; got != tc.afterSteps {
				t.Errorf("after two steps %d bytes of state, want %d", got, tc.afterSteps)
			}
			opt.ZeroGrad(false)
			if got := allocatedNow(rt) - base; got != tc.afterSteps {
				t.Errorf("zero_grad(set_to_none=False) changed memory by %d", got-tc.afterSteps)
			}
			opt.ZeroGrad(true)
			if got, want := allocatedNow(rt), base-P+tc.afterSteps; got != want {
				t.Errorf("after zero_grad(set_to_none) %d bytes, want %d (gradients freed)", got, want)
			}
			opt.Release()
			for _, p := range ps {
				p.Tensor.Release()
			}
			if got := allocatedNow(rt); got != 0 {
				t.Errorf("%d bytes left after releasing everything", got)
			}
		})
	}
}

func TestGradScalerSkipsOverflowingSteps(t *testing.T) {
	rt := runtimeOn(device.CPU)
	inf := float32(math.Inf(1))
	ps := params(rt, [][]float32{{1, 2}}, [][]float32{{0.5, inf}})
	opt, _ := New(rt, ps, Config{Kind: SGD, LR: 0.1})
	s := NewGradScaler(rt)
	loss := rt.FromValues(tensor.F32, nil, []float32{2}, "loss", snapshot.CategoryTemporary)
	scaled := s.Scale(loss)
	if got := scaled.Item(); got != 2*65536 {
		t.Errorf("scaled loss %v, want %v", got, 2*65536)
	}
	if s.Step(opt, ps) {
		t.Error("a step with an Inf gradient ran")
	}
	s.Update()
	if s.Value() != 32768 || s.Skipped != 1 {
		t.Errorf("after an overflow: scale %v, %d skipped; want 32768 and 1", s.Value(), s.Skipped)
	}
	if got := ps[0].Tensor.Values(); got[0] != 1 || got[1] != 2 {
		t.Errorf("parameters changed by a skipped step: %v", got)
	}
	// Finite gradients (already scaled by the loss scale) are unscaled and the step runs.
	setGrads(rt, ps, [][]float32{{32768, -32768}})
	if !s.Step(opt, ps) {
		t.Fatal("a step with finite gradients was skipped")
	}
	if got := ps[0].Tensor.Values(); math.Abs(float64(got[0]-0.9)) > 1e-6 || math.Abs(float64(got[1]-2.1)) > 1e-6 {
		t.Errorf("parameters after an unscaled step %v, want [0.9 2.1]", got)
	}
	for range growthInterval {
		s.Update()
	}
	if s.Value() != 65536 {
		t.Errorf("scale %v after %d clean steps, want it doubled to 65536", s.Value(), growthInterval)
	}
	scaled.Release()
	loss.Release()
	s.Release()
}
