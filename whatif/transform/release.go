package transform

import (
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
)

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
