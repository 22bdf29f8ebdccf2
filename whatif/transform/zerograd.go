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
	type grad struct {
		addr   uint64
		b      *block
		stolen bool
		at     occurrence // the stolen allocation, or the one a copy follows
		none   bool       // a copy made before any allocation of its pass: it follows the marker
		frees  int        // a copy: the releases between what it follows and itself
		self   occurrence // its own allocation
	}
	var grads []*grad
	byAddr := map[uint64]*grad{}
	for i := 0; i < first; i++ {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc {
			continue
		}
		b := bs[e.Addr]
		if b == nil || b.internal || b.gradAt < 0 || b.gradAt > first || (b.free >= 0 && b.free < first) {
			continue
		}
		start := t.passStart(b.gradAt)
		if start < 0 {
			continue
		}
		g := &grad{addr: e.Addr, b: b, stolen: b.gradAt != b.alloc}
		grads = append(grads, g)
		byAddr[e.Addr] = g
	}
	if len(grads) == 0 {
		return nil, "", &MissingTagsError{name, "gradient category"}
	}
	// Each gradient's own allocation, numbered among those of its size and stack in its pass.
	for _, g := range grads {
		e := &t.events[g.b.alloc]
		g.self.key = allocKey{e.Size, e.Stack}
		for j := t.passStart(g.b.gradAt) + 1; j < g.b.alloc; j++ {
			if o := &t.events[j]; o.Action == snapshot.ActionAlloc && (allocKey{o.Size, o.Stack}) == g.self.key {
				g.self.n++
			}
		}
	}
	// A gradient allocated as one is a copy, or, where the trace lost the category change (a PyTorch file
	// records one category per block), a stolen gradient: the next backward tells, holding the same
	// allocation again if it was stolen.
	if next := t.nextBackward(first); next >= 0 {
		occ := t.occurrences(next, func(int) bool { return false })
		for _, g := range grads {
			if _, ok := occ[g.self]; ok {
				g.stolen = true
			}
		}
	}
	copies := map[int]bool{}
	for _, g := range grads {
		if !g.stolen {
			copies[g.b.alloc] = true
		}
	}
	// Where each copy is made: after which allocation of its pass (copies left out, since the next
	// backward makes none) and how many releases.
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
	out := t.derive(len(t.events) + 4*len(grads))
	cur := map[*grad]uint64{} // what stands for each gradient now; 0: none
	for _, g := range grads {
		cur[g] = g.addr
	}
	held := map[uint64]bool{} // stolen allocations kept as gradients
	release := func(at snapshot.Event, g *grad) {
		if a := cur[g]; a != 0 {
			f := freeEvents(at, a, g.b.size, t.events[g.b.alloc].BlockSize)
			out.events = append(out.events, f[0], f[1])
			cur[g] = 0
		}
	}
	makeCopy := func(at snapshot.Event, g *grad) {
		ge := t.events[g.b.alloc]
		c := snapshot.Event{Time: at.Time, Action: snapshot.ActionAlloc, Device: ge.Device, Stream: ge.Stream,
			Addr: out.fresh(), Size: ge.Size, BlockSize: ge.BlockSize, Phase: at.Phase, Iteration: at.Iteration,
			Category: snapshot.CategoryGradient, Scope: ge.Scope, Stack: ge.Stack}
		out.events = append(out.events, c)
		cur[g] = c.Addr
	}
	var released, remade, missed int
	var targets map[int][]*grad // event index -> gradients made there, in the pass being rewritten
	pending := false            // a zero_grad released the gradients; the next backward remakes them
	// The copies waiting for their releases to pass, each with how many are left; an allocation or the
	// pass's end makes them at once.
	var waiting []*grad
	left := map[*grad]int{}
	flush := func(at snapshot.Event, all bool) {
		rest := waiting[:0]
		for _, g := range waiting {
			if all || left[g] <= 0 {
				makeCopy(at, g)
				remade++
			} else {
				rest = append(rest, g)
			}
		}
		waiting = rest
	}
	for i := range t.events {
		e := t.events[i]
		if len(waiting) > 0 && (e.Action == snapshot.ActionAlloc || e.Action == snapshot.ActionPhase) {
			flush(e, true)
		}
		if i >= first {
			switch e.Action {
			case snapshot.ActionPhase:
				out.events = append(out.events, e)
				targets = nil
				switch {
				case e.Phase == snapshot.PhaseZeroGrad:
					// zero_grad walks the parameters in order, which backward reached last to first.
					for _, g := range slices.Backward(grads) {
						if cur[g] != 0 {
							released++
						}
						release(e, g)
					}
					pending = true
				case e.Phase == snapshot.PhaseBackward && pending:
					pending = false
					occ := t.occurrences(i, func(int) bool { return false })
					targets = map[int][]*grad{}
					if len(occ) < len(grads) { // not a whole backward (a trace cut by its OOM): nothing is remade
						missed += len(grads)
						continue
					}
					for _, g := range grads {
						if g.none {
							waiting = append(waiting, g)
							left[g] = g.frees
							continue
						}
						if j, ok := occ[g.at]; ok {
							targets[j] = append(targets[j], g)
						} else {
							missed++
						}
					}
				}
				continue
			case snapshot.ActionAlloc, snapshot.ActionCategory, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
				if g := byAddr[e.Addr]; g != nil { // the recorded gradient: released at the first zero_grad
					if e.Action == snapshot.ActionFreeRequested {
						release(e, g) // the end of the run: what stands for it goes
					}
					continue
				}
				// Added in place and released in the recording: it stays as .grad until a zero_grad or the
				// end of the run releases it.
				if held[e.Addr] && (e.Action == snapshot.ActionFreeRequested || e.Action == snapshot.ActionFreeCompleted) {
					continue
				}
			}
		}
		out.events = append(out.events, e)
		if len(waiting) > 0 && e.Action == snapshot.ActionFreeCompleted {
			for _, g := range waiting {
				left[g]--
			}
			flush(e, false)
		}
		for _, g := range targets[i] {
			if g.stolen {
				c := e
				c.Action, c.Category = snapshot.ActionCategory, snapshot.CategoryGradient
				out.events = append(out.events, c)
				held[e.Addr] = true
				cur[g] = e.Addr
				remade++
				continue
			}
			waiting = append(waiting, g)
			left[g] = g.frees
		}
		flush(e, false)
	}
	var bytes int64
	for _, g := range grads {
		bytes += g.b.size
	}
	line := fmt.Sprintf("%s: the %d gradients (%s) are released at each zero_grad (%d releases) and made again "+
		"where the next backward first writes them (%d times, found by the size and stack of the first "+
		"backward's allocations)", name, len(grads), units.FormatSize(bytes), released, remade)
	if missed > 0 {
		line += fmt.Sprintf("; %d were not found in their backward and are left out", missed)
	}
	return out, line, nil
}
