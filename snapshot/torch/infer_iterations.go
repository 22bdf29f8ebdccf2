package torch

import (
	"github.com/oomdbg/oomdbg/snapshot"
)

// IterationSource says where a trace's iteration boundaries come from, most certain first.
type IterationSource uint8

const (
	// IterationsNone: nothing in the trace repeats as training does (an inference run, a trace too short).
	IterationsNone IterationSource = iota
	// IterationsProfilerStep: torch.profiler's ProfilerStep#N regions: iteration N begins at its START.
	IterationsProfilerStep
	// IterationsOptimizerRegions: the Optimizer.step#... regions torch.optim records around every step
	// (PyTorch 2.x): each step ends an iteration.
	IterationsOptimizerRegions
	// IterationsOptimizerFrames: allocations with torch.optim on their stacks: each run of them is a step,
	// and ends an iteration.
	IterationsOptimizerFrames
	// IterationsForwardBackward: each forward that follows a backward begins an iteration (with gradient
	// accumulation, each micro-batch counts as one).
	IterationsForwardBackward
	// IterationsPeriodic: nothing names a phase, but the allocations repeat (the same sizes from the same
	// stacks), and memory rises and falls within each repetition as training's does.
	IterationsPeriodic
	// IterationsRecorded: oomdbg record marked them, from the job's own hooks (recorded.go); the most
	// certain source, tried first.
	IterationsRecorded
	// IterationsPartial: the trace holds one training iteration cut short before any optimizer step: a
	// forward and its backward (a notebook that records one step), or a forward that ran out of memory (the
	// OOM observer's dump). It is iteration 0, from its first forward allocation.
	IterationsPartial
)

var iterationSourceNames = [...]string{
	IterationsNone:             "none: nothing in the trace repeats as training does",
	IterationsProfilerStep:     "from ProfilerStep#N regions",
	IterationsOptimizerRegions: "from Optimizer.step regions",
	IterationsOptimizerFrames:  "from the optimizer's frames",
	IterationsForwardBackward:  "from forward following backward",
	IterationsPeriodic:         "from the trace's repeating allocations",
	IterationsRecorded:         "recorded by oomdbg record",
	IterationsPartial:          "one iteration, cut short before its optimizer step",
}

// String says where the iterations come from, e.g. "from Optimizer.step regions".
func (s IterationSource) String() string {
	if int(s) < len(iterationSourceNames) {
		return iterationSourceNames[s]
	}
	return "from an unknown source"
}

// iterations finds the iteration boundaries from the most certain source the trace has.
func (t *trace) iterations() (IterationSource, []Boundary) {
	if b := t.marked(); len(b) > 0 {
		if r := t.origin.Recorded; r != nil && r.Iterations > 0 {
			return IterationsRecorded, b
		}
		return IterationsProfilerStep, b
	}
	if ends := t.stepEnds(); len(ends) > 0 {
		src := IterationsOptimizerFrames
		if t.origin.OptimizerSteps > 0 {
			src = IterationsOptimizerRegions
		}
		return src, t.boundaries(ends)
	}
	starts := t.forwardAfterBackward()
	if len(starts) > 1 {
		b := make([]Boundary, len(starts))
		for k, s := range starts {
			b[k] = Boundary{Seq: t.scanBack(s, 0), Iteration: int32(k)}
		}
		return IterationsForwardBackward, b
	}
	if len(starts) == 0 {
		starts = t.forwardOutOfMemory()
	}
	if len(starts) == 1 {
		return IterationsPartial, []Boundary{{Seq: t.scanBack(starts[0], 0), Iteration: 0}}
	}
	if b := t.periodic(); len(b) > 0 {
		return IterationsPeriodic, b
	}
	return IterationsNone, nil
}

// forwardOutOfMemory returns the first forward allocation of a trace that runs out of memory in forward
// with no backward before it: a training step the OOM observer dumped in its first forward. An evaluation
// that runs out of memory looks the same; a trace cannot tell them apart, and the first is what a user
// brings. nil for any other trace.
func (t *trace) forwardOutOfMemory() []int {
	first := -1
	for i := range t.len() {
		e := t.at(i)
		switch {
		case t.allocation(e) && e.Phase == snapshot.PhaseForward && first < 0:
			first = i
		case t.allocation(e) && (e.Phase == snapshot.PhaseBackward || e.Phase == snapshot.PhaseRecompute || stepping(e)):
			return nil
		case e.Action == snapshot.ActionOOM && first >= 0 && e.Phase == snapshot.PhaseForward:
			return []int{first}
		}
	}
	return nil
}

// marked returns the iterations the snapshot's iteration markers begin (the import's ProfilerStep#N). A
// marker after the trace's last entry begins nothing: a snapshot without time_us places its regions after
// every entry (an export of a snapshot PyTorch recorded without times carries its iterations so).
func (t *trace) marked() []Boundary {
	last := -1
	for i := range t.len() {
		if !marker(t.at(i).Action) {
			last = i
		}
	}
	var b []Boundary
	for i := range last {
		if e := t.at(i); e.Action == snapshot.ActionIteration && e.Iteration >= 0 {
			b = append(b, Boundary{Seq: i, Iteration: e.Iteration})
		}
	}
	return b
}

// stepEnds returns, for each optimizer step, the first event after it: a step is a run of events in the
// optimizer or zero_grad phase (an Optimizer.step region, or allocations with torch.optim on their stacks,
// and the frees among them). Steps with no training allocation between them (two optimizers, a GAN's
// generator and discriminator) end one iteration; a step that no training came before is not a training
// step.
func (t *trace) stepEnds() []int {
	var ends []int
	last := 0     // where the previous step ended
	in := false   // inside a step
	seen := false // a training allocation since the previous step
	for i := range t.len() {
		e := t.at(i)
		if marker(e.Action) || t.reconstructed(e) {
			continue
		}
		switch {
		case stepping(e):
			in = true
		case in:
			in = false
			if seen {
				ends = append(ends, i)
			} else if n := len(ends); n > 0 {
				ends[n-1] = i // no training since the previous step: the same iteration's
			}
			seen, last = false, i
		}
		seen = seen || t.training(e)
	}
	if in && seen {
		ends = append(ends, t.len())
	} else if in && len(ends) > 0 && last == ends[len(ends)-1] {
		ends[len(ends)-1] = t.len()
	}
	return ends
}

// forwardAfterBackward returns the first forward allocation, then each forward allocation that follows a
// backward one; nil for forward passes only (inference, not training).
func (t *trace) forwardAfterBackward() []int {
	var starts []int
	backward, any := true, false
	for i := range t.len() {
		e := t.at(i)
		if !t.allocation(e) {
			continue
		}
		switch e.Phase {
		case snapshot.PhaseBackward, snapshot.PhaseRecompute:
			backward, any = true, true
		case snapshot.PhaseForward:
			if backward {
				starts = append(starts, i)
			}
			backward = false
		}
	}
	if !any {
		return nil
	}
	return starts
}

// boundaries turns the ends of the steps into the starts of the iterations: each iteration begins at its
// first training allocation, moved back over the allocations just before it that nothing places (the batch
// copied to the device, scanBack), but never before the previous step ended. Events after the last step
// begin one more iteration when they train.
func (t *trace) boundaries(ends []int) []Boundary {
	var b []Boundary
	floor := 0
	for k := 0; k <= len(ends); k++ {
		limit := t.len()
		if k < len(ends) {
			limit = ends[k]
		}
		first := -1
		for i := floor; i < limit; i++ {
			if t.training(t.at(i)) {
				first = i
				break
			}
		}
		if first < 0 {
			break // the events after the last step do not train
		}
		b = append(b, Boundary{Seq: t.scanBack(first, floor), Iteration: int32(k)})
		if k < len(ends) {
			floor = ends[k]
		}
	}
	return b
}

// scanBack moves a boundary at event i back over the allocations before it that no frames or phase place,
// and whose category the file does not give as other than the batch's, as far as floor: they are the batch
// of the iteration that begins there. Markers and annotations just
// before the boundary move with it.
func (t *trace) scanBack(i, floor int) int {
	for i > floor {
		e := t.at(i - 1)
		if marker(e.Action) {
			i--
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc, snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
		default:
			return i
		}
		if t.reconstructed(e) || e.Phase != snapshot.PhaseNone || t.facts(e).has(factParam) ||
			e.Category != snapshot.CategoryUnknown && e.Category != snapshot.CategoryInput {
			return i // placed, a weight, or something the file says is not the batch
		}
		i--
	}
	return i
}
