package tui

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// index is what the panes ask of a snapshot, on top of its timeline.Timeline: memory after every event,
// phase spans and iterations, the peak, the OOM, the live set, retainers and segments at any event. It grows
// as events stream in.
type index struct {
	snap     *snapshot.Snapshot
	tl       *timeline.Timeline
	spans    []span // phase spans, in order
	iters    []int  // first event of each iteration (setup excluded)
	peak     int    // first event reaching the highest allocated bytes; -1 if none
	oom      int    // the first OOM event; -1 if none
	capacity int64  // device capacity, 0 if unknown
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
	for _, d := range s.Meta.Devices {
		x.capacity += d.Capacity
	}
	x.refresh()
	return x
}

// extend indexes the events appended to the snapshot since the last call.
func (x *index) extend() {
	x.tl.Update()
	x.refresh()
}

// refresh copies what the panes need from the timeline.
func (x *index) refresh() {
	x.spans = x.spans[:0]
	for _, p := range x.tl.Phases() {
		x.spans = append(x.spans, span{from: p.Start, to: p.End, phase: p.Phase, iteration: p.Iteration, before: p.Before})
	}
	x.iters = x.iters[:0]
	for _, it := range x.tl.Iterations() {
		if it.Iteration >= 0 {
			x.iters = append(x.iters, it.Start)
		}
	}
	x.peak = x.tl.Peak(timeline.Allocated).Seq
	if ooms := x.tl.OOMs(); len(ooms) > 0 {
		x.oom = ooms[0]
	}
}

// len returns the number of events.
func (x *index) len() int { return x.tl.Len() }

func (x *index) allocated(i int) int64 { return x.tl.Allocated(i) }
func (x *index) reserved(i int) int64  { return x.tl.Reserved(i) }
func (x *index) peakReserved() int64   { return x.tl.Peak(timeline.Reserved).Bytes }

// spanAt returns the phase span holding event i (a span of no phase if there is none).
func (x *index) spanAt(i int) span {
	j, found := slices.BinarySearchFunc(x.spans, i, func(s span, i int) int {
		if i < s.from {
			return 1
		}
		if i >= s.to {
			return -1
		}
		return 0
	})
	if !found {
		return span{from: 0, to: x.len(), phase: snapshot.PhaseNone, iteration: -1}
	}
	return x.spans[j]
}

// liveAt returns the blocks allocated after event at, largest first.
func (x *index) liveAt(at int) []timeline.Allocation {
	live := x.tl.LiveAt(at, nil)
	slices.SortStableFunc(live, func(a, b timeline.Allocation) int {
		return cmp.Or(cmp.Compare(b.Size, a.Size), cmp.Compare(a.Alloc, b.Alloc))
	})
	return live
}

// byCategory sums live block bytes per category.
func byCategory(blocks []timeline.Allocation) [snapshot.NumCategories]int64 {
	var sums [snapshot.NumCategories]int64
	for _, b := range blocks {
		if b.Category.Valid() {
			sums[b.Category] += b.Size
		}
	}
	return sums
}

// retainerPath returns the descriptions of the holders that keep block b alive, from the block outwards, as
// the heap dump nearest to event at records them; nil when no heap dump names the block.
func (x *index) retainerPath(b timeline.Allocation, at int) []string {
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
