package optim

import (
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// inBackward is the optimizer step in backward, as torchtune's optimizer_in_bwd sets it up
// (training/memory.py: create_optim_in_bwd_wrapper and register_optim_in_bwd_hooks): one optimizer per
// parameter, stepped by the parameter's post-accumulate-grad hook the moment backward has put its gradient
// in .grad, and zero_grad right after, so that a gradient lives from its accumulation to its update only,
// instead of until the loop's optimizer.step(). Its own Step and ZeroGrad do nothing: the loop still calls
// them, as the recipes' OptimizerInBackwardWrapper lets it.
type inBackward struct {
	opts []Optimizer
}

// NewInBackward returns the optimizer cfg names, stepped in backward, one per parameter of params: each
// parameter's hook steps its optimizer, then zero_grad(setToNone) clears its gradient (torch's zero_grad
// sets it to None by default).
func NewInBackward(rt *tensor.Runtime, params []*nn.Parameter, cfg Config, setToNone bool) (Optimizer, error) {
	o := &inBackward{}
	for _, p := range params {
		opt, err := New(rt, []*nn.Parameter{p}, cfg)
		if err != nil {
			o.Release()
			return nil, err
		}
		o.opts = append(o.opts, opt)
		p.Tensor.OnGradAccumulated(func() { // optim_step(param): optim_dict[param].step(); .zero_grad()
			opt.Step()
			opt.ZeroGrad(setToNone)
		})
	}
	return o, nil
}

func (o *inBackward) Step()         {}
func (o *inBackward) ZeroGrad(bool) {}

func (o *inBackward) Release() {
	for _, opt := range o.opts {
		opt.Release()
	}
	o.opts = nil
}
