package transform

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/oomdbg/oomdbg/internal/periodic"
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

// blocks finds the repeated blocks of a trace's scopes: the prefix with the most distinct indices, and each
// scope's block index (-1: none).
func (t *trace) blocks() (prefix string, count int, of map[snapshot.StringID]int) {
	indices := map[string]map[int]bool{}
	seen := map[snapshot.StringID]bool{}
	for i := range t.events {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc || e.Scope == 0 || seen[e.Scope] || int(e.Scope) >= len(t.strings) {
			continue
		}
		seen[e.Scope] = true
		parts := strings.Split(modulePath(t.strings[e.Scope]), ".")
		for k := 1; k < len(parts); k++ {
			if n, err := strconv.Atoi(parts[k]); err == nil && n >= 0 && parts[k] == strconv.Itoa(n) {
				p := strings.Join(parts[:k], ".")
				if indices[p] == nil {
					indices[p] = map[int]bool{}
				}
				indices[p][n] = true
			}
		}
	}
	for p, ns := range indices {
		if len(ns) > count || (len(ns) == count && len(p) < len(prefix)) {
			prefix, count = p, len(ns)
		}
	}
	of = map[snapshot.StringID]int{}
	if count < 2 {
		return "", 0, of
	}
	for id := range seen {
		rest, ok := strings.CutPrefix(modulePath(t.strings[id]), prefix+".")
		if !ok {
			continue
		}
		idx, _, _ := strings.Cut(rest, ".")
		if n, err := strconv.Atoi(idx); err == nil && idx == strconv.Itoa(n) {
			of[id] = n
		}
	}
	return prefix, count, of
}

// consumerReturns returns where the module that saved a tensor made in scope made returns to their common
// parent: the event before the first one, after saved, outside the parent's child that holds the saver (the
// caller drops the tensor when that child returns), or last.
func (t *trace) consumerReturns(saved int, made snapshot.StringID, last int) int {
	if int(made) >= len(t.strings) || int(t.events[saved].Scope) >= len(t.strings) {
		return last
	}
	child, ok := sharedChild(modulePath(t.strings[made]), modulePath(t.strings[t.events[saved].Scope]))
	if !ok {
		return saved
	}
	for j := saved + 1; j <= last; j++ {
		e := &t.events[j]
		if e.Action != snapshot.ActionAlloc || int(e.Scope) >= len(t.strings) {
			continue
		}
		if !within(modulePath(t.strings[e.Scope]), child) {
			return j - 1
		}
	}
	return last
}

// sharedChild returns module path q up to and including its first component that p does not share (comparing
// the dotted components in order, from the first), and false when p shares every component of q.
func sharedChild(p, q string) (string, bool) {
	for off, pMore := 0, true; ; {
		qEnd := componentEnd(q, off)
		if !pMore {
			return q[:qEnd], true
		}
		pEnd := componentEnd(p, off)
		if p[off:pEnd] != q[off:qEnd] {
			return q[:qEnd], true
		}
		if qEnd == len(q) {
			return "", false
		}
		pMore, off = pEnd < len(p), qEnd+1
	}
}

// componentEnd returns where the dotted component of path s that begins at off ends.
func componentEnd(s string, off int) int {
	if i := strings.IndexByte(s[off:], '.'); i >= 0 {
		return off + i
	}
	return len(s)
}

// within reports whether module path sc is module m or inside it.
func within(sc, m string) bool {
	return strings.HasPrefix(sc, m) && (len(sc) == len(m) || sc[len(m)] == '.')
}

// modulePath is the module path a scope names: its text up to the first colon or space, since a PyTorch
// snapshot's user_metadata, which becomes the scope, often follows the module with a label
// ("transformer.h.0.attn: f32[8,256,768] qkv").
func modulePath(scope string) string {
	if i := strings.IndexAny(scope, ": "); i >= 0 {
		return scope[:i]
	}
	return scope
}

// span is where one block's events lie in one forward or backward pass: [first, last].
type span struct{ first, last int }

// passBlocks finds, in the pass of phase p beginning at event start, each block's span, and the index of the
// event ending the pass.
func (t *trace) passBlocks(start int, blockOf func(snapshot.StringID) (int, bool)) (map[int]span, int) {
	spans := map[int]span{}
	i := start + 1
	for ; i < len(t.events); i++ {
		e := &t.events[i]
		if e.Action == snapshot.ActionPhase || e.Action == snapshot.ActionIteration {
			break
		}
		if n, ok := blockOf(e.Scope); ok {
			s, seen := spans[n]
			if !seen {
				s.first = i
			}
			s.last = i
			spans[n] = s
		}
	}
	return spans, i
}

// The search for repeated blocks is bounded, since it takes the pass's allocations times the starts it
// tries: a pass of at most maxBlockSearch allocations (a GPT-2 block makes about 25: over 300 blocks), whose
// blocks begin within its first maxBlockStart (after the embedding and whatever precedes the first block).
const (
	maxBlockSearch = 8192
	maxBlockStart  = 256
)

// repeatedBlocks finds the repeated blocks of the pass that begins at marker start where no scope names
// them: the longest stretch of the pass's allocations, by size and stack, that repeats one period at least
// twice (periodic.Prefix from each of the first allocations on). Of the longest, a forward pass takes the
// earliest and a backward pass (last) the latest: what precedes the first block's forward (the embedding)
// does not repeat it, but what follows the last block's forward, a final norm, may look like a block's first
// op, and it leads the backward pass, where the earliest stretch would give each block's backward the
// next block's last op. Each repetition is a block: its span runs from its first allocation to the event
// before the next repetition's (or the pass's next allocation). It returns the blocks in order, the pass's
// end and the period.
func (t *trace) repeatedBlocks(start int, last bool) ([]span, int, int) {
	var seqs []int
	var toks []allocKey
	i := start + 1
	for ; i < len(t.events); i++ {
		e := &t.events[i]
		if e.Action == snapshot.ActionPhase || e.Action == snapshot.ActionIteration {
			break
		}
		if e.Action == snapshot.ActionAlloc && (t.pre == 0 || e.Label != t.pre) {
			seqs = append(seqs, i)
			toks = append(toks, allocKey{e.Size, e.Stack})
		}
	}
	end, n := i, len(toks)
	if n > maxBlockSearch {
		return nil, end, 0
	}
	from, full, period := 0, 0, 0
	for s := 0; (n-s > full || last && n-s == full && full > 0) && s < maxBlockStart; s++ {
		l, p := periodic.Prefix(n-s, func(i int) allocKey { return toks[s+i] }, 2)
		if p > 0 && (l/p*p > full || last && l/p*p == full) {
			from, full, period = s, l/p*p, p
		}
	}
	if period == 0 {
		return nil, end, 0
	}
	var blocks []span
	for k := from; k < from+full; k += period {
		last := end - 1
		if k+period < n {
			last = seqs[k+period] - 1
		}
		blocks = append(blocks, span{seqs[k], last})
	}
	return blocks, end, period
}

// additions are events to insert into a trace, each at the index of the event it goes next to: the events
// in the order they were added, and their places, which sort orders.
type additions struct {
	evs    []snapshot.Event
	places []place
}

// place is where addition evs[i] goes: next to event at.
type place struct{ at, i int }

func (a *additions) add(at int, evs ...snapshot.Event) {
	for _, e := range evs {
		a.places = append(a.places, place{at, len(a.evs)})
		a.evs = append(a.evs, e)
	}
}

// sort orders the additions by index, keeping the order they were added in at each.
func (a *additions) sort() {
	slices.SortFunc(a.places, func(x, y place) int {
		if c := cmp.Compare(x.at, y.at); c != 0 {
			return c
		}
		return cmp.Compare(x.i, y.i)
	})
}

// appendAt appends the sorted additions at index i to dst and consumes them; those before i must be consumed.
func (a *additions) appendAt(dst []snapshot.Event, i int) []snapshot.Event {
	for len(a.places) > 0 && a.places[0].at == i {
		dst = append(dst, a.evs[a.places[0].i])
		a.places = a.places[1:]
	}
	return dst
}

// skipBefore drops the sorted additions before index i.
func (a *additions) skipBefore(i int) {
	for len(a.places) > 0 && a.places[0].at < i {
		a.places = a.places[1:]
	}
}

// len returns the number of additions not consumed.
func (a *additions) len() int { return len(a.places) }

// checkpoint applies c to t. With ends, it also returns the trace with what a checkpointed block saved held
// until the function that made it returns (the late end); else held is nil.
func checkpoint(t *trace, c knob.Checkpoint, name string, ends bool) (early, held *trace, line string, err error) {
	prefix, count, of := t.blocks()
	chosen := c.Block
	blockOf := func(id snapshot.StringID) (int, bool) {
		n, ok := of[id]
		return n, ok && chosen(n)
	}
	// Where scopes name the blocks, a block's allocations are those of its scope; else the repetition of a
	// forward pass's allocations finds them, and every allocation in a block's span is its own.
	inferred := count < 2
	member := func(e *snapshot.Event) bool {
		_, ok := blockOf(e.Scope)
		return inferred || ok
	}
	// forward returns the chosen blocks of the forward pass at marker start, the pass's end and how many
	// blocks it holds in all; backward
	// the spans of the backward pass at marker start of the forward's blocks, of which there were n.
	forward := func(start int) (map[int]span, int, int) {
		spans, end := t.passBlocks(start, blockOf)
		return spans, end, count
	}
	backward := func(start, _ int) (map[int]span, error) {
		spans, _ := t.passBlocks(start, blockOf)
		return spans, nil
	}
	var periods []int
	if inferred {
		forward = func(start int) (map[int]span, int, int) {
			all, end, period := t.repeatedBlocks(start, false)
			spans := map[int]span{}
			for n, s := range all {
				if chosen(n) {
					spans[n] = s
				}
			}
			if len(all) > 0 {
				count = max(count, len(all))
				periods = append(periods, period)
			}
			return spans, end, len(all)
		}
		// Backward runs the blocks last to first.
		backward = func(start, n int) (map[int]span, error) {
			all, _, _ := t.repeatedBlocks(start, true)
			if len(all) != n {
				return nil, &MissingTagsError{name, fmt.Sprintf("repeated blocks (found %d in a forward pass and %d "+
					"in its backward by the repetition of their allocations; scopes such as transformer.h.<i> "+
					"would name them)", n, len(all))}
			}
			spans := map[int]span{}
			for j, s := range all {
				if n := len(all) - 1 - j; chosen(n) {
					spans[n] = s
				}
			}
			return spans, nil
		}
	}
	bs := t.index()

	// What to add before and after events (after at each end), and how to rewrite the events that refer to
	// saved blocks.
	var before, after, afterHeld additions
	type redirect struct {
		from, until int    // events in [from, until) referring to the block are dropped ...
		fromHeld    int    // ... [fromHeld, until) at the late end ...
		at          int    // ... and from at on they refer to to (at < 0: never)
		to          uint64 // the recomputed copy
	}
	redirects := map[uint64]redirect{}
	fresh := t.derive(0) // the recomputed copies' addresses
	var passes, recomputed int
	var maxSaved int64
	blocksDone := map[int]bool{}
	var survivors, saved []uint64
	copyOf := map[uint64]uint64{}

	for i := 0; i < len(t.events); i++ {
		e := &t.events[i]
		if e.Action != snapshot.ActionPhase || e.Phase != snapshot.PhaseForward {
			continue
		}
		fwd, end, blocksFound := forward(i)
		if len(fwd) == 0 {
			continue
		}
		// The backward pass that follows, in the same iteration.
		var bwd map[int]span
		bwdMarker := -1
		for j := end; j < len(t.events); j++ {
			f := &t.events[j]
			if f.Action != snapshot.ActionPhase {
				continue
			}
			if f.Phase == snapshot.PhaseBackward && f.Iteration == e.Iteration {
				bwdMarker = j
				if bwd, err = backward(j, blocksFound); err != nil {
					return nil, nil, "", err
				}
			}
			if f.Phase != snapshot.PhaseBackward && f.Phase != snapshot.PhaseRecompute {
				if bwdMarker >= 0 || f.Phase == snapshot.PhaseForward || f.Phase == snapshot.PhaseOptimizer {
					break
				}
			}
		}
		passes++
		var passSaved int64
		for _, n := range slices.Sorted(maps.Keys(fwd)) { // in order: the recomputed copies' addresses are the same every time
			fs := fwd[n]
			// The block's allocations alive at its end: its output and what backward would use.
			survivors = survivors[:0]
			output := -1
			for j := fs.first; j <= fs.last; j++ {
				f := &t.events[j]
				if f.Action != snapshot.ActionAlloc || !member(f) {
					continue
				}
				if b := bs[f.Addr]; b.free < 0 || b.free > fs.last {
					survivors = append(survivors, f.Addr)
					output = len(survivors) - 1
				}
			}
			if output < 0 {
				continue
			}
			blocksDone[n] = true
			saved = append(append(saved[:0], survivors[:output]...), survivors[output+1:]...)
			bspan, hasBackward := bwd[n]
			for _, a := range saved {
				b := bs[a]
				ae := t.events[b.alloc]
				// Without grad, a tensor is released once the op that reads it returns: where autograd saved
				// it (its category event), else at the block's next allocation.
				at, next := -1, fs.last
				for j := b.alloc + 1; j < fs.last; j++ {
					f := &t.events[j]
					if f.Action == snapshot.ActionCategory && f.Addr == a {
						at = j
						break
					}
					if f.Action == snapshot.ActionAlloc && next == fs.last && member(f) {
						next = j
					}
				}
				if at >= 0 && !inferred && t.events[at].Scope != ae.Scope {
					at = t.consumerReturns(at, ae.Scope, fs.last)
				}
				if at < 0 {
					at = next
				}
				fr := freeEvents(t.events[at], a, ae.Size, ae.BlockSize)
				after.add(at, fr[0], fr[1])
				atHeld := at
				if ends {
					if r := t.readerOf(b.alloc, fs.last, member); r >= 0 {
						atHeld = max(at, t.holderReturns(b.alloc, r, fs.last, member))
					}
					fr := freeEvents(t.events[atHeld], a, ae.Size, ae.BlockSize)
					afterHeld.add(atHeld, fr[0], fr[1])
				}
				passSaved += ae.Size
				r := redirect{from: at + 1, fromHeld: atHeld + 1, until: len(t.events), at: -1}
				if hasBackward {
					r.until = bspan.first
				}
				redirects[a] = r
			}
			if !hasBackward {
				continue
			}
			// The recompute, just before the block's backward.
			recomputed++
			bm := t.events[bwdMarker]
			before.add(bspan.first, snapshot.Event{Time: bm.Time, Action: snapshot.ActionPhase, Device: bm.Device,
				Phase: snapshot.PhaseRecompute, Iteration: bm.Iteration})
			clear(copyOf)
			for j := fs.first; j <= fs.last; j++ {
				f := t.events[j]
				switch f.Action {
				case snapshot.ActionAlloc:
					if !member(&f) {
						continue
					}
					copyOf[f.Addr] = fresh.fresh()
					f.Addr = copyOf[f.Addr]
				case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
					a, ok := copyOf[f.Addr]
					if !ok {
						continue
					}
					f.Addr = a
				default:
					continue
				}
				f.Phase, f.Time, f.Iteration = snapshot.PhaseRecompute, bm.Time, bm.Iteration
				before.add(bspan.first, f)
			}
			resume := bm
			resume.Time = t.events[bspan.first].Time
			before.add(bspan.first, resume)
			// The saved blocks' copies go where backward released the originals; the output's copy, and a
			// copy whose original backward never released, go at the block's backward end.
			late := []uint64{survivors[output]}
			for _, a := range saved {
				r := redirects[a]
				if b := bs[a]; b.free >= bspan.first {
					r.at, r.to = bspan.first, copyOf[a]
					redirects[a] = r
				} else {
					late = append(late, a)
				}
			}
			for _, a := range late {
				ae := t.events[bs[a].alloc]
				fr := freeEvents(t.events[bspan.last], copyOf[a], ae.Size, ae.BlockSize)
				after.add(bspan.last, fr[0], fr[1])
				afterHeld.add(bspan.last, fr[0], fr[1])
			}
		}
		maxSaved = max(maxSaved, passSaved)
		i = end - 1
	}
	if passes == 0 && inferred {
		return nil, nil, "", &MissingTagsError{name, "scope (module, with repeated blocks such as transformer.h.<i>), " +
			"and no forward pass repeats its allocations (size and stack) in blocks,"}
	}
	if passes == 0 {
		return nil, nil, "", &MissingTagsError{name, "forward phase and block scope"}
	}
	blocks := "blocks of " + prefix
	release := "the module that read it returns"
	if inferred {
		every := strconv.Itoa(slices.Max(periods))
		if lo := slices.Min(periods); lo != slices.Max(periods) {
			every = strconv.Itoa(lo) + " to " + every
		}
		blocks = "repeated blocks, found by the repetition of their allocations' sizes and stacks within each " +
			"forward pass (every " + every + " allocations),"
		release = "the op that read it returns: where autograd saved it, else at the block's next allocation"
	}
	before.sort()
	// build writes one end: the events with the additions in place and the saved blocks' events redirected.
	build := func(after additions, isHeld bool) *trace {
		before := before // each end consumes its own view of the shared additions
		after.sort()
		out := fresh.derive(len(t.events) + before.len() + after.len())
		for i := range t.events {
			out.events = before.appendAt(out.events, i)
			after.skipBefore(i) // what follows a dropped event goes with it
			e := t.events[i]
			switch e.Action {
			case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
				if r, ok := redirects[e.Addr]; ok {
					if isHeld {
						r.from = r.fromHeld
					}
					switch {
					case r.at >= 0 && i >= r.at:
						e.Addr = r.to
					case i >= r.from && i < r.until, r.at < 0 && i >= r.from:
						continue
					}
				}
			}
			out.events = append(out.events, e)
			out.events = after.appendAt(out.events, i)
		}
		return out
	}
	if ends {
		var wg sync.WaitGroup
		wg.Go(func() { held = build(afterHeld, true) })
		early = build(after, false)
		wg.Wait()
	} else {
		early = build(after, false)
	}
	line = fmt.Sprintf("%s: %d of the %d %s checkpointed in %d forward passes; up to %s of what a "+
		"pass saved for backward is released in the forward and made again before each block's backward "+
		"(%d recomputes); assumes a block's last allocation alive at its end is its output, and that without "+
		"grad a tensor is released when %s", name, len(blocksDone), count,
		blocks, passes, units.FormatSize(maxSaved), recomputed, release)
	return early, held, line, nil
}

// stack returns the frames of stack id, innermost first; nil for an unknown one.
func (t *trace) stack(id snapshot.StackID) []snapshot.FrameID {
	if int(id) < len(t.stacks) {
		return t.stacks[id]
	}
	return nil
}

// function returns the function a frame is in; 0 for an unknown frame.
func (t *trace) function(f snapshot.FrameID) snapshot.StringID {
	if int(f) < len(t.frames) {
		return t.frames[f].Function
	}
	return 0
}

// readerOf returns the first allocation of the block after made, up to last, whose stack differs from
// made's beyond its innermost frame: the output of the next op, taken to be the first that reads what made
// allocated (an op's own further outputs come from the same frames but its innermost); -1 if none or made
// has no stack.
func (t *trace) readerOf(made, last int, member func(*snapshot.Event) bool) int {
	sa := t.stack(t.events[made].Stack)
	if len(sa) == 0 {
		return -1
	}
	for j := made + 1; j <= last; j++ {
		e := &t.events[j]
		if e.Action != snapshot.ActionAlloc || !member(e) {
			continue
		}
		if s := t.stack(e.Stack); !slices.Equal(s[min(1, len(s)):], sa[1:]) {
			return j
		}
	}
	return -1
}

// holderReturns returns where the function holding a tensor returns: the event before the first allocation
// of the block after reader, up to last, made outside that function's call, or last. The holder is the
// innermost function both made's and reader's stacks run in under the same callers: the function in which
// their frames first differ, read from the outermost, if both are in it, else the caller of the two. It
// returns -1 when the stacks share no caller.
func (t *trace) holderReturns(made, reader, last int, member func(*snapshot.Event) bool) int {
	sa, sr := t.stack(t.events[made].Stack), t.stack(t.events[reader].Stack)
	k := 0 // frames shared, from the outermost
	for k < len(sa) && k < len(sr) && sa[len(sa)-1-k] == sr[len(sr)-1-k] {
		k++
	}
	var depth int // of the holder's frame, from the outermost
	switch {
	case k < len(sa) && k < len(sr) && t.function(sa[len(sa)-1-k]) == t.function(sr[len(sr)-1-k]):
		depth = k
	case k > 0:
		depth = k - 1
	default:
		return -1
	}
	callers, fn := sa[len(sa)-depth:], t.function(sa[len(sa)-1-depth])
	for j := reader + 1; j <= last; j++ {
		e := &t.events[j]
		if e.Action != snapshot.ActionAlloc || !member(e) {
			continue
		}
		s := t.stack(e.Stack)
		if len(s) <= depth || !slices.Equal(s[len(s)-depth:], callers) || t.function(s[len(s)-1-depth]) != fn {
			return j - 1
		}
	}
	return last
}
