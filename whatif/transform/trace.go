package transform

import (
	"fmt"
	"slices"
	"sync"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Transform is one fix applied to a trace. Apply runs it.
type Transform struct {
	// Name says what the fix is, e.g. "batch x0.5".
	Name  string
	apply func(t *trace) (*trace, string, error)
	// ends, for a fix that places releases the trace does not record, applies it at both ends of what the
	// trace allows (see ApplyEnds); nil for the others.
	ends func(t *trace) (early, held *trace, line string, err error)
	// repeats is how many times the transformed trace repeats the recorded passes (accumulation's
	// micro-batches); 0 means once.
	repeats int
}

// HasEnds reports whether the transformation places releases the trace does not record, and so is applied
// at both ends of what the trace allows (ApplyEnds).
func (t Transform) HasEnds() bool { return t.ends != nil }

// Repeats is how many times the transformed trace repeats the recorded forward and backward passes: its
// events are about that many times the recording's.
func (t Transform) Repeats() int { return max(t.repeats, 1) }

// MissingTagsError says a trace lacks the tags a transformation reads.
type MissingTagsError struct {
	Transform string // the transformation's name
	Tags      string // what is missing, e.g. "phase and category"
}

func (e *MissingTagsError) Error() string {
	return fmt.Sprintf("%s needs the trace's %s tags, which it lacks: PyTorch's snapshots do not record "+
		"them, and oomdbg's inference of iterations, phases, categories and modules is what brings them", e.Transform, e.Tags)
}

// Apply runs the transformations on s in order and returns the new trace and one assumption line per
// transformation. s is not changed.
func Apply(s *snapshot.Snapshot, ts ...Transform) (*snapshot.Snapshot, []string, error) {
	t := normalize(s)
	var lines []string
	for _, tr := range ts {
		next, line, err := tr.apply(t)
		if err != nil {
			return nil, lines, err
		}
		t = next
		lines = append(lines, line)
	}
	return t.snapshot(s), lines, nil
}

// ApplyEnds is Apply where a transformation places releases the trace does not record: that of a tensor
// autograd saved, once the block that made it runs without grad (Checkpoint). The trace shows the first op
// that read such a tensor, not the last, so the release lies between two ends: early, the trace Apply
// returns, releases it once the first op that read it returns; held keeps it until the function that made
// it and first read it returns (read off the stacks of the two allocations), the latest the trace allows
// short of the block's end. held is nil where no transformation places such releases. The work the two
// ends share is done once; the lines are early's.
func ApplyEnds(s *snapshot.Snapshot, ts ...Transform) (early, held *snapshot.Snapshot, lines []string, err error) {
	t := normalize(s)
	var h *trace // nil until the ends part
	for _, tr := range ts {
		var line string
		switch {
		case h == nil && tr.ends != nil:
			t, h, line, err = tr.ends(t)
		default:
			var wg sync.WaitGroup
			var hErr error
			if h != nil {
				wg.Go(func() { h, _, hErr = tr.apply(h) })
			}
			t, line, err = tr.apply(t)
			wg.Wait()
			if err == nil {
				err = hErr
			}
		}
		if err != nil {
			return nil, nil, lines, err
		}
		lines = append(lines, line)
	}
	if h == nil {
		return t.snapshot(s), nil, lines, nil
	}
	var wg sync.WaitGroup
	wg.Go(func() { held = h.snapshot(s) })
	early = t.snapshot(s)
	wg.Wait()
	return early, held, lines, nil
}

// freshBase is where the addresses a transformation gives allocations begin: above any real GPU address
// (48-bit virtual addresses), so they never meet a block from before the trace, which keeps its own.
const freshBase = 1 << 56

// freshStep separates fresh addresses: they are identifiers, not places, but stay aligned as blocks are.
const freshStep = torchrules.MinBlockSize

// trace is a transformation's working form: the events, every allocation at an address of its own.
type trace struct {
	events  []snapshot.Event
	next    uint64 // the next fresh address
	pre     snapshot.StringID
	strings []string // the snapshot's string table, shared and read only
	frames  []snapshot.Frame
	stacks  [][]snapshot.FrameID // the snapshot's stacks, innermost frame first, shared and read only
}

// derive returns an empty trace that continues t: the same tables, fresh addresses after t's.
func (t *trace) derive(capacity int) *trace {
	return &trace{events: make([]snapshot.Event, 0, capacity), next: t.next, pre: t.pre, strings: t.strings,
		frames: t.frames, stacks: t.stacks}
}

// fresh returns a new address.
func (t *trace) fresh() uint64 {
	a := t.next
	t.next += freshStep
	return a
}

// kept reports whether a transformed trace keeps events of action a.
func kept(a snapshot.Action) bool {
	switch a {
	case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted,
		snapshot.ActionSegmentFree, snapshot.ActionOOM, snapshot.ActionPhase, snapshot.ActionIteration,
		snapshot.ActionCategory:
		return true
	}
	return false
}

// normalize copies s's events into a trace, giving every allocation an address of its own. Blocks and
// segments from before the trace (imported snapshots) keep theirs: the replay rebuilds them by address.
func normalize(s *snapshot.Snapshot) *trace {
	t := &trace{next: freshBase, strings: s.Strings, frames: s.Frames, stacks: s.Stacks}
	if i := slices.Index(s.Strings, snapshot.PreExistingLabel); i > 0 {
		t.pre = snapshot.StringID(i)
	}
	t.events = make([]snapshot.Event, 0, s.Events.Len())
	live := map[uint64]uint64{}
	for _, e := range s.Events.All() {
		if t.pre != 0 && e.Label == t.pre {
			t.events = append(t.events, e)
			continue
		}
		if !kept(e.Action) {
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc:
			a := t.fresh()
			live[e.Addr] = a
			e.Addr = a
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
			// The address's newest block, whichever of its two free events comes first: the next allocation
			// at the address is what ends the mapping.
			if a, ok := live[e.Addr]; ok {
				e.Addr = a
			}
		}
		t.events = append(t.events, e)
	}
	return t
}

// snapshot returns the trace as a snapshot with s's metadata and tables, its events numbered afresh. Every
// allocation has an address of its own, so its events share few fields: each takes a row of its own.
func (t *trace) snapshot(s *snapshot.Snapshot) *snapshot.Snapshot {
	out := &snapshot.Snapshot{Meta: s.Meta, Strings: s.Strings, Frames: s.Frames, Stacks: s.Stacks}
	out.Events = snapshot.DistinctEventsOf(t.events...)
	return out
}

// block is one allocation of a trace and what happened to it.
type block struct {
	alloc    int // index of its alloc event
	free     int // index of its free_requested event; -1 if never freed
	gradAt   int // index of the event that made it a parameter's gradient (its alloc, or a category event); -1
	cats     uint16
	size     int64 // requested bytes
	internal bool  // a block from before the trace
}

func (b *block) has(c snapshot.Category) bool { return b.cats&(1<<c) != 0 }

// index describes every allocation of t by address.
func (t *trace) index() map[uint64]*block {
	n := 0
	for i := range t.events {
		if t.events[i].Action == snapshot.ActionAlloc {
			n++
		}
	}
	store := make([]block, 0, n) // one allocation for all; the map points into it
	bs := make(map[uint64]*block, n)
	for i := range t.events {
		e := &t.events[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			store = append(store, block{alloc: i, free: -1, gradAt: -1, cats: 1 << e.Category, size: e.Size,
				internal: t.pre != 0 && e.Label == t.pre})
			b := &store[len(store)-1]
			if e.Category == snapshot.CategoryGradient {
				b.gradAt = i
			}
			bs[e.Addr] = b
		case snapshot.ActionCategory:
			if b := bs[e.Addr]; b != nil && e.Category.Valid() {
				b.cats |= 1 << e.Category
				if e.Category == snapshot.CategoryGradient && b.gradAt < 0 {
					b.gradAt = i
				}
			}
		case snapshot.ActionFreeRequested:
			if b := bs[e.Addr]; b != nil && b.free < 0 {
				b.free = i
			}
		}
	}
	return bs
}

// freeEvents returns the free_requested and free_completed events that release block at addr of the given
// sizes, tagged like at.
func freeEvents(at snapshot.Event, addr uint64, size, blockSize int64) [2]snapshot.Event {
	f := snapshot.Event{Time: at.Time, Action: snapshot.ActionFreeRequested, Device: at.Device, Stream: at.Stream,
		Addr: addr, Size: size, BlockSize: blockSize, Phase: at.Phase, Iteration: at.Iteration, Scope: at.Scope}
	c := f
	c.Action = snapshot.ActionFreeCompleted
	return [2]snapshot.Event{f, c}
}

// hasTags reports which of the tags a transformation reads the trace carries: phases on allocations, and
// categories.
func (t *trace) hasTags() (phases, categories bool) {
	for i := range t.events {
		e := &t.events[i]
		if e.Action != snapshot.ActionAlloc || (t.pre != 0 && e.Label == t.pre) {
			continue
		}
		if e.Phase == snapshot.PhaseForward || e.Phase == snapshot.PhaseBackward {
			phases = true
		}
		if e.Category != snapshot.CategoryUnknown {
			categories = true
		}
		if phases && categories {
			break
		}
	}
	return phases, categories
}

// requireTags returns a *MissingTagsError naming what t lacks of phases and categories.
func (t *trace) requireTags(name string, needPhases, needCategories bool) error {
	p, c := t.hasTags()
	switch {
	case needPhases && !p && needCategories && !c:
		return &MissingTagsError{name, "phase and category"}
	case needPhases && !p:
		return &MissingTagsError{name, "phase"}
	case needCategories && !c:
		return &MissingTagsError{name, "category"}
	}
	return nil
}
