package transform

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"sync"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
)

// CheckCheckpoint says whether c can be applied to a trace: a trace is checkpointed by whole blocks (all or
// every:N), since which of a block's allocations are its attention's is not recorded.
func CheckCheckpoint(c knob.Checkpoint) error {
	if c.Every() == 0 {
		return fmt.Errorf("checkpoint %s: a trace is checkpointed by whole blocks: want all or every:N with N > 0", c)
	}
	return nil
}

// Checkpoint runs the model's repeated blocks (the module list whose scopes read prefix.0, prefix.1, ...,
// e.g. transformer.h.<i>) under activation checkpointing, as torch.utils.checkpoint does: the block's forward
// runs without grad, so of what it allocates only its output (the next block's input, which the checkpoint
// saves) outlives it: a tensor backward would have used is released when the module that read it returns
// (read off where autograd saved it and the scopes that follow), or at the block's next allocation when it
// saved itself; just before the block's backward its forward allocations are made again (phase recompute)
// and backward releases them as it did. The block's output is taken to be its last allocation alive at its
// end. A tensor several ops read is released after the last of them, which the trace does not show:
// ApplyEnds's late end holds it instead until the function that made it returns.
func Checkpoint(c knob.Checkpoint) Transform {
	name := "checkpoint " + c.String()
	check := func(t *trace) error {
		if err := CheckCheckpoint(c); err != nil {
			return err
		}
		return t.requireTags(name, true, false)
	}
	return Transform{Name: name,
		apply: func(t *trace) (*trace, string, error) {
			if err := check(t); err != nil {
				return nil, "", err
			}
			early, _, line, err := checkpoint(t, c, name, false)
			return early, line, err
		},
		ends: func(t *trace) (*trace, *trace, string, error) {
			if err := check(t); err != nil {
				return nil, nil, "", err
			}
			return checkpoint(t, c, name, true)
		},
	}
}

// NothingToCheckpointError says a trace that ran to its end has forward passes but no backward pass after
// any of them (an inference trace, or one whose backward was not recorded): checkpointing frees what a
// forward saves for its backward and recomputes it there, so without a backward it frees nothing and
// recomputes nothing. A trace that ends in an OOM before its first backward is not one.
type NothingToCheckpointError struct {
	Transform string
	Passes    int // the forward passes found
}

func (e *NothingToCheckpointError) Error() string {
	return fmt.Sprintf("%s: nothing to checkpoint: no backward pass follows the trace's %d forward %s (an inference "+
		"trace, or its backward was not recorded); checkpointing frees what a forward saves for backward and "+
		"recomputes it there, so here it would save nothing", e.Transform, e.Passes, plural(e.Passes, "pass", "passes"))
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// checkpoint applies c to t. With ends, it also returns the trace with what a checkpointed block saved held
// until the function that made it returns (the late end); else held is nil.
func checkpoint(t *trace, c knob.Checkpoint, name string, ends bool) (early, held *trace, line string, err error) {
	k := newCheckpointer(t, c, name, ends)
	for i := 0; i < len(t.events); i++ {
		e := &t.events[i]
		if e.Action != snapshot.ActionPhase || e.Phase != snapshot.PhaseForward {
			continue
		}
		end, err := k.pass(i)
		if err != nil {
			return nil, nil, "", err
		}
		if end > 0 { // the pass is done: go on after it
			i = end - 1
		}
	}
	if k.passes == 0 && k.inferred {
		return nil, nil, "", &MissingTagsError{name, "scope (module, with repeated blocks such as transformer.h.<i>), " +
			"and no forward pass repeats its allocations (size and stack) in blocks,"}
	}
	if k.passes == 0 {
		return nil, nil, "", &MissingTagsError{name, "forward phase and block scope"}
	}
	// A run cut short by an OOM before any backward (the common case: it died in its first forward) is
	// training all the same: its forward saved for a backward that never came, which checkpointing frees.
	if k.backwards == 0 && !slices.ContainsFunc(t.events, func(e snapshot.Event) bool { return e.Action == snapshot.ActionOOM }) {
		return nil, nil, "", &NothingToCheckpointError{Transform: name, Passes: k.passes}
	}
	k.before.sort()
	if ends {
		var wg sync.WaitGroup
		wg.Go(func() { held = k.build(k.afterHeld, true) })
		early = k.build(k.after, false)
		wg.Wait()
	} else {
		early = k.build(k.after, false)
	}
	return early, held, k.line(), nil
}

// checkpointer is one application of activation checkpointing to a trace: how it finds the chosen blocks of
// each forward pass and of its backward, and what it adds to the trace and redirects in it, pass by pass.
type checkpointer struct {
	t      *trace
	name   string
	ends   bool // place the late end's releases too
	chosen func(block int) bool
	// Where scopes name the blocks (prefix.<i>), of gives each scope's block and count their number; else
	// (inferred) the repetition of a forward pass's allocations finds them, count is the most found in a pass
	// and periods are the repetitions' lengths, in allocations.
	prefix   string
	of       map[snapshot.StringID]int
	count    int
	inferred bool
	periods  []int

	bs    map[uint64]*block
	fresh *trace // the recomputed copies' addresses

	// What to add before and after events (after at each end), and how to rewrite the events that refer to
	// saved blocks.
	before, after, afterHeld additions
	redirects                map[uint64]redirect

	// released is, inferred, what each block of the last forward pass saved: the sorted indices of its
	// releases, by which its backward's span is aligned.
	released [][]int

	passes, recomputed int
	backwards          int   // the forward passes a backward pass follows
	maxSaved           int64 // the most bytes one pass saved for backward
	blocksDone         map[int]bool

	survivors []uint64          // scratch: a block's allocations alive at its end
	copyOf    map[uint64]uint64 // scratch: a recomputed block's copies by original
}

// redirect is how the events that refer to a saved block change: those in [from, until) are dropped
// ([fromHeld, until) at the late end), and from at on they refer to the recomputed copy to (at < 0: never).
type redirect struct {
	from, until int
	fromHeld    int
	at          int
	to          uint64
}

func newCheckpointer(t *trace, c knob.Checkpoint, name string, ends bool) *checkpointer {
	prefix, count, of := t.blocks()
	return &checkpointer{t: t, name: name, ends: ends, chosen: c.Block, prefix: prefix, of: of, count: count,
		inferred: count < 2, bs: t.index(), fresh: t.derive(0), redirects: map[uint64]redirect{},
		blocksDone: map[int]bool{}, copyOf: map[uint64]uint64{}}
}

// blockOf returns the chosen block scope id names.
func (k *checkpointer) blockOf(id snapshot.StringID) (int, bool) {
	n, ok := k.of[id]
	return n, ok && k.chosen(n)
}

// member reports whether e belongs to the block whose span it lies in: where scopes name the blocks, a
// block's allocations are those of its scope; inferred, every allocation in a block's span is its own.
func (k *checkpointer) member(e *snapshot.Event) bool {
	_, ok := k.blockOf(e.Scope)
	return k.inferred || ok
}

// forward returns the chosen blocks of the forward pass at marker start, the pass's end and how many blocks
// it holds in all.
func (k *checkpointer) forward(start int) (map[int]span, int, int) {
	if !k.inferred {
		spans, end := k.t.passBlocks(start, k.blockOf)
		return spans, end, k.count
	}
	all, end, period := k.t.repeatedBlocks(start, false, 0)
	spans := map[int]span{}
	for n, s := range all {
		if k.chosen(n) {
			spans[n] = s
		}
	}
	if len(all) > 0 {
		k.count = max(k.count, len(all))
		k.periods = append(k.periods, period)
	}
	k.released = k.released[:0]
	for _, s := range all {
		k.released = append(k.released, k.releases(s))
	}
	return spans, end, len(all)
}

// backward returns the spans of the backward pass at marker start of the chosen blocks of a forward pass
// that held n blocks.
func (k *checkpointer) backward(start, n int) (map[int]span, error) {
	if !k.inferred {
		spans, _ := k.t.passBlocks(start, k.blockOf)
		return spans, nil
	}
	all, _, _ := k.t.repeatedBlocks(start, true, n)
	if len(all) != n {
		return nil, &MissingTagsError{k.name, fmt.Sprintf("repeated blocks (found %d in a forward pass and %d "+
			"in its backward by the repetition of their allocations; scopes such as transformer.h.<i> "+
			"would name them)", n, len(all))}
	}
	released := make([][]int, n) // backward runs the blocks last to first
	for j := range released {
		released[j] = k.released[n-1-j]
	}
	all = k.t.alignBackward(start, all, released)
	spans := map[int]span{}
	for j, s := range all {
		if n := len(all) - 1 - j; k.chosen(n) {
			spans[n] = s
		}
	}
	return spans, nil
}

// releases returns the sorted indices of the releases of what the block whose forward is fs saved for
// backward: its allocations alive at its end but the last, its output.
func (k *checkpointer) releases(fs span) []int {
	var out []int
	var last uint64
	for j := fs.first; j <= fs.last; j++ {
		f := &k.t.events[j]
		if f.Action != snapshot.ActionAlloc || !k.member(f) {
			continue
		}
		if b := k.bs[f.Addr]; b.free < 0 || b.free > fs.last {
			if last != 0 {
				if lb := k.bs[last]; lb.free >= 0 {
					out = append(out, lb.free)
				}
			}
			last = f.Addr
		}
	}
	slices.Sort(out)
	return out
}

// backwardOf finds the backward pass that follows the forward pass at marker fwd, ending at end, in the same
// iteration: its marker (-1: none) and its blocks' spans, of a forward that held n blocks.
func (k *checkpointer) backwardOf(fwd, end, n int) (bwd map[int]span, marker int, err error) {
	t := k.t
	marker = -1
	for j := end; j < len(t.events); j++ {
		f := &t.events[j]
		if f.Action != snapshot.ActionPhase {
			continue
		}
		if f.Phase == snapshot.PhaseBackward && f.Iteration == t.events[fwd].Iteration {
			marker = j
			if bwd, err = k.backward(j, n); err != nil {
				return nil, -1, err
			}
		}
		if f.Phase != snapshot.PhaseBackward && f.Phase != snapshot.PhaseRecompute {
			if marker >= 0 || f.Phase == snapshot.PhaseForward || f.Phase == snapshot.PhaseOptimizer {
				break
			}
		}
	}
	return bwd, marker, nil
}

// pass checkpoints the chosen blocks of the forward pass at marker start and returns the pass's end, or 0
// when it has none.
func (k *checkpointer) pass(start int) (int, error) {
	fwd, end, found := k.forward(start)
	if len(fwd) == 0 {
		return 0, nil
	}
	bwd, bwdMarker, err := k.backwardOf(start, end, found)
	if err != nil {
		return 0, err
	}
	k.passes++
	if bwdMarker >= 0 {
		k.backwards++
	}
	var saved int64
	for _, n := range slices.Sorted(maps.Keys(fwd)) { // in order: the recomputed copies' addresses are the same every time
		saved += k.block(n, fwd[n], bwd, bwdMarker)
	}
	k.maxSaved = max(k.maxSaved, saved)
	return end, nil
}

// block checkpoints block n, whose forward is fs, with the spans bwd of its pass's backward at marker
// bwdMarker, and returns the bytes it saved for backward.
func (k *checkpointer) block(n int, fs span, bwd map[int]span, bwdMarker int) int64 {
	// The block's allocations alive at its end: its output (the last) and what backward would use.
	k.survivors = k.survivors[:0]
	for j := fs.first; j <= fs.last; j++ {
		f := &k.t.events[j]
		if f.Action != snapshot.ActionAlloc || !k.member(f) {
			continue
		}
		if b := k.bs[f.Addr]; b.free < 0 || b.free > fs.last {
			k.survivors = append(k.survivors, f.Addr)
		}
	}
	if len(k.survivors) == 0 {
		return 0
	}
	k.blocksDone[n] = true
	output, saved := k.survivors[len(k.survivors)-1], k.survivors[:len(k.survivors)-1]
	bspan, hasBackward := bwd[n]
	var bytes int64
	for _, a := range saved {
		bytes += k.release(a, fs, bspan, hasBackward)
	}
	if hasBackward {
		k.recompute(fs, bspan, bwdMarker, output, saved)
	}
	return bytes
}

// release releases saved block a in the forward fs that now runs without grad, at both ends where asked, and
// drops its recorded releases up to its backward bspan (if hasBackward). It returns a's bytes.
func (k *checkpointer) release(a uint64, fs, bspan span, hasBackward bool) int64 {
	t := k.t
	b := k.bs[a]
	ae := t.events[b.alloc]
	// Without grad, a tensor is released once the op that reads it returns: where autograd saved it (its
	// category event), else at the block's next allocation.
	at, next := -1, fs.last
	for j := b.alloc + 1; j < fs.last; j++ {
		f := &t.events[j]
		if f.Action == snapshot.ActionCategory && f.Addr == a {
			at = j
			break
		}
		if f.Action == snapshot.ActionAlloc && next == fs.last && k.member(f) {
			next = j
		}
	}
	if at >= 0 && !k.inferred && t.events[at].Scope != ae.Scope {
		at = t.consumerReturns(at, ae.Scope, fs.last)
	}
	if at < 0 {
		at = next
	}
	fr := freeEvents(t.events[at], a, ae.Size, ae.BlockSize)
	k.after.add(at, fr[0], fr[1])
	atHeld := at
	if k.ends {
		if r := t.readerOf(b.alloc, fs.last, k.member); r >= 0 {
			atHeld = max(at, t.holderReturns(b.alloc, r, fs.last, k.member))
		}
		fr := freeEvents(t.events[atHeld], a, ae.Size, ae.BlockSize)
		k.afterHeld.add(atHeld, fr[0], fr[1])
	}
	r := redirect{from: at + 1, fromHeld: atHeld + 1, until: len(t.events), at: -1}
	if hasBackward {
		r.until = bspan.first
	}
	k.redirects[a] = r
	return ae.Size
}

// recompute makes the forward fs's allocations again just before its backward bspan (marker bwdMarker), as
// phase recompute, and releases the copies: the saved blocks' where backward released the originals, the
// output's, and a copy whose original backward never released, at the block's backward end.
func (k *checkpointer) recompute(fs, bspan span, bwdMarker int, output uint64, saved []uint64) {
	t := k.t
	k.recomputed++
	bm := t.events[bwdMarker]
	k.before.add(bspan.first, snapshot.Event{Time: bm.Time, Action: snapshot.ActionPhase, Device: bm.Device,
		Phase: snapshot.PhaseRecompute, Iteration: bm.Iteration})
	clear(k.copyOf)
	for j := fs.first; j <= fs.last; j++ {
		f := t.events[j]
		switch f.Action {
		case snapshot.ActionAlloc:
			if !k.member(&f) {
				continue
			}
			k.copyOf[f.Addr] = k.fresh.fresh()
			f.Addr = k.copyOf[f.Addr]
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
			a, ok := k.copyOf[f.Addr]
			if !ok {
				continue
			}
			f.Addr = a
		default:
			continue
		}
		f.Phase, f.Time, f.Iteration = snapshot.PhaseRecompute, bm.Time, bm.Iteration
		k.before.add(bspan.first, f)
	}
	resume := bm
	resume.Time = t.events[bspan.first].Time
	k.before.add(bspan.first, resume)
	late := []uint64{output}
	for _, a := range saved {
		r := k.redirects[a]
		if b := k.bs[a]; b.free >= bspan.first {
			r.at, r.to = bspan.first, k.copyOf[a]
			k.redirects[a] = r
		} else {
			late = append(late, a)
		}
	}
	for _, a := range late {
		ae := t.events[k.bs[a].alloc]
		fr := freeEvents(t.events[bspan.last], k.copyOf[a], ae.Size, ae.BlockSize)
		k.after.add(bspan.last, fr[0], fr[1])
		k.afterHeld.add(bspan.last, fr[0], fr[1])
	}
}

// build writes one end: the events with the additions (before, shared, and after, the end's own) in place
// and the saved blocks' events redirected (from their fromHeld at the late end). What is added after an event
// is written whether or not the event itself is kept: a release placed at the end of a block's backward
// still happens where that end is a dropped release of another block's saved tensor.
func (k *checkpointer) build(after additions, isHeld bool) *trace {
	t := k.t
	before := k.before // each end consumes its own view of the shared additions
	after.sort()
	out := k.fresh.derive(len(t.events) + before.len() + after.len())
	for i := range t.events {
		out.events = before.appendAt(out.events, i)
		if e, keep := k.rewrite(i, isHeld); keep {
			out.events = append(out.events, e)
		}
		out.events = after.appendAt(out.events, i)
	}
	return out
}

// rewrite returns event i as the end (held or early) writes it, and false where that end drops it: a
// release or category change of a saved block between its release in the forward and its recompute.
func (k *checkpointer) rewrite(i int, isHeld bool) (snapshot.Event, bool) {
	e := k.t.events[i]
	switch e.Action {
	case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
		r, ok := k.redirects[e.Addr]
		if !ok {
			break
		}
		if isHeld {
			r.from = r.fromHeld
		}
		switch {
		case r.at >= 0 && i >= r.at:
			e.Addr = r.to
		case i >= r.from && i < r.until, r.at < 0 && i >= r.from:
			return e, false
		}
	}
	return e, true
}

// line says what the checkpoint did and assumed.
func (k *checkpointer) line() string {
	blocks := "blocks of " + k.prefix
	release := "the module that read it returns"
	if k.inferred {
		every := strconv.Itoa(slices.Max(k.periods))
		if lo := slices.Min(k.periods); lo != slices.Max(k.periods) {
			every = strconv.Itoa(lo) + " to " + every
		}
		blocks = "repeated blocks, found by the repetition of their allocations' sizes and stacks within each " +
			"forward pass (every " + every + " allocations),"
		release = "the op that read it returns: where autograd saved it, else at the block's next allocation"
	}
	return fmt.Sprintf("%s: %d of the %d %s checkpointed in %d forward passes; up to %s of what a "+
		"pass saved for backward is released in the forward and made again before each block's backward "+
		"(%d recomputes); assumes a block's last allocation alive at its end is its output, and that without "+
		"grad a tensor is released when %s", k.name, len(k.blocksDone), k.count,
		blocks, k.passes, units.FormatSize(k.maxSaved), k.recomputed, release)
}
