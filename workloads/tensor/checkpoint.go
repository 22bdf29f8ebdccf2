package tensor

import "github.com/oomdbg/oomdbg/snapshot"

// Checkpoint runs f(x) as torch.utils.checkpoint does (the reentrant form, CheckpointFunction): the forward
// runs under no_grad, so f saves nothing and only x is kept for backward; backward recomputes f(x) with grad
// enabled (phase recompute) under the autocast state the forward ran in (its own autocast region, so weights
// are cast again and the cache dropped when it ends) and with the same random draws, e.g. dropout masks, as
// the first run, then backpropagates through the recomputed graph, which frees itself as it goes. Gradients
// equal those of f(x) without checkpointing.
func Checkpoint(f func(x *Tensor) *Tensor, x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	rngState, _ := rt.src.MarshalBinary() // preserve_rng_state
	autocast := rt.autocast               // _get_autocast_kwargs
	var out *Tensor
	rt.NoGrad(func() { out = f(x) })
	if !rt.needsGrad(x) {
		return out
	}
	node := rt.node("CheckpointFunctionBackward", []*Tensor{x}, []*Tensor{out}, nil)
	saved := node.save("input", x)
	node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
		rt := n.rt
		prevPhase := rt.SetPhase(snapshot.PhaseRecompute)
		prevCat := rt.SetCategory(snapshot.CategoryTemporary)
		forwardRNG, _ := rt.src.MarshalBinary()
		_ = rt.src.UnmarshalBinary(rngState)

		in := saved.Detach().SetRequiresGrad(true)
		prevGrad := rt.SetGradEnabled(true)
		var y *Tensor
		if autocast != F32 { // with torch.enable_grad(), torch.amp.autocast(**ctx.device_autocast_kwargs)
			rt.Autocast(autocast, func() { y = f(in) })
		} else {
			restore := rt.withoutAutocast()
			y = f(in)
			restore()
		}
		rt.SetGradEnabled(prevGrad)
		_ = rt.src.UnmarshalBinary(forwardRNG)
		rt.SetCategory(prevCat)
		rt.SetPhase(prevPhase)

		// torch.autograd.backward(outputs, grads) inside the outer backward.
		rt.runBackward(y.gradEdge(), g[0].Ref(), false)
		y.Release()
		dx := in.grad
		in.grad = nil
		in.Release()
		if dx != nil {
			dx.owner = owner{}
		}
		return []*Tensor{dx}
	}
	return out
}
