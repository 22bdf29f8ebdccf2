package optim

import (
	"fmt"
	"math"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

func runtimeOn(kind device.Kind) *tensor.Runtime {
	return tensor.NewRuntime(device.NewSimulated(kind, 0, 1<<30, 0, allocator.DefaultConfig()), nil, 1)
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
		"sgd":        {Config{Kind: knob.SGD, LR: 0.1}, "torch.optim.SGD(ps, lr=0.1, foreach=True)"},
		"momentum":   {Config{Kind: knob.Momentum, LR: 0.1}, "torch.optim.SGD(ps, lr=0.1, momentum=0.9, foreach=True)"},
		"sgd decay":  {Config{Kind: knob.SGD, LR: 0.1, WeightDecay: 0.1}, "torch.optim.SGD(ps, lr=0.1, weight_decay=0.1, foreach=True)"},
		"adam":       {Config{Kind: knob.Adam, LR: 0.01}, "torch.optim.Adam(ps, lr=0.01, foreach=True)"},
		"adam decay": {Config{Kind: knob.Adam, LR: 0.01, WeightDecay: 0.1}, "torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=True)"},
		"adamw":      {Config{Kind: knob.AdamW, LR: 0.01}, "torch.optim.AdamW(ps, lr=0.01, foreach=True)"},
		"adam for-loop": {Config{Kind: knob.Adam, LR: 0.01, WeightDecay: 0.1, Impl: knob.ForLoop},
			"torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=False)"},
		"adamw for-loop": {Config{Kind: knob.AdamW, LR: 0.01, Impl: knob.ForLoop}, "torch.optim.AdamW(ps, lr=0.01, foreach=False)"},
		// PyTorch's CPU build has no fused Adam (it requires CUDA); its math is the for-loop's.
		"adam fused":  {Config{Kind: knob.Adam, LR: 0.01, WeightDecay: 0.1, Impl: knob.Fused}, "torch.optim.Adam(ps, lr=0.01, weight_decay=0.1, foreach=False)"},
		"adamw fused": {Config{Kind: knob.AdamW, LR: 0.01, Impl: knob.Fused}, "torch.optim.AdamW(ps, lr=0.01, foreach=False)"},
		// bitsandbytes' 32-bit paged AdamW updates as torch's AdamW does (optimizer_update_32bit).
		"paged adamw": {Config{Kind: knob.PagedAdamW, LR: 0.01}, "torch.optim.AdamW(ps, lr=0.01, foreach=True)"},
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
		"sgd":      {Config{Kind: knob.SGD}, 0, 0, 0, 0},
		"momentum": {Config{Kind: knob.Momentum}, P, P, P, P},
		// Adam: exp_avg and exp_avg_sq allocated at the first step, then every sqrt temporary alive at once.
		"adam":       {Config{Kind: knob.Adam}, 3 * P, 3 * P, 2 * P, 2 * P},
		"adam decay": {Config{Kind: knob.Adam, WeightDecay: 0.1}, 3 * P, 3 * P, 2 * P, 2 * P},
		"adamw":      {Config{Kind: knob.AdamW}, 3 * P, 3 * P, 2 * P, 2 * P},
		// for-loop: one parameter's square root and quotient at a time, and the previous quotient until the
		// next is made: at p1, 64 KiB (denom of p0) + 2 x 128 KiB.
		"adam for-loop":  {Config{Kind: knob.Adam, Impl: knob.ForLoop}, 2*P + p0*4 + 2*p1*4, 2*P + p0*4 + 2*p1*4, 2 * P, 2 * P},
		"adamw for-loop": {Config{Kind: knob.AdamW, Impl: knob.ForLoop}, 2*P + p0*4 + 2*p1*4, 2*P + p0*4 + 2*p1*4, 2 * P, 2 * P},
		// with L2 decay, grad.add(param) is a temporary too, alive until the next parameter's replaces it.
		"adam decay for-loop": {Config{Kind: knob.Adam, WeightDecay: 0.1, Impl: knob.ForLoop}, 2*P + p0*4 + 3*p1*4, 2*P + p0*4 + 3*p1*4, 2 * P, 2 * P},
		// fused: no temporaries, and a float32 step counter on the device per parameter (a 512-byte block).
		"adamw fused": {Config{Kind: knob.AdamW, Impl: knob.Fused}, 2*P + 1024, 2*P + 1024, 2*P + 1024, 2*P + 1024},
		// bitsandbytes 8-bit: a byte per element for each moment, a float32 absmax per 256 elements for each
		// (p0: 64, p1: 128 blocks; 512-byte blocks), two 1 KiB quantization maps; no temporaries.
		"adamw8bit":       {Config{Kind: knob.AdamW8bit}, P/2 + 4*512 + 2*1024, P/2 + 4*512 + 2*1024, P/2 + 4*512 + 2*1024, P/2 + 4*512 + 2*1024},
		"paged-adamw8bit": {Config{Kind: knob.PagedAdamW8bit}, P/2 + 4*512 + 2*1024, P/2 + 4*512 + 2*1024, P/2 + 4*512 + 2*1024, P/2 + 4*512 + 2*1024},
		// bitsandbytes 32-bit: float32 moments, no absmax, no maps.
		"paged-adamw": {Config{Kind: knob.PagedAdamW}, 2 * P, 2 * P, 2 * P, 2 * P},
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

// TestEightBitStateIsSmallForSmallParameters checks min_8bit_size: a parameter of fewer than 4096 elements
// keeps float32 state under AdamW8bit, and no quantization maps are made when no parameter is 8-bit.
func TestEightBitStateIsSmallForSmallParameters(t *testing.T) {
	rt := runtimeOn(device.Meta)
	ps := params(rt, [][]float32{make([]float32, 4095)}, [][]float32{make([]float32, 4095)})
	base := allocatedNow(rt)
	opt, _ := New(rt, ps, Config{Kind: knob.AdamW8bit})
	opt.Step()
	if got, want := allocatedNow(rt)-base, int64(2*16384); got != want { // 4095 x 4 bytes is a 16 KiB block
		t.Errorf("%d bytes of state for a 4095-element parameter, want %d (two float32 moments)", got, want)
	}
	opt.Release()
}

// TestPagedStateIsOutsideTheAllocator checks that a paged optimizer's large state lives in unified memory,
// not in memory_allocated, is resident on the device after a step, and is evicted when the allocator needs
// the room, instead of an OOM.
func TestPagedStateIsOutsideTheAllocator(t *testing.T) {
	const n = 1 << 20 // 1M elements: 4 MiB of float32 per moment, above the 1e5 paging threshold
	rt := tensor.NewRuntime(device.NewSimulated(device.Meta, 0, 64<<20, 0, allocator.DefaultConfig()), nil, 1)
	ps := params(rt, [][]float32{make([]float32, n)}, [][]float32{make([]float32, n)})
	base := allocatedNow(rt)
	opt, _ := New(rt, ps, Config{Kind: knob.PagedAdamW})
	opt.Step()
	if got := allocatedNow(rt) - base; got != 0 {
		t.Errorf("paged state took %d bytes of the caching allocator, want 0", got)
	}
	m, _ := rt.Device().Managed()
	st := m.ManagedStats()
	if st.Allocated != 8<<20 || st.Resident != 8<<20 {
		t.Fatalf("unified memory %+v, want 8 MiB allocated and resident", st)
	}
	// 64 MiB device: parameter and gradient share a 20 MiB segment (kLargeBuffer), the state is 8 MiB
	// resident: a 40 MiB tensor needs 4 MiB of the state evicted.
	big := rt.Zeros(tensor.F32, []int{10 << 20}, "activation", snapshot.CategoryActivation)
	if st := m.ManagedStats(); st.Evicted != 4<<20 {
		t.Errorf("%d bytes evicted for a 40 MiB tensor, want 4 MiB: %+v", st.Evicted, st)
	}
	big.Release()
	// The caching allocator keeps the 40 MiB segment: the next step's prefetches find 4 MiB of room, and
	// the two moments take turns in it.
	opt.Step()
	if st := m.ManagedStats(); st.Resident != 4<<20 {
		t.Errorf("after the next step %d bytes resident, want 4 MiB (the cache holds the rest)", st.Resident)
	}
	if err := rt.Device().Allocator().EmptyCache(); err != nil { // torch.cuda.empty_cache()
		t.Fatal(err)
	}
	opt.Step()
	if st := m.ManagedStats(); st.Resident != 8<<20 {
		t.Errorf("after empty_cache and a step %d bytes resident, want 8 MiB", st.Resident)
	}
	opt.Release()
	if st := m.ManagedStats(); st.Allocated != 0 {
		t.Errorf("%d bytes of unified memory left after Release", st.Allocated)
	}
}

// TestEightBitAdamWTracksAdamW checks on the cpu device that AdamW8bit's parameters stay within the
// 8-bit quantization's reach of torch's AdamW over a few steps.
func TestEightBitAdamWTracksAdamW(t *testing.T) {
	const n = 8192
	r := make([]float32, n)
	for i := range r {
		r[i] = float32(math.Sin(float64(i))) * 0.1
	}
	run := func(kind knob.Optimizer) []float32 {
		rt := runtimeOn(device.CPU)
		ps := params(rt, [][]float32{r}, [][]float32{r})
		opt, _ := New(rt, ps, Config{Kind: kind, LR: 0.01})
		for step := range 5 {
			g := make([]float32, n)
			for i := range g {
				g[i] = float32(math.Cos(float64(i*(step+1)))) * 0.05
			}
			setGrads(rt, ps, [][]float32{g})
			opt.Step()
		}
		return ps[0].Tensor.Values()
	}
	full, eight := run(knob.AdamW), run(knob.AdamW8bit)
	var diff, moved float64
	for i := range full {
		diff += math.Abs(float64(full[i] - eight[i]))
		moved += math.Abs(float64(full[i] - r[i]))
	}
	if diff > 0.05*moved {
		t.Errorf("8-bit knob.AdamW is %.4g away from knob.AdamW over a move of %.4g", diff, moved)
	}
	if diff == 0 {
		t.Error("8-bit knob.AdamW equals knob.AdamW exactly: the state is not quantized")
	}
}

func TestGradScalerSkipsOverflowingSteps(t *testing.T) {
	rt := runtimeOn(device.CPU)
	inf := float32(math.Inf(1))
	ps := params(rt, [][]float32{{1, 2}}, [][]float32{{0.5, inf}})
	opt, _ := New(rt, ps, Config{Kind: knob.SGD, LR: 0.1})
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
