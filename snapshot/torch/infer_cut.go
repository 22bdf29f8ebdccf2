package torch

import (
	"github.com/oomdbg/oomdbg/snapshot"
)

// The traces users bring are often cut short: the OOM observer dumps the trace at the failing request, mid
// forward or backward or optimizer step, and a notebook turns the history on after loading the model. What
// such a trace shows of a block alive at its end is where it was allocated and what the blocks of the same
// stack before it did; these rules read that (docs/pytorch-snapshots.md, "Cut traces").

// findCut finds the out-of-memory error a trace ends in: the last one, with no allocation after it (the
// frees that may follow are the exception unwinding the step). Blocks alive at it are alive "at the end".
func (c *categorizer) findCut() {
	t := c.t
	for i := t.len() - 1; i >= 0; i-- {
		e := t.at(i)
		if t.allocation(e) {
			return
		}
		if e.Action == snapshot.ActionOOM {
			c.end = i
			c.cut = c.iterAt(i)
			c.cutPhase = e.Phase
			return
		}
	}
}

// alive reports whether l is alive at the end of what the trace shows of the program (c.end).
func (c *categorizer) alive(l lifetime) bool { return l.free < 0 || l.free > c.end }

// cutShort reports whether a block allocated at e, alive at the end, is in the iteration the OOM cut short,
// in a phase whose blocks the cut leaves undecided: cutRules decides it.
func (c *categorizer) cutShort(e *snapshot.Event, l lifetime) bool {
	if c.cut < 0 || !c.alive(l) || c.iterAt(l.alloc) != c.cut {
		return false
	}
	switch e.Phase {
	case snapshot.PhaseForward, snapshot.PhaseRecompute, snapshot.PhaseBackward, snapshot.PhaseOptimizer, snapshot.PhaseZeroGrad:
		return true
	}
	return false
}

// beforeTrace decides a block alive before the trace began, where no frame says what it is (its stack,
// when the final state has one, is that of its allocation, which the trace did not see).
func (c *categorizer) beforeTrace(l lifetime) CategoryRule {
	if c.alive(l) {
		return CategoryBeforeTrace
	}
	switch c.t.at(l.free).Phase {
	case snapshot.PhaseBackward, snapshot.PhaseRecompute:
		return CategoryBeforeTraceFreedInBackward
	case snapshot.PhaseZeroGrad:
		return CategoryBeforeTraceFreedInZeroGrad
	}
	return CategoryNoRule
}

// stackPeers counts what the blocks of one stack in one phase of the cut iteration did: freed within the
// phase they were allocated in (a temporary, an intermediate gradient), or kept (freed later, or alive at
// the end).
type stackPeers struct{ freed, kept int }

// peerKey is a stack in one phase (a checkpoint's recompute counts as forward).
type peerKey struct {
	stack snapshot.StackID
	phase snapshot.Phase
}

// cutRules decides the blocks the OOM's cut left undecided (cutShort), once every other block has its rule:
// a forward or backward block by what the other blocks of its stack in that phase of the iteration did, a
// backward block alone of its stack by whether it has a parameter's size, an optimizer block as the step's
// temporary (its state has _init_group on its stack, which decided it before).
func (c *categorizer) cutRules(rules []CategoryRule) {
	if c.cut < 0 {
		return
	}
	t := c.t
	params := map[int64]bool{} // the requested sizes of parameters
	for j, l := range t.lives {
		switch rules[j] {
		case CategoryWeightFrames, CategoryBeforeTraining, CategoryBeforeTrace:
			params[t.at(l.alloc).Size] = true
		}
	}
	keyOf := func(e *snapshot.Event) peerKey {
		if forwardPhase(e.Phase) {
			return peerKey{e.Stack, snapshot.PhaseForward}
		}
		return peerKey{e.Stack, e.Phase}
	}
	peers := map[peerKey]stackPeers{}
	for _, l := range t.lives {
		if e := t.at(l.alloc); e.Stack != 0 && c.iterAt(l.alloc) == c.cut {
			p := peers[keyOf(e)]
			if !c.alive(l) && c.iterAt(l.free) == c.cut && t.at(l.free).Phase == e.Phase {
				p.freed++
			} else {
				p.kept++
			}
			peers[keyOf(e)] = p
		}
	}
	for j, l := range t.lives {
		e := t.at(l.alloc)
		if rules[j] != CategoryNoRule || !c.cutShort(e, l) {
			continue
		}
		var p stackPeers
		if e.Stack != 0 {
			p = peers[keyOf(e)]
			p.kept-- // the block itself, alive at the end
		}
		switch {
		case forwardPhase(e.Phase) && p.freed > p.kept:
			rules[j] = CategoryCutForwardTemp
		case forwardPhase(e.Phase):
			rules[j] = CategoryCutForwardSaved
		case e.Phase != snapshot.PhaseBackward:
			rules[j] = CategoryCutOptimizerTemp
		case p.freed > p.kept:
			rules[j] = CategoryCutBackwardFreed
		case p.kept > 0:
			rules[j] = CategoryCutBackwardKept
		case params[e.Size]:
			rules[j] = CategoryCutGradient
		default:
			rules[j] = CategoryCutBackwardTemp
		}
	}
}

// forwardPhase reports whether p runs a module's forward: forward, or a checkpoint's recompute.
func forwardPhase(p snapshot.Phase) bool {
	return p == snapshot.PhaseForward || p == snapshot.PhaseRecompute
}
