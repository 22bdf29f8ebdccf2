// Package timeline indexes a snapshot's events for the questions a memory debugger asks at any event: the
// allocated, reserved and active bytes after it and their peaks, the phase and iteration it belongs to, the
// blocks alive then with what they held and who retained them, and the allocator's segments. The events and
// their tables live in package snapshot; this package reads them and keeps only what answers the queries.
package timeline

import (
	"iter"
	"math"
	"slices"
	"sort"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Timeline indexes a snapshot for the questions a memory debugger asks at any event: how many bytes were
// allocated, reserved and active after it; where the peak is; which phase and iteration it belongs to; which
// blocks were alive, what they held and who retained them; what the allocator's segments looked like.
//
// New builds it in one pass over the events and Update indexes events appended to the snapshot since
// (a recording being followed). Memory is bounded per event and holds no per-event heap objects: allocated
// bytes after every event (8 bytes an event) and their min/max pyramid (about 1 byte), reserved bytes where
// they change, a table of 25 bytes per allocation and 16 per category change, and checkpoints of the live set
// that take at most 4 bytes an event: about 17 bytes an event for a training loop. Queries that need the live
// set start from the nearest checkpoint, so they cost what is alive plus what was allocated since the
// checkpoint, whatever the length of the snapshot.
//
// Accounting follows PyTorch's memory_stats: allocated bytes count a block's size from its alloc until its
// free is requested, active bytes until the free completes, reserved bytes the segments (cudaMalloc'd or
// mapped) the allocator holds. Frees of blocks allocated before the trace began, as in imported PyTorch
// snapshots, are counted in Stats and otherwise ignored, so no total ever goes negative.
//
// A Timeline indexes at most MaxEvents events. Queries do not change it and may run concurrently;
// Update must not run concurrently with queries.
type Timeline struct {
	s    *snapshot.Snapshot
	base int // the first event indexed: 0 but for a Timeline resumed from a State
	n    int // the event after the last indexed

	// carried are the blocks active before base, IDs 0 to len-1, with their category and label as of base;
	// startSegs the allocator's segments then.
	carried   []Allocation
	startSegs []segRange

	alloc    []int64 // allocated bytes after each event, from base on
	allocPyr pyramid
	reserved steps

	blocks  blockTable
	changes []categoryChange

	checkpoints []checkpoint
	cpBlocks    []int32 // the checkpoints' block IDs, one run per checkpoint

	phases     []PhaseSpan
	iterations []IterationSpan
	dumps      []HeapDump
	ooms       []int
	notes      []int // annotation events
	samples    []int // sample events
	segEvents  []uint32

	peaks    [numSeries]Peak
	byAction [snapshot.NumActions]int
	stats    Stats

	b builder // the state of the pass, kept for Update
}

// MaxEvents is the most events a Timeline indexes; events past it are left out.
const MaxEvents = math.MaxUint32 - 1

// Series names one of the byte counts a Timeline keeps for every event.
type Series uint8

// The series.
const (
	// Allocated is PyTorch's memory_allocated: block bytes from alloc until free_requested.
	Allocated Series = iota
	// Reserved is memory_reserved: the bytes of the segments the allocator holds.
	Reserved
	// Active is active_bytes: block bytes from alloc until free_completed.
	Active
	numSeries
)

var seriesNames = [...]string{"allocated", "reserved", "active"}

// String returns the series' name, e.g. "allocated".
func (s Series) String() string {
	if int(s) < len(seriesNames) {
		return seriesNames[s]
	}
	return "series(?)"
}

// Peak is the highest value of a series and the first event after which it was reached.
type Peak struct {
	Bytes int64
	Seq   int // -1 when no event was indexed
}

// PhaseSpan is a run of events in one phase of one iteration, [Start, End).
type PhaseSpan struct {
	Phase     snapshot.Phase
	Iteration int32
	Start     int
	End       int
	// Before and After are the allocated bytes by category before the span's first event and after its
	// last.
	Before, After [snapshot.NumCategories]int64
}

// IterationSpan is the run of events of one training iteration, [Start, End). Setup is iteration -1. A
// snapshot without iteration tags (an imported trace) is one span.
type IterationSpan struct {
	Iteration int32
	Start     int
	End       int
}

// HeapDump is a point where the runtime recorded who retains each live tensor: the heap_dump event at Seq,
// followed by Edges retain events.
type HeapDump struct {
	Seq       int
	Reason    string // "iteration end", "oom", "interrupted", ...
	Phase     snapshot.Phase
	Iteration int32
	Edges     int
}

// Stats counts what a Timeline indexed.
type Stats struct {
	Events   int
	ByAction [snapshot.NumActions]int // events per snapshot.Action
	Blocks   int                      // allocations
	// UnmatchedFrees counts free events of blocks the trace never allocated (allocated before it began);
	// UnmatchedSegmentFrees the same for segments.
	UnmatchedFrees        int
	UnmatchedSegmentFrees int
	// ReusedAddresses counts allocations at the address of a block whose free was never recorded; the old
	// block is taken as freed there.
	ReusedAddresses int
}

// New indexes the events of s. The Timeline keeps s: queries read the events and tables from it.
func New(s *snapshot.Snapshot) *Timeline {
	t := &Timeline{s: s}
	t.b.init()
	for i := range t.peaks {
		t.peaks[i].Seq = -1
	}
	t.Update()
	return t
}

// Update indexes the events appended to the snapshot since the last call (or New) and returns how
// many there were.
func (t *Timeline) Update() int { return t.UpdateTo(t.s.Events.Len()) }

// UpdateTo indexes the events appended to the snapshot since the last call, up to event end (exclusive), and
// returns how many there were: a program that must stay responsive indexes a long snapshot in steps.
func (t *Timeline) UpdateTo(end int) int {
	end = min(end, t.s.Events.Len(), min(MaxEvents, math.MaxInt))
	if end <= t.n {
		return 0
	}
	start, changes := t.n, len(t.reserved.val)
	t.index(start, end)
	t.allocPyr.extend(t.alloc, start-t.base)
	t.reserved.extend(max(changes-1, 0))
	t.n = end
	return end - start
}

// Snapshot returns the snapshot the Timeline indexes.
func (t *Timeline) Snapshot() *snapshot.Snapshot { return t.s }

// Len returns the event after the last indexed: the number of events indexed, from Base on.
func (t *Timeline) Len() int { return t.n }

// Base returns the first event indexed: 0 but for a Timeline resumed from a State. Queries about events
// before it answer as for no event.
func (t *Timeline) Base() int { return t.base }

// Value returns the bytes of series s after event seq; 0 for a seq outside the indexed events. Active bytes
// are counted from the live blocks: a query costs what LiveAt costs.
func (t *Timeline) Value(s Series, seq int) int64 {
	if seq < t.base || seq >= t.n {
		return 0
	}
	switch s {
	case Allocated:
		return t.alloc[seq-t.base]
	case Reserved:
		return t.reserved.at(seq)
	case Active:
		var pending int64
		t.eachCandidate(seq, func(id int32) {
			if f, d := t.blocks.free[id], t.blocks.done[id]; f != noSeq && int(f) <= seq && (d == noSeq || int(d) > seq) {
				pending += t.blocks.size[id]
			}
		})
		return t.alloc[seq-t.base] + pending
	}
	return 0
}

// Allocated returns the allocated bytes after event seq.
func (t *Timeline) Allocated(seq int) int64 { return t.Value(Allocated, seq) }

// Reserved returns the reserved bytes after event seq.
func (t *Timeline) Reserved(seq int) int64 { return t.Value(Reserved, seq) }

// Active returns the active bytes after event seq.
func (t *Timeline) Active(seq int) int64 { return t.Value(Active, seq) }

// Allocations returns allocated bytes after every event, indexed by seq - Base. The slice is the Timeline's
// own: do not modify it.
func (t *Timeline) Allocations() []int64 { return t.alloc[: t.n-t.base : t.n-t.base] }

// Steps yields, for events [from, to), the first event and every event after which series s changes, with
// its value then: a counter track's points. Allocated and Reserved only.
func (t *Timeline) Steps(s Series, from, to int) iter.Seq2[int, int64] {
	from, to = max(from, t.base), min(to, t.n)
	switch s {
	case Allocated:
		return func(yield func(int, int64) bool) {
			a := t.alloc[:to-t.base]
			for seq := from; seq < to; seq++ {
				if v := a[seq-t.base]; (seq == from || v != a[seq-t.base-1]) && !yield(seq, v) {
					return
				}
			}
		}
	case Reserved:
		return t.reserved.changes(from, to)
	}
	return func(func(int, int64) bool) {}
}

// Peak returns the highest value of series s and the first event after which it was reached.
func (t *Timeline) Peak(s Series) Peak {
	if s >= numSeries {
		return Peak{Seq: -1}
	}
	return t.peaks[s]
}

// PeakIn returns the highest value of series s over events [from, to) and the first event that reached it;
// Allocated and Reserved only.
func (t *Timeline) PeakIn(s Series, from, to int) Peak {
	from, to = max(from, t.base), min(to, t.n)
	if from >= to {
		return Peak{Seq: -1}
	}
	switch s {
	case Allocated:
		i, v := t.allocPyr.firstMax(t.alloc, from-t.base, to-t.base)
		return Peak{Bytes: v, Seq: t.base + i}
	case Reserved:
		seq, v := t.reserved.firstMax(from, to)
		return Peak{Bytes: v, Seq: seq}
	}
	return Peak{Seq: -1}
}

// Phases returns the phase spans in order. The slice is the Timeline's own: do not modify it.
func (t *Timeline) Phases() []PhaseSpan { return t.phases }

// Iterations returns the iteration spans in order. The slice is the Timeline's own: do not modify it.
func (t *Timeline) Iterations() []IterationSpan { return t.iterations }

// PhaseAt returns the index in Phases of the span holding event seq, or -1.
func (t *Timeline) PhaseAt(seq int) int {
	return spanAt(t.phases, seq, func(p PhaseSpan) (int, int) { return p.Start, p.End })
}

// IterationAt returns the index in Iterations of the span holding event seq, or -1.
func (t *Timeline) IterationAt(seq int) int {
	return spanAt(t.iterations, seq, func(p IterationSpan) (int, int) { return p.Start, p.End })
}

// spanAt returns the index of the span of spans, sorted and apart, whose [start, end) holds seq, or -1.
func spanAt[S any](spans []S, seq int, bounds func(S) (int, int)) int {
	i, ok := slices.BinarySearchFunc(spans, seq, func(p S, seq int) int {
		start, end := bounds(p)
		switch {
		case seq < start:
			return 1
		case seq >= end:
			return -1
		}
		return 0
	})
	if !ok {
		return -1
	}
	return i
}

// HeapDumps returns the heap dumps in order. The slice is the Timeline's own: do not modify it.
func (t *Timeline) HeapDumps() []HeapDump { return t.dumps }

// OOMs returns the seqs of the oom events. The slice is the Timeline's own: do not modify it.
func (t *Timeline) OOMs() []int { return t.ooms }

// Annotations returns the seqs of the annotation events. The slice is the Timeline's own: do not modify it.
func (t *Timeline) Annotations() []int { return t.notes }

// Samples returns the seqs of the sample events (device readings). The slice is the Timeline's own: do not
// modify it.
func (t *Timeline) Samples() []int { return t.samples }

// Stats returns what the Timeline indexed.
func (t *Timeline) Stats() Stats {
	st := t.stats
	st.Events = t.n - t.base
	st.ByAction = t.byAction
	st.Blocks = len(t.blocks.alloc)
	return st
}

// SeqAtTime returns the first event whose Time is at least ns (Len if none). Event times never decrease.
func (t *Timeline) SeqAtTime(ns int64) int {
	return t.base + sort.Search(t.n-t.base, func(i int) bool { return t.s.Events.Time(t.base+i) >= ns })
}

// Bytes returns the memory the Timeline holds, in bytes: its columns' capacity, and the spans and lists it
// keeps. It leaves out the snapshot it indexes.
func (t *Timeline) Bytes() int64 {
	bt := &t.blocks
	n := 8*cap(t.alloc) + t.allocPyr.bytes() + 12*cap(t.reserved.seq) + t.reserved.pyr.bytes() +
		4*(cap(bt.alloc)+cap(bt.free)+cap(bt.done)+cap(bt.first)) + 8*cap(bt.size) + cap(bt.cat) +
		16*cap(t.changes) + 24*cap(t.checkpoints) + 4*cap(t.cpBlocks) +
		int(unsafe.Sizeof(PhaseSpan{}))*cap(t.phases) + int(unsafe.Sizeof(IterationSpan{}))*cap(t.iterations) +
		int(unsafe.Sizeof(HeapDump{}))*cap(t.dumps) + 8*(cap(t.ooms)+cap(t.notes)+cap(t.samples)) + 4*cap(t.segEvents)
	return int64(n)
}
