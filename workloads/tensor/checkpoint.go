package tensor

import "github.com/oomdbg/oomdbg/snapshot"

// Checkpoint runs f(x) as torch.utils.checkpoint does (the reentrant form, CheckpointFunction): the forward
// runs under no_grad, so f saves nothing and only x is kept for backward; backward recomputes f(x) with grad
// enabled (phase recompute) under the autocast state the forward ran in (its own autocast region, so weights
// are cast again and the cache dropped when it ends) and with the same random draws, e.g. dropout masks, as
// the first run, then backpropagates through the recomputed graph, which frees itself as it goes. Gradients
// equal those of f(x) without checkpointing.
func Checkpoint(f func(x *Tensor) *Tensor, x *Tensor) *Tensor {
	return CheckpointInputs(func(xs, _ []*Tensor) *Tensor { return f(xs[0]) }, []*Tensor{x})
}

// CheckpointInputs is Checkpoint of a function of several tensors (a decoder layer's hidden states, mask
// and positions): every tensor input is saved for backward (ctx.save_for_backward(*tensor_inputs)), and
// keep holds the references the function's other arguments carry (ctx.inputs, e.g. a tuple of rotary cos
// and sin tensors): kept alive until backward, but not saved tensors, so saved_tensors_hooks do not see
// them; f is given them (the recompute reads them from the node). Only inputs that require grad get a gradient. As in PyTorch, when no input requires grad the output
// does not either, and nothing inside f gets a gradient (the reason HF enables input gradients for adapters).
func CheckpointInputs(f func(inputs, kept []*Tensor) *Tensor, inputs []*Tensor, keep ...*Tensor) *Tensor {
	return CheckpointOutputs(func(in, kept []*Tensor) []*Tensor { return []*Tensor{f(in, kept)} }, inputs, keep...)[0]
}

// CheckpointOutputs is CheckpointInputs of a function with several outputs (a mixture-of-experts layer's
// hidden states and router logits): each output that gets a gradient sends it into the recomputed graph, and
// backward runs from all of them at once. A nil output stays nil.
//
// Under a CheckpointPolicy (SetCheckpointPolicy) it is selective activation checkpointing: the forward keeps
// the outputs of the ops the policy saves as well as the inputs, and the recompute takes each of them back
// where the op would run again, computing only the rest. torch runs a policy through the non-reentrant
// checkpoint, whose forward builds a graph whose saved tensors are dropped as they are made; the bytes held
// between forward and backward are the same as here (the inputs and the policy's outputs).
func CheckpointOutputs(f func(inputs, kept []*Tensor) []*Tensor, inputs []*Tensor, keep ...*Tensor) []*Tensor {
	rt := inputs[0].rt
	for _, x := range inputs {
		if x != nil {
			x.check()
		}
	}
	rngState, _ := rt.src.MarshalBinary() // preserve_rng_state
	autocast := rt.autocast               // _get_autocast_kwargs
	var outs []*Tensor
	var region *policyRegion // selective checkpointing: the outputs the policy keeps
	if rt.policy != nil {
		region = &policyRegion{policy: rt.policy}
	}
	rt.inRegion(region, func() { rt.NoGrad(func() { outs = f(inputs, keep) }) })
	if !rt.needsGrad(inputs...) {
		if region != nil {
			releaseAll(region.kept)
		}
		return outs
	}
	var live []*Tensor // the outputs that exist, in order: the node's
	for _, o := range outs {
		if o != nil {
			live = append(live, o)
		}
	}
	node := rt.node("CheckpointFunctionBackward", inputs, live, nil)
	saved := make([]*Tensor, len(inputs))
	for i, x := range inputs {
		if x != nil {
			saved[i] = node.save("input", x)
		}
	}
	for _, k := range keep {
		node.hold("ctx.inputs", k)
	}
	var policySlots []int // where in node.saved the outputs the policy kept are
	if region != nil {
		for _, k := range region.kept {
			policySlots = append(policySlots, len(node.saved))
			node.saveOnDevice("policy", k) // held by the checkpoint, not saved through the hooks
			k.Release()
		}
	}
	node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
		rt := n.rt
		prevPhase := rt.SetPhase(snapshot.PhaseRecompute)
		prevCat := rt.SetCategory(snapshot.CategoryTemporary)
		forwardRNG, _ := rt.src.MarshalBinary()
		_ = rt.src.UnmarshalBinary(rngState)

		// detach_variable: each input detached, requiring grad as the original did.
		in := make([]*Tensor, len(saved))
		for i, s := range saved {
			if s != nil {
				in[i] = s.Detach().SetRequiresGrad(s.requiresGrad)
			}
		}
		prevGrad := rt.SetGradEnabled(true)
		var ys []*Tensor
		var replay *policyRegion // the recompute takes back what the policy kept
		if region != nil {
			replay = &policyRegion{policy: region.policy, node: n, slots: policySlots}
		}
		rt.inRegion(replay, func() {
			if autocast != F32 { // with torch.enable_grad(), torch.amp.autocast(**ctx.device_autocast_kwargs)
				rt.Autocast(autocast, func() { ys = f(in, n.kept) })
			} else {
				restore := rt.withoutAutocast()
				ys = f(in, n.kept)
				restore()
			}
		})
		rt.SetGradEnabled(prevGrad)
		_ = rt.src.UnmarshalBinary(forwardRNG)
		rt.SetCategory(prevCat)
		rt.SetPhase(prevPhase)

		// torch.autograd.backward(outputs, grads) inside the outer backward.
		var roots []edge
		var gs []*Tensor
		for _, y := range ys {
			if y == nil {
				continue
			}
			if i := len(roots); i < len(g) && g[i] != nil && y.requiresGrad {
				roots, gs = append(roots, y.gradEdge()), append(gs, g[i].Ref())
			} else {
				roots, gs = append(roots, edge{}), append(gs, nil)
			}
		}
		rt.runBackwardFrom(roots, gs, false)
		releaseAll(ys)
		grads := make([]*Tensor, len(in))
		for i, x := range in {
			if x == nil {
				continue
			}
			if needs[i] && x.grad != nil {
				grads[i] = x.grad
				grads[i].owner = owner{}
			} else {
				x.grad.Release()
			}
			x.grad = nil
			x.Release()
		}
		return grads
	}
	return outs
}
