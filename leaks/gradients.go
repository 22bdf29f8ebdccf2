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
}

func optimizerSteps(phases []timeline.PhaseSpan) []optimizerStep {
	var steps []optimizerStep
	trained, cleared := false, false
	for _, p := range phases {
		switch p.Phase {
		case snapshot.PhaseOptimizer:
			if n := len(steps); n > 0 && !trained && steps[n-1].iteration == p.Iteration {
				steps[n-1].end = p.End
				continue
			}
			steps = append(steps, optimizerStep{start: p.Start, end: p.End, iteration: p.Iteration, cleared: cleared})
			trained, cleared = false, false
		case snapshot.PhaseData, snapshot.PhaseForward, snapshot.PhaseBackward, snapshot.PhaseRecompute, snapshot.PhaseEval:
			trained = true
		case snapshot.PhaseZeroGrad:
			cleared = true
		}
	}
	return steps
}

// gradientsNeverCleared looks, at each optimizer step that follows another with no zero_grad between, for
// gradients written before the earlier step began that are still allocated when the later one begins: the
// gradients the backward between them added to. Gradients are known by their category, or for blocks of
// unknown category (imported traces) by the phase that allocated them: what a backward allocates and the
// optimizer step leaves alive is a gradient.
func gradientsNeverCleared(tl *timeline.Timeline) *GradientFinding {
	phases := tl.Phases()
	steps := optimizerSteps(phases)
	if len(steps) > maxMeasured+1 {
		steps = steps[len(steps)-maxMeasured-1:]
	}
	f := &GradientFinding{FirstIteration: -1}
	var live []timeline.Allocation
	for k := 1; k < len(steps); k++ {
		f.Of++
		prev, next := steps[k-1], steps[k]
		if next.cleared {
			continue
		}
		live = tl.LiveAt(next.start-1, live[:0])
		var bytes int64
		var blocks int
		for i := range live {
			if a := &live[i]; a.Alloc < prev.start && roleOf(a) == roleGradient {
				bytes += a.Size
				blocks++
			}
		}
		if blocks == 0 {
			continue
		}
		if f.Steps == 0 {
			f.FirstIteration = prev.iteration
		}
		f.Steps++
		f.Bytes, f.Blocks = bytes, blocks
	}
	if f.Steps == 0 {
		return nil
	}
	zeroGrad := false
	for _, p := range phases {
		zeroGrad = zeroGrad || p.Phase == snapshot.PhaseZeroGrad
	}
	f.Certain = zeroGrad || tl.Snapshot().Meta.Source == "oomdbg"

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
