package optim

import (
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// GradScaler is torch.amp.GradScaler: dynamic loss scaling for float16 training. The loss is multiplied by
// the scale before backward so small gradients survive in float16; before the optimizer step the gradients
// are unscaled in place, and a step whose gradients hold an Inf or NaN is skipped and the scale halved. After
// 2000 steps without overflow the scale doubles. Its device tensors come and go in the order of
// torch/amp/grad_scaler.py.
type GradScaler struct {
	rt     *tensor.Runtime
	scale  *tensor.Tensor // the scale on the device (a float32 scalar), created at the first Scale
	growth *tensor.Tensor // the growth tracker (an int32 scalar)
	// foundInf is the per-device found_inf that unscale_ leaves in the optimizer's state, from Step until
	// Update.
	foundInf *tensor.Tensor
	value    float32 // the scale's value, mirrored on the host
	good     int     // steps since the last overflow
	found    bool    // the last unscale found an Inf or NaN
	// Skipped counts the optimizer steps skipped because of an overflow.
	Skipped int
}

// The defaults of torch.amp.GradScaler.
const (
	initScale      = 65536
	growthFactor   = 2
	backoffFactor  = 0.5
	growthInterval = 2000
)

// NewGradScaler returns a scaler; it allocates its device state at the first Scale, as PyTorch's does.
func NewGradScaler(rt *tensor.Runtime) *GradScaler { return &GradScaler{rt: rt, value: initScale} }

// Scale returns loss multiplied by the current scale (a new scalar tensor).
func (s *GradScaler) Scale(loss *tensor.Tensor) *tensor.Tensor {
	if s.scale == nil { // _lazy_init_scale_growth_tracker
		s.scale = s.rt.Full(tensor.F32, nil, s.value, "grad_scaler.scale", snapshot.CategoryOptimizerState).SetName("grad_scaler._scale")
		s.growth = s.rt.Zeros(tensor.I32, nil, "grad_scaler.growth_tracker", snapshot.CategoryOptimizerState).SetName("grad_scaler._growth_tracker")
	}
	return tensor.Scale(loss, s.value)
}

// Step is scaler.step(optimizer): it unscales the gradients of params in place and runs opt.Step unless one
// of them overflowed. It reports whether the step ran.
func (s *GradScaler) Step(opt Optimizer, params []*nn.Parameter) bool {
	prev := s.rt.SetCategory(snapshot.CategoryTemporary)
	defer s.rt.SetCategory(prev)
	s.unscale(params)
	if s.found { // _maybe_opt_step: found_inf.item()
		s.Skipped++
		return false
	}
	opt.Step()
	return true
}

// unscale is unscale_: inv_scale = self._scale.double().reciprocal().float() (the reciprocal in float64,
// through two float64 temporaries), found_inf = torch.full((), 0.0), then _unscale_grads_, which hands the
// kernel per-device copies of both (_MultiDeviceReplicator.get copies, found_inf's first) and returns the
// found_inf copy for the optimizer's state. The inv_scale copy goes when _unscale_grads_ returns; inv_scale
// and found_inf when unscale_ does.
func (s *GradScaler) unscale(params []*nn.Parameter) {
	if s.scale == nil {
		panic("grad scaler: step before scale") // PyTorch asserts the same
	}
	s.releaseFoundInf()
	d := tensor.ToDType(s.scale, tensor.F64)
	r := tensor.Reciprocal(d)
	d.Release()
	inv := tensor.ToDType(r, tensor.F32)
	r.Release()
	foundInf := s.rt.Zeros(tensor.F32, nil, "grad_scaler.found_inf", snapshot.CategoryTemporary)

	found := tensor.Clone(foundInf, "grad_scaler.found_inf", snapshot.CategoryTemporary)
	invCopy := tensor.Clone(inv, "grad_scaler.inv_scale", snapshot.CategoryTemporary)
	s.found = false
	for _, p := range params { // _amp_foreach_non_finite_check_and_unscale_, in place
		g := p.Tensor.Grad()
		if g == nil {
			continue
		}
		if tensor.HasNonFinite(g) {
			s.found = true
		}
		tensor.Scale_(g, 1/s.value)
	}
	if s.found {
		tensor.AddScalar_(found, 1)
	}
	invCopy.Release()
	inv.Release()
	foundInf.Release()
	s.foundInf = found.SetName("grad_scaler found_inf_per_device")
}

// Update adjusts the scale after a step, halved after an overflow, doubled after growthInterval clean steps,
// and drops the step's found_inf (_per_optimizer_states is refreshed).
func (s *GradScaler) Update() {
	defer s.releaseFoundInf()
	if s.found {
		s.value *= backoffFactor
		s.good = 0
		return
	}
	if s.good++; s.good == growthInterval {
		s.value *= growthFactor
		s.good = 0
	}
}

func (s *GradScaler) releaseFoundInf() {
	s.foundInf.Release()
	s.foundInf = nil
}

// Value returns the current scale.
func (s *GradScaler) Value() float32 { return s.value }

// Release frees the scaler's device state.
func (s *GradScaler) Release() {
	s.releaseFoundInf()
	s.scale.Release()
	s.growth.Release()
	s.scale, s.growth = nil, nil
}
