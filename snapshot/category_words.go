package snapshot

// Describe says what a category holds in PyTorch's words, for people who have not met oomdbg's names: e.g.
// autograd_detail is "gradients flowing through backward (grad_output and grad_input of each op), freed
// as backward moves on".
func (c Category) Describe() string {
	switch c {
	case CategoryParameter:
		return "model weights (nn.Parameter)"
	case CategoryGradient:
		return "param.grad, written by backward and read by optimizer.step()"
	case CategoryOptimizerState:
		return "the optimizer's state, e.g. Adam's exp_avg and exp_avg_sq"
	case CategoryActivation:
		return "tensors autograd saved for backward, freed as backward uses them"
	case CategoryTemporary:
		return "intermediates freed within the op or phase that made them"
	case CategoryInput:
		return "the batch: inputs and targets"
	case CategoryAutogradDetail:
		return "gradients flowing through backward (each op's grad_output and grad_input), freed as backward moves on"
	case CategoryAMPCache:
		return "autocast's cached 16-bit copies of fp32 weights, freed when autocast exits"
	}
	return "not tagged (a trace that does not say)"
}
