package leaks

import (
	"fmt"
	"strings"
)

// Advice says in PyTorch's words what to change in the training loop for what the analysis found, with the
// line to write where the retainer names it: "loss_history keeps each loss's autograd graph ...: write
// loss_history.append(loss.item())". Empty when there is nothing to change. The advice follows PyTorch's FAQ
// ("Don't accumulate history across your training loop") and the zero_grad documentation.
func (r *Result) Advice() string {
	if r.Gradients != nil {
		return "call optimizer.zero_grad(set_to_none=True) after each optimizer.step(): without it, backward adds each step's gradients into the last ones"
	}
	switch {
	case r.Verdict == Leak && len(r.Suspects) > 0:
		return suspectAdvice(r.Suspects[0])
	case r.Verdict == Held && len(r.Held) > 0:
		return heldAdvice(r.Held[0])
	}
	return ""
}

// suspectAdvice is the change that frees a growing group.
func suspectAdvice(sp Suspect) string {
	if sp.RetainedBy == nil || sp.Kind == Unclassified {
		return "no heap dump names what holds the growing blocks: record heap dumps at iteration ends to see who keeps them"
	}
	root := sp.RetainedBy.Root
	holder, _, indexed := strings.Cut(root, "[")
	switch sp.Kind {
	case RetainedGraph:
		if !indexed {
			return fmt.Sprintf("%s keeps an autograd graph and the tensors it saved for backward alive across iterations: keep %s.detach(), or compute it under torch.no_grad()", root, holder)
		}
		if isLoss(sp.RetainedBy.Path) {
			return fmt.Sprintf("write %s.append(loss.item()), not %s.append(loss): the list keeps each loss's autograd graph and every tensor it saved for backward (and backward() needs no retain_graph=True)", holder, holder)
		}
		return fmt.Sprintf("%s keeps each output's autograd graph and the tensors it saved for backward: append out.detach(), or compute the outputs under torch.no_grad()", holder)
	case StashedOutputs:
		return fmt.Sprintf("%s keeps the tensors themselves, more each iteration: keep t.detach().cpu() or a number, or clear %s each iteration", holder, holder)
	case GrowingCache:
		return fmt.Sprintf("%s grows every iteration: bound it, or clear it each iteration", holder)
	}
	return ""
}

// isLoss reports whether a retainer path goes through a loss function's backward node (NllLossBackward0,
// MseLossBackward0, ...): the list holds losses.
func isLoss(path []string) bool {
	for _, h := range path {
		if strings.Contains(h, "LossBackward") {
			return true
		}
	}
	return false
}

// heldAdvice is the change that frees a group held from one iteration to the next.
func heldAdvice(h HeldGroup) string {
	if h.RetainedBy == nil {
		return ""
	}
	root := h.RetainedBy.Root
	if strings.HasPrefix(root, "local ") { // a reference of the running code, described by its tensor, not named
		return fmt.Sprintf("%s holds a tensor into the next iteration: let it go once backward is done", root)
	}
	if i := strings.LastIndexByte(root, '.'); i >= 0 { // a module's attribute: self.intermediate = ... in forward
		attr := root[i+1:]
		return fmt.Sprintf("use a local variable, not self.%s = ... in forward: %s holds a tensor until the next forward", attr, root)
	}
	return fmt.Sprintf("del %s once backward is done: it holds a tensor into the next iteration", root)
}
