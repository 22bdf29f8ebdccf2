package torch

import (
	"encoding/json"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// infer applies what Infer finds in the trace written so far (s, whose events are em.events): iteration
// boundaries where no ProfilerStep#N marked them, with an iteration event before each; the category of
// every block the file left without one; the module whose forward allocated it as its scope where the file
// gave none. Tags of a block go on its frees too, as the runtime's do.
func (em *emitter) infer(s *snapshot.Snapshot) error {
	im := em.im
	// Infer reads the Origin for what the file recorded.
	origin, err := json.Marshal(im.origin)
	if err != nil {
		return &ImportError{Offset: -1, Err: err}
	}
	s.Meta.Workload = origin
	charge := int64(len(em.events)) * inferBytesPerEvent
	if err := im.mem.add(charge, "inferring iterations and categories"); err != nil {
		return err
	}
	defer im.mem.release(charge)
	inf, t := inferEvents(s, em.events, em.stacks)
	im.origin.Iterations = inf.Iterations.String()
	s.Meta.Iterations = im.origin.Iterations

	scopes := map[Scope]snapshot.StringID{} // the names, interned
	scopeOf := func(sc Scope) snapshot.StringID {
		id, ok := scopes[sc]
		if !ok {
			id = im.tab.str(sc.Name(s))
			scopes[sc] = id
		}
		return id
	}
	bi := 0
	for i := range em.events {
		e := &em.events[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			if bi < len(inf.Blocks) && inf.Blocks[bi].Seq == i {
				b := inf.Blocks[bi]
				bi++
				e.Category = b.Category
				if e.Scope == 0 && b.Module != 0 {
					e.Scope = scopeOf(b.Scope)
				}
			}
		case snapshot.ActionOOM:
			if sc, ok := inf.requests[i]; ok && e.Scope == 0 {
				e.Scope = scopeOf(sc)
			}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			if a := t.tagged[i]; a >= 0 { // an earlier event: its tags are final
				e.Category, e.Scope = em.events[a].Category, em.events[a].Scope
			}
		}
	}
	if inf.Iterations == IterationsProfilerStep || inf.Iterations == IterationsRecorded || len(inf.Boundaries) == 0 {
		return nil
	}
	// Number the iterations, then make room for their markers and move the events up from the back.
	b := inf.Boundaries
	for k := len(b) - 1; k >= 0; k-- {
		end := len(em.events)
		if k+1 < len(b) {
			end = b[k+1].Seq
		}
		for i := b[k].Seq; i < end; i++ {
			if !t.reconstructed(&em.events[i]) {
				em.events[i].Iteration = b[k].Iteration
			}
		}
	}
	placePhases(t, b)
	n := len(em.events)
	if need := n + len(b); need > cap(em.events) {
		if err := em.reserve(need); err != nil {
			return err
		}
	}
	em.events = em.events[:n+len(b)]
	src := n - 1
	for k := len(b) - 1; k >= 0; k-- {
		for ; src >= b[k].Seq; src-- {
			em.events[src+k+1] = em.events[src]
		}
		at := b[k].Seq + k
		next := em.events[at+1]
		prev := snapshot.PhaseNone
		if b[k].Seq > 0 {
			prev = em.events[b[k].Seq-1].Phase // not moved: it is before the boundary
		}
		// An iteration event carries the new iteration but still the phase before it, as the runtime writes it.
		em.events[at] = snapshot.Event{Time: next.Time, Action: snapshot.ActionIteration, Device: next.Device,
			Phase: prev, Iteration: b[k].Iteration}
	}
	for i := range em.events {
		em.events[i].Seq = uint64(i)
	}
	return nil
}

// placePhases gives the events of a trace with iterations b the phases oomdbg's runtime records where no
// frame or region named one: setup before the first iteration, where the trace holds the whole run (nothing
// was allocated before it: a ring buffer that wrapped begins mid-iteration, not in setup); data from an iteration's start to its first
// event with a phase (the batch, as the boundaries place it); zero_grad from the first free of a gradient
// after the optimizer's last allocation of the iteration, where zero_grad shows no region (set_to_none
// frees the gradients; PyTorch records a free with its allocation's frames, so none name zero_grad); and
// the phase before them for the events left at the end of an iteration (after an Optimizer.step region).
// An iteration where nothing has a phase is left so.
func placePhases(t *trace, b []Boundary) {
	events := t.events
	set := func(e *snapshot.Event, p snapshot.Phase) {
		if !t.reconstructed(e) {
			e.Phase = p
		}
	}
	whole := true
	for i := range events {
		whole = whole && !t.reconstructed(&events[i])
	}
	for i := 0; whole && i < b[0].Seq; i++ {
		if e := &events[i]; e.Phase == snapshot.PhaseNone {
			set(e, snapshot.PhaseSetup)
		}
	}
	for k := range b {
		start, end := b[k].Seq, len(events)
		if k+1 < len(b) {
			end = b[k+1].Seq
		}
		it := events[start:end]
		first := slices.IndexFunc(it, func(e snapshot.Event) bool { return e.Phase != snapshot.PhaseNone })
		if first < 0 {
			continue
		}
		for i := range first {
			set(&it[i], snapshot.PhaseData)
		}
		zeroGradFrees(t, it)
		last := snapshot.PhaseNone
		for i := first; i < len(it); i++ {
			if it[i].Phase != snapshot.PhaseNone {
				last = it[i].Phase
			} else {
				set(&it[i], last)
			}
		}
	}
}

// zeroGradFrees finds zero_grad in one iteration's events where no region marked it: the frees of gradients
// after the optimizer's last allocation, through the optimizer's events (or those of no phase) that follow.
func zeroGradFrees(t *trace, it []snapshot.Event) {
	lastStep := -1
	for i := range it {
		switch e := &it[i]; {
		case e.Phase == snapshot.PhaseZeroGrad:
			return
		case e.Phase == snapshot.PhaseOptimizer && e.Action == snapshot.ActionAlloc:
			lastStep = i
		}
	}
	if lastStep < 0 {
		return
	}
	from := -1
	for i := lastStep + 1; i < len(it); i++ {
		e := &it[i]
		if e.Phase != snapshot.PhaseOptimizer && e.Phase != snapshot.PhaseNone {
			return
		}
		if from < 0 && e.Action == snapshot.ActionFreeRequested && e.Category == snapshot.CategoryGradient {
			from = i
		}
		if from >= 0 && !t.reconstructed(e) {
			e.Phase = snapshot.PhaseZeroGrad
		}
	}
}
