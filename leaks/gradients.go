package leaks

import (
	"fmt"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// GradientFinding says that parameter gradients are never cleared: from one optimizer step to the next,
// the gradients the first step applied stay allocated with no zero_grad between, so the backward between
// them adds its gradients to theirs in place and the next step applies the sum of every step's gradients.
// It is a correctness bug first; its memory cost is the gradients themselves, allocated between steps
// where zero_grad()'s default (set_to_none=True) frees them. Memory does not grow.
type GradientFinding struct {
	// Reason says it in one line: "gradients never cleared: ...".
	Reason string
	// Steps is how many optimizer steps were followed by another with the first one's gradients still
	// allocated and no zero_grad between; Of is how many were followed by another (the last 256 at most).
	Steps, Of int
	// FirstIteration is the iteration of the first such step, -1 when the snapshot has no iteration markers.
	FirstIteration int32
	// Bytes and Blocks are the gradients alive from the last such step into the next.
	Bytes  int64
	Blocks int
	// Certain is false for a trace that records no zero_grad at all and was not recorded by oomdbg: a
	// zero_grad that zeroes in place (set_to_none=False) allocates and frees nothing, so only its
	// record_function region (Optimizer.zero_grad#...) would show it.
	Certain bool
}

// optimizerStep is the events of one optimizer step, [start, end): from its first optimizer span to its
// last. An imported trace's phases follow the stacks of its allocations, so a step may show as several
// optimizer spans: a new iteration, or a phase of training (data, forward, backward, eval) between two of
// them, starts a new step.
type optimizerStep struct {
	start, end int
	iteration  int32
	cleared    bool // a zero_grad span lies between the step before and this one
	// bytes and blocks are the gradients written before the step before began and still allocated when
	// this one begins; measured, once, only where the step is not cleared.
	bytes    int64
	blocks   int
	measured bool
}

// stepper pieces optimizer steps together from phase spans in order.
type stepper struct {
	steps                      []optimizerStep
	trained, cleared, zeroGrad bool
}

// add takes the next phase span; it reports whether the span starts a new step. A span that goes on from
// the page before (an optimizer span cut by a page boundary) joins the step it continues.
func (st *stepper) add(p timeline.PhaseSpan) bool {
	switch p.Phase {
	case snapshot.PhaseOptimizer:
		if n := len(st.steps); n > 0 && !st.trained && st.steps[n-1].iteration == p.Iteration {
			st.steps[n-1].end = p.End
			return false
		}
		st.steps = append(st.steps, optimizerStep{start: p.Start, end: p.End, iteration: p.Iteration, cleared: st.cleared})
		st.trained, st.cleared = false, false
		return true
	case snapshot.PhaseData, snapshot.PhaseForward, snapshot.PhaseBackward, snapshot.PhaseRecompute, snapshot.PhaseEval:
		st.trained = true
	case snapshot.PhaseZeroGrad:
		st.cleared, st.zeroGrad = true, true
	}
	return false
}

// measure measures step k, which follows another, with the live set just before it begins.
func (st *stepper) measure(k int, live func(seq int) []timeline.Allocation) {
	next := &st.steps[k]
	if next.cleared || next.measured {
		return
	}
	next.measured = true
	since := st.steps[k-1].start
	for _, a := range live(next.start - 1) {
		if a.Alloc < since && roleOf(&a) == roleGradient {
			next.bytes += a.Size
			next.blocks++
		}
	}
}

// gradientsNeverCleared looks, at each optimizer step that follows another with no zero_grad between, for
// gradients written before the earlier step began that are still allocated when the later one begins: the
// gradients the backward between them added to. Gradients are known by their category, or for blocks of
// unknown category (imported traces) by the phase that allocated them: what a backward allocates and the
// optimizer step leaves alive is a gradient.
func gradientsNeverCleared(tl *timeline.Timeline) *GradientFinding {
	var st stepper
	for _, p := range tl.Phases() {
		st.add(p)
	}
	for k := max(len(st.steps)-maxMeasured-1, 0) + 1; k < len(st.steps); k++ {
		st.measure(k, func(seq int) []timeline.Allocation { return tl.LiveAt(seq, nil) })
	}
	return st.finding(tl.Snapshot().Meta.Source == "oomdbg")
}

// finding is the finding on the last 257 steps measured, nil when their gradients are cleared. oomdbg says
// whether the run was recorded by oomdbg, which records every zero_grad.
func (st *stepper) finding(oomdbg bool) *GradientFinding {
	steps := st.steps
	if len(steps) > maxMeasured+1 {
		steps = steps[len(steps)-maxMeasured-1:]
	}
	f := &GradientFinding{FirstIteration: -1}
	for k := 1; k < len(steps); k++ {
		f.Of++
		if steps[k].blocks == 0 {
			continue
		}
		if f.Steps == 0 {
			f.FirstIteration = steps[k-1].iteration
		}
		f.Steps++
		f.Bytes, f.Blocks = steps[k].bytes, steps[k].blocks
	}
	if f.Steps == 0 {
		return nil
	}
	f.Certain = st.zeroGrad || oomdbg

	from := ""
	if f.FirstIteration >= 0 {
		from = fmt.Sprintf(", from iteration %d", f.FirstIteration)
	}
	f.Reason = fmt.Sprintf("gradients never cleared: after %d of %d optimizer steps%s, backward adds to the step's gradients with no zero_grad between, so each step applies the sum of every earlier step's gradients; %s of gradients (%d %s) stay allocated between steps",
		f.Steps, f.Of, from, units.FormatSize(f.Bytes), f.Blocks, plural(f.Blocks, "block"))
	if !f.Certain {
		f.Reason += " (unless zero_grad zeroes them in place, set_to_none=False, which this trace cannot show: it records no zero_grad)"
	}
	return f
}
