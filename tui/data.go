package tui

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// index is what the panes ask of a snapshot, on top of its timeline.Timeline: memory after every event,
// phase spans and iterations, the peak, the OOM, the live set, retainers and segments at any event. It grows
// as events stream in, in steps whose cost is that of the new events.
//
// A paged run (pages.go) has an overview instead of a Timeline of the whole run, and a Timeline of the window
// of pages around the cursor: what needs the events (the live set, the segments, exact memory) answers inside
// the window, the rest from the overview.
type index struct {
	snap     *snapshot.Snapshot
	tl       *timeline.Timeline // the whole run, or the window of a paged run (nil until one is indexed)
	ov       *overview          // a paged run's; nil when the whole run is held
	win      *window
	loading  bool  // a window is being indexed
	iters    []int // first event of each iteration (setup excluded)
	seen     int   // iteration spans looked at for iters
	peak     int   // first event reaching the highest allocated bytes; -1 if none
	oom      int   // the first OOM event; -1 if none
	capacity int64 // the device's capacity; 0 if unknown, or when the snapshot holds several devices
	usable   int64 // capacity less the CUDA context: what the allocator can use (0: unknown)

	// rebuilt counts the events an importer wrote first for memory allocated before the trace began
	// (snapshot.PreExistingLabel): their order is the importer's, not the program's. after counts, up to 2,
	// the memory events the trace itself recorded after them.
	rebuilt, after int
	scanned        int // the events looked at for rebuilt and after
}

// span is a run of events in one phase of one iteration.
type span struct {
	from, to  int // [from, to)
	phase     snapshot.Phase
	iteration int32
	before    [snapshot.NumCategories]int64 // allocated bytes by category before the span's first event
}

func newIndex(s *snapshot.Snapshot) *index {
	x := &index{snap: s, tl: timeline.New(s), peak: -1, oom: -1}
	x.setCapacity()
	x.refresh()
	return x
}

// newPagedIndex returns the index of a run read page by page.
func newPagedIndex(s *snapshot.Snapshot) *index {
	x := &index{snap: s, ov: &overview{peakAlloc: timeline.Peak{Seq: -1}, peakRes: timeline.Peak{Seq: -1}}, peak: -1, oom: -1}
	x.setCapacity()
	return x
}

// setCapacity takes the capacity of the snapshot's device. Memory on two devices is never one pool: a view
// of several devices has no capacity to draw or judge against (a rank's host memory is not a device's).
func (x *index) setCapacity() {
	var gpus []snapshot.DeviceInfo
	for _, d := range x.snap.Meta.Devices {
		if d.Kind != snapshot.DeviceKindHost {
			gpus = append(gpus, d)
		}
	}
	if len(gpus) == 1 && gpus[0].Capacity > 0 {
		x.capacity, x.usable = gpus[0].Capacity, gpus[0].Capacity-gpus[0].ContextReserve
	}
}

// extendTo indexes the events appended to the snapshot since the last call, up to event end, and returns how
// many it indexed. A paged run is indexed as it is read.
func (x *index) extendTo(end int) int {
	if x.ov != nil {
		return 0
	}
	n := x.tl.UpdateTo(end)
	if n > 0 {
		x.refresh()
	}
	return n
}

// behind returns how many events of the snapshot are not indexed yet.
func (x *index) behind() int {
	if x.ov != nil {
		return 0
	}
	return x.snap.Events.Len() - x.tl.Len()
}

// refresh takes from the timeline, or the overview, what changed since the last call: new iterations, the
// peak, the OOM.
func (x *index) refresh() {
	its, ooms := x.iterations(), x.ooms()
	for ; x.seen < len(its); x.seen++ {
		if it := its[x.seen]; it.Iteration >= 0 {
			x.iters = append(x.iters, it.Start)
		}
	}
	x.peak = x.peakOf(timeline.Allocated).Seq
	if len(ooms) > 0 {
		x.oom = ooms[0]
	}
	x.countRebuilt()
}

// countRebuilt counts the rebuilt events at the start of a run held whole, and the trace's memory events after
// them, up to 2: enough to tell one moment from a trace.
func (x *index) countRebuilt() {
	if x.ov != nil {
		return // oomdbg's own recordings, the only ones paged, rebuild nothing
	}
	s := x.tl.Snapshot()
	for ; x.scanned < x.tl.Len() && x.after < 2; x.scanned++ {
		e := s.Events.At(x.scanned)
		switch {
		case x.scanned == x.rebuilt && s.Reconstructed(&e):
			x.rebuilt++
		case x.rebuilt == 0:
			x.scanned = x.tl.Len() // a recording from its start: nothing was rebuilt
			return
		case !marker(e.Action) && e.Action != snapshot.ActionSnapshot:
			x.after++
		}
	}
}

// singleMoment reports whether the run is one moment, its final state, with the memory before it rebuilt:
// PyTorch's memory_snapshot() without a trace, or a trace of one event.
func (x *index) singleMoment() bool { return x.rebuilt > 0 && x.after <= 1 && x.scanned >= x.len() }

// isRebuilt reports whether event i is one the importer rebuilt.
func (x *index) isRebuilt(i int) bool { return i < x.rebuilt }

func (x *index) iterations() []timeline.IterationSpan {
	if x.ov != nil {
		return x.ov.iterations
	}
	return x.tl.Iterations()
}

func (x *index) ooms() []int {
	if x.ov != nil {
		return x.ov.ooms
	}
	return x.tl.OOMs()
}

func (x *index) peakOf(s timeline.Series) timeline.Peak {
	switch {
	case x.ov == nil:
		return x.tl.Peak(s)
	case s == timeline.Reserved:
		return x.ov.peakRes
	}
	return x.ov.peakAlloc
}

// len returns the number of events.
func (x *index) len() int {
	if x.ov != nil {
		return x.ov.n
	}
	return x.tl.Len()
}

// covers reports whether event i is in memory: always, but for a paged run outside its window.
func (x *index) covers(i int) bool {
	return x.ov == nil || x.tl != nil && i >= x.tl.Base() && i < x.tl.Len()
}

// allocated returns the allocated bytes after event i; outside a paged run's window, the highest of the
// events near it (exact = false).
func (x *index) allocated(i int) int64 {
	if x.covers(i) {
		return x.tl.Allocated(i)
	}
	return x.ov.extent(0, i, i+1).Max
}

func (x *index) reserved(i int) int64 {
	if x.covers(i) {
		return x.tl.Reserved(i)
	}
	return x.ov.extent(1, i, i+1).Max
}

func (x *index) peakReserved() int64 { return x.peakOf(timeline.Reserved).Bytes }

// spans returns the phase spans, in order.
func (x *index) spans() []timeline.PhaseSpan {
	if x.ov != nil {
		return x.ov.phases
	}
	return x.tl.Phases()
}

// spanAt returns the phase span holding event i (a span of no phase if there is none).
func (x *index) spanAt(i int) span {
	spans := x.spans()
	j, found := slices.BinarySearchFunc(spans, i, func(p timeline.PhaseSpan, i int) int {
		switch {
		case i < p.Start:
			return 1
		case i >= p.End:
			return -1
		}
		return 0
	})
	if !found {
		return span{from: 0, to: x.len(), phase: snapshot.PhaseNone, iteration: -1}
	}
	return toSpan(spans[j])
}

// where names the moment of a span as every line of the TUI and the report name it (triage.Where): "iteration
// 2, backward", "setup", "forward, outside any iteration".
func where(sp span) string { return triage.Where(sp.iteration, sp.phase) }

// whereNamed is where of a phase named as the report's fields name it ("backward").
func whereNamed(iteration int32, phase string) string {
	p, ok := snapshot.ParsePhase(phase)
	if !ok {
		return fmt.Sprintf("iteration %d, %s", iteration, phase)
	}
	return triage.Where(iteration, p)
}

func toSpan(p timeline.PhaseSpan) span {
	return span{from: p.Start, to: p.End, phase: p.Phase, iteration: p.Iteration, before: p.Before}
}

// extents returns each column's highest value of series s (-1 for an empty column): peaks are drawn by
// maximum per column, as averaging would hide them. Outside a paged run's window a column is the highest of
// the overview's buckets under it.
func (x *index) extents(s timeline.Series, cols []column) []int64 {
	out := make([]int64, len(cols))
	for c, col := range cols {
		out[c] = -1
		switch {
		case col.from >= col.to:
		case x.covers(col.from) && x.covers(col.to-1):
			out[c] = x.tl.Range(s, col.from, col.to).Max
		case s == timeline.Allocated:
			out[c] = x.ov.extent(0, col.from, col.to).Max
		case s == timeline.Reserved:
			out[c] = x.ov.extent(1, col.from, col.to).Max
		}
	}
	return out
}

// unallocatedMax returns the highest reserved-minus-allocated bytes over events [from, to); outside a paged
// run's window, the highest of the overview's buckets under them.
func (x *index) unallocatedMax(from, to int) int64 {
	if x.covers(from) && x.covers(to-1) {
		return x.tl.UnallocatedMax(from, to)
	}
	return x.ov.unallocated(from, to)
}

// diagnoseOOM says what the request of the OOM event at met (triage.DiagnoseOOM); nothing outside a paged
// run's window.
func (x *index) diagnoseOOM(at int) (kind, diagnosis string) {
	if !x.covers(at) {
		return "", ""
	}
	return triage.DiagnoseOOM(x.tl, at)
}

// liveAt returns the blocks allocated after event at, largest first; nil outside a paged run's window.
func (x *index) liveAt(at int) []timeline.Allocation {
	if !x.covers(at) {
		return nil
	}
	live := x.tl.LiveAt(at, nil)
	slices.SortStableFunc(live, func(a, b timeline.Allocation) int {
		return cmp.Or(cmp.Compare(b.Size, a.Size), cmp.Compare(a.Alloc, b.Alloc))
	})
	return live
}

// liveAtInOrder returns the blocks allocated after event at, in allocation order; nil outside the window.
func (x *index) liveAtInOrder(at int) []timeline.Allocation {
	if !x.covers(at) {
		return nil
	}
	return x.tl.LiveAt(at, nil)
}

// segmentsAt returns the allocator's segments after event at; nil outside a paged run's window.
func (x *index) segmentsAt(at int) []timeline.SegmentState {
	if !x.covers(at) {
		return nil
	}
	return x.tl.SegmentsAt(at)
}

// lastSample returns the last device reading from source at or before event at.
func (x *index) lastSample(at int, source string) (sample, bool) {
	if x.ov != nil {
		ss := x.ov.samples
		i, _ := slices.BinarySearchFunc(ss, at+1, func(s sample, seq int) int { return cmp.Compare(s.seq, seq) })
		for ; i > 0; i-- {
			if x.snap.String(ss[i-1].text) == source {
				return ss[i-1], true
			}
		}
		return sample{}, false
	}
	samples := x.tl.Samples()
	for i, _ := slices.BinarySearch(samples, at+1); i > 0; i-- {
		if e := x.snap.Events.At(samples[i-1]); x.snap.String(e.Text) == source {
			return sample{seq: samples[i-1], bytes: e.Size, text: e.Text}, true
		}
	}
	return sample{}, false
}

// byCategory sums live block bytes per category.
func byCategory(blocks []timeline.Allocation) [snapshot.NumCategories]int64 {
	var sums [snapshot.NumCategories]int64
	for _, b := range blocks {
		if b.Category.Valid() {
			sums[b.Category] = sum(sums[b.Category], b.Size)
		}
	}
	return sums
}

// retainerPath returns the descriptions of the holders that keep block b alive, from the block outwards, as
// the heap dump nearest to event at records them; nil when no heap dump names the block.
func (x *index) retainerPath(b timeline.Allocation, at int) []string {
	if !x.covers(at) {
		return nil
	}
	p, ok := x.tl.RetainerPath(b, at)
	if !ok {
		return nil
	}
	out := make([]string, len(p.Holders))
	for i, h := range p.Holders {
		out[i] = h.Description
	}
	return out
}
