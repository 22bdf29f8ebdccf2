package transform

import (
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
)

// ZeroGrad moves the trace to zero_grad mode m. The recorded mode is read off the trace: whether its
// zero_grad phases release gradients. From set_to_none to zeroing, the gradients made by the first backward
// are kept to the end; a later backward adds its gradients to them in place (AccumulateGrad), so a gradient
// it would have made is released as soon as it is added, and a copy made into .grad is not made. From
// zeroing to set_to_none, the gradients are released at every zero_grad and made again where the next
// backward first writes them: AccumulateGrad steals the incoming gradient (or copies it) where the first
// backward did, found in the later backward by the size and stack of what it allocated (toSetToNone).
func ZeroGrad(m knob.ZeroGrad) Transform {
	name := "zero_grad " + m.String()
	return Transform{Name: name, apply: func(t *trace) (*trace, string, error) {
		if _, err := knob.ParseZeroGrad(m.String()); err != nil {
			return nil, "", err
		}
		if err := t.requireTags(name, true, true); err != nil {
			return nil, "", err
		}
		return zeroGrad(t, m, name)
	}}
}

func zeroGrad(t *trace, m knob.ZeroGrad, name string) (*trace, string, error) {
	bs := t.index()
	first := -1 // the first zero_grad phase
	var released int
	for i := range t.events {
		e := &t.events[i]
		if e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseZeroGrad && first < 0 {
			first = i
		}
		if e.Action == snapshot.ActionFreeRequested && e.Phase == snapshot.PhaseZeroGrad {
			if b := bs[e.Addr]; b != nil && b.gradAt >= 0 {
				released++
			}
		}
	}
	if first < 0 {
		return nil, "", &MissingTagsError{name, "zero_grad phase"}
	}
	recorded := knob.ZeroGradZero
	if released > 0 {
		recorded = knob.ZeroGradNone
	}
	if recorded == m {
		return t, fmt.Sprintf("%s: the recording's zero_grad already does this: nothing changes", name), nil
	}
	if m == knob.ZeroGradNone {
		return toSetToNone(t, bs, first, name)
	}
	out := t.derive(len(t.events))
	skip := map[uint64]bool{}
	var kept, addedInPlace, notMade int
	var keptBytes int64
	for i := range t.events {
		e := t.events[i]
		b := bs[e.Addr]
		isGrad := e.Action != snapshot.ActionPhase && e.Action != snapshot.ActionIteration && b != nil && b.gradAt >= 0
		switch {
		case !isGrad:
		case skip[e.Addr]:
			continue
		case (e.Action == snapshot.ActionFreeRequested || e.Action == snapshot.ActionFreeCompleted) && e.Phase == snapshot.PhaseZeroGrad:
			if e.Action == snapshot.ActionFreeRequested && b.alloc < first {
				kept++
				keptBytes += b.size
			}
			continue // zeroed in place, not released
		case b.alloc > first && b.gradAt == i && e.Action == snapshot.ActionAlloc:
			skip[e.Addr] = true // the copy into .grad: the gradient exists and is added to
			notMade++
			continue
		case b.alloc > first && b.gradAt == i && e.Action == snapshot.ActionCategory:
			f := freeEvents(e, e.Addr, b.size, t.events[b.alloc].BlockSize)
			out.events = append(out.events, f[0], f[1])
			skip[e.Addr] = true
			addedInPlace++
			continue
		}
		out.events = append(out.events, e)
	}
	line := fmt.Sprintf("%s: the %d gradients of the first backward (%s) stay allocated from then on; later "+
		"backwards added %d gradients in place and released them, and made %d fewer copies into .grad",
		name, kept, units.FormatSize(keptBytes), addedInPlace, notMade)
	return out, line, nil
}

// allocKey is what identifies an allocation from one pass to the next of the same code: its size and stack.
type allocKey struct {
	size  int64
	stack snapshot.StackID
}

// occurrence is the n-th allocation of a key within a pass.
type occurrence struct {
	key allocKey
	n   int
}

// passStart returns the index of the backward phase marker whose pass holds event i, or -1.
func (t *trace) passStart(i int) int {
	for j := i; j >= 0; j-- {
		if e := &t.events[j]; e.Action == snapshot.ActionPhase {
			if e.Phase == snapshot.PhaseBackward {
				return j
			}
			return -1
		}
	}
	return -1
}

// nextBackward returns the first backward phase marker after the first zero_grad's, or -1.
func (t *trace) nextBackward(first int) int {
	for j := first + 1; j < len(t.events); j++ {
		if e := &t.events[j]; e.Action == snapshot.ActionPhase && e.Phase == snapshot.PhaseBackward {
			return j
		}
	}
	return -1
}

// occurrences numbers the allocations of the pass that starts at marker start, up to its next phase marker,
// by key, leaving out those skip reports.
func (t *trace) occurrences(start int, skip func(i int) bool) map[occurrence]int {
	at := map[occurrence]int{}
	seen := map[allocKey]int{}
	for j := start + 1; j < len(t.events); j++ {
		e := &t.events[j]
		if e.Action == snapshot.ActionPhase {
			break
		}
		if e.Action != snapshot.ActionAlloc || skip(j) {
			continue
		}
		k := allocKey{e.Size, e.Stack}
		at[occurrence{k, seen[k]}] = j
		seen[k]++
	}
	return at
}

// toSetToNone moves a recording whose zero_grad zeroes the gradients to set_to_none. The gradients made
// before the first zero_grad (bs, first) are the template: each was either an incoming gradient that
// AccumulateGrad stole (made .grad by a category event) or a copy of one (allocated as a gradient). At every
// zero_grad the gradients are released; in the first backward after it, the allocation that matches the
// stolen one (the same occurrence of its size and stack in the pass) stays as the new gradient instead of
// being added in place and released, and a copy is made again after the allocation that preceded it in
// the first backward. A gradient released later in the recording (at the end of the run) releases what
// stands for it then.
func toSetToNone(t *trace, bs map[uint64]*block, first int, name string) (*trace, string, error) {
	grads := t.templateGrads(bs, first)
	if len(grads) == 0 {
		return nil, "", &MissingTagsError{name, "gradient category"}
	}
	t.numberGrads(grads)
	t.findStolen(grads, first)
	t.placeCopies(grads)
	w := newSetToNone(t, grads, first)
	for i := range t.events {
		w.event(i, t.events[i])
	}
	var bytes int64
	for _, g := range grads {
		bytes += g.b.size
	}
	line := fmt.Sprintf("%s: the %d gradients (%s) are released at each zero_grad (%d releases) and made again "+
		"where the next backward first writes them (%d times, found by the size and stack of the first "+
		"backward's allocations)", name, len(grads), units.FormatSize(bytes), w.released, w.remade)
	if w.missed > 0 {
		line += fmt.Sprintf("; %d were not found in their backward and are left out", w.missed)
	}
	return w.out, line, nil
}

// templateGrad is a gradient made before the first zero_grad: what set_to_none makes again in every
// backward after one.
type templateGrad struct {
	addr   uint64
	b      *block
	stolen bool
	at     occurrence // the stolen allocation, or the one a copy follows
	none   bool       // a copy made before any allocation of its pass: it follows the marker
	frees  int        // a copy: the releases between what it follows and itself
	self   occurrence // its own allocation

	cur  uint64 // what stands for it in the output now; 0: none
	left int    // a copy waiting to be made: the releases still to pass
}

// templateGrads returns the gradients alive at the first zero_grad (first) that a backward made, in order
// of allocation.
func (t *trace) templateGrads(bs map[uint64]*block, first int) []*templateGrad {
	var grads []*templateGrad
	for i := 0; i < first; i++ {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc {
			continue
		}
		b := bs[e.Addr]
		if b == nil || b.internal || b.gradAt < 0 || b.gradAt > first || (b.free >= 0 && b.free < first) {
			continue
		}
		if t.passStart(b.gradAt) < 0 {
			continue
		}
		grads = append(grads, &templateGrad{addr: e.Addr, b: b, stolen: b.gradAt != b.alloc})
	}
	return grads
}

// numberGrads numbers each gradient's own allocation among those of its size and stack in its pass.
func (t *trace) numberGrads(grads []*templateGrad) {
	for _, g := range grads {
		e := &t.events[g.b.alloc]
		g.self.key = allocKey{e.Size, e.Stack}
		for j := t.passStart(g.b.gradAt) + 1; j < g.b.alloc; j++ {
			if o := &t.events[j]; o.Action == snapshot.ActionAlloc && (allocKey{o.Size, o.Stack}) == g.self.key {
				g.self.n++
			}
		}
	}
}

// findStolen tells a stolen gradient from a copy where the trace lost the category change (a PyTorch file
// records one category per block), so that a gradient allocated as one may be either: the next backward
// after the first zero_grad holds the same allocation again if it was stolen.
func (t *trace) findStolen(grads []*templateGrad, first int) {
	next := t.nextBackward(first)
	if next < 0 {
		return
	}
	occ := t.occurrences(next, func(int) bool { return false })
	for _, g := range grads {
		if _, ok := occ[g.self]; ok {
			g.stolen = true
		}
	}
}

// placeCopies finds where each copy is made: after which allocation of its pass (copies left out, since
// the next backward makes none) and how many releases after it. A stolen gradient stays at its own.
func (t *trace) placeCopies(grads []*templateGrad) {
	copies := map[int]bool{}
	for _, g := range grads {
		if !g.stolen {
			copies[g.b.alloc] = true
		}
	}
	for _, g := range grads {
		if g.stolen {
			g.at = g.self
			continue
		}
		start := t.passStart(g.b.gradAt)
		where := map[int]occurrence{}
		for o, j := range t.occurrences(start, func(j int) bool { return copies[j] }) {
			where[j] = o
		}
		g.none = true
		for j := g.b.alloc - 1; j > start; j-- {
			if o, ok := where[j]; ok {
				g.at, g.none = o, false
				break
			}
			if t.events[j].Action == snapshot.ActionFreeCompleted {
				g.frees++
			}
		}
	}
}

// setToNone writes a trace moved to set_to_none, event by event: it releases the template gradients at
// each zero_grad and makes them again in the backward that follows.
type setToNone struct {
	t, out *trace
	grads  []*templateGrad
	byAddr map[uint64]*templateGrad
	first  int // the first zero_grad phase

	held    map[uint64]bool         // stolen allocations kept as gradients
	targets map[int][]*templateGrad // event index -> gradients made there, in the pass being rewritten
	pending bool                    // a zero_grad released the gradients; the next backward remakes them
	// The copies waiting for their releases to pass (each with its left); an allocation or the pass's end
	// makes them at once.
	waiting []*templateGrad

	released, remade, missed int
}

func newSetToNone(t *trace, grads []*templateGrad, first int) *setToNone {
	w := &setToNone{t: t, out: t.derive(len(t.events) + 4*len(grads)), grads: grads,
		byAddr: map[uint64]*templateGrad{}, first: first, held: map[uint64]bool{}}
	for _, g := range grads {
		w.byAddr[g.addr] = g
		g.cur = g.addr
	}
	return w
}

// event writes event i, e, and what goes with it.
func (w *setToNone) event(i int, e snapshot.Event) {
	if len(w.waiting) > 0 && (e.Action == snapshot.ActionAlloc || e.Action == snapshot.ActionPhase) {
		w.flush(e, true)
	}
	if i >= w.first {
		if e.Action == snapshot.ActionPhase {
			w.out.events = append(w.out.events, e)
			w.phase(i, e)
			return
		}
		if w.dropped(e) {
			return
		}
	}
	w.out.events = append(w.out.events, e)
	if len(w.waiting) > 0 && e.Action == snapshot.ActionFreeCompleted {
		for _, g := range w.waiting {
			g.left--
		}
		w.flush(e, false)
	}
	for _, g := range w.targets[i] {
		if g.stolen {
			c := e
			c.Action, c.Category = snapshot.ActionCategory, snapshot.CategoryGradient
			w.out.events = append(w.out.events, c)
			w.held[e.Addr] = true
			g.cur = e.Addr
			w.remade++
			continue
		}
		w.wait(g)
	}
	w.flush(e, false)
}

// phase follows phase marker i, e, from the first zero_grad on: a zero_grad releases the gradients, and the
// backward after it finds where it makes them again.
func (w *setToNone) phase(i int, e snapshot.Event) {
	w.targets = nil
	switch {
	case e.Phase == snapshot.PhaseZeroGrad:
		// zero_grad walks the parameters in order, which backward reached last to first.
		for _, g := range slices.Backward(w.grads) {
			if g.cur != 0 {
				w.released++
			}
			w.release(e, g)
		}
		w.pending = true
	case e.Phase == snapshot.PhaseBackward && w.pending:
		w.pending = false
		occ := w.t.occurrences(i, func(int) bool { return false })
		w.targets = map[int][]*templateGrad{}
		if len(occ) < len(w.grads) { // not a whole backward (a trace cut by its OOM): nothing is remade
			w.missed += len(w.grads)
			return
		}
		for _, g := range w.grads {
			if g.none {
				w.wait(g)
				continue
			}
			if j, ok := occ[g.at]; ok {
				w.targets[j] = append(w.targets[j], g)
			} else {
				w.missed++
			}
		}
	}
}

// dropped reports whether block event e, from the first zero_grad on, leaves the output: the recorded
// gradients' events (released at the first zero_grad; their release at the end of the run releases what
// stands for them then), and the releases of what is kept as a gradient.
func (w *setToNone) dropped(e snapshot.Event) bool {
	switch e.Action {
	case snapshot.ActionAlloc, snapshot.ActionCategory, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
		if g := w.byAddr[e.Addr]; g != nil {
			if e.Action == snapshot.ActionFreeRequested {
				w.release(e, g)
			}
			return true
		}
		// Added in place and released in the recording: it stays as .grad until a zero_grad or the end of
		// the run releases it.
		return w.held[e.Addr] && (e.Action == snapshot.ActionFreeRequested || e.Action == snapshot.ActionFreeCompleted)
	}
	return false
}

// release releases what stands for g, if anything, at event at.
func (w *setToNone) release(at snapshot.Event, g *templateGrad) {
	if g.cur != 0 {
		f := freeEvents(at, g.cur, g.b.size, w.t.events[g.b.alloc].BlockSize)
		w.out.events = append(w.out.events, f[0], f[1])
		g.cur = 0
	}
}

// makeCopy makes g's copy into .grad at event at.
func (w *setToNone) makeCopy(at snapshot.Event, g *templateGrad) {
	ge := w.t.events[g.b.alloc]
	c := snapshot.Event{Time: at.Time, Action: snapshot.ActionAlloc, Device: ge.Device, Stream: ge.Stream,
		Addr: w.out.fresh(), Size: ge.Size, BlockSize: ge.BlockSize, Phase: at.Phase, Iteration: at.Iteration,
		Category: snapshot.CategoryGradient, Scope: ge.Scope, Stack: ge.Stack}
	w.out.events = append(w.out.events, c)
	g.cur = c.Addr
}

// wait puts g's copy among those waiting for their releases to pass.
func (w *setToNone) wait(g *templateGrad) {
	w.waiting = append(w.waiting, g)
	g.left = g.frees
}

// flush makes the waiting copies whose releases have passed (all: every one) at event at.
func (w *setToNone) flush(at snapshot.Event, all bool) {
	rest := w.waiting[:0]
	for _, g := range w.waiting {
		if all || g.left <= 0 {
			w.makeCopy(at, g)
			w.remade++
		} else {
			rest = append(rest, g)
		}
	}
	w.waiting = rest
}
