package tui

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// index is what the panes ask of a snapshot, on top of its timeline.Timeline: memory after every event,
// phase spans and iterations, the peak, the OOM, the live set, retainers and segments at any event. It grows
// as events stream in, in steps whose cost is that of the new events.
type index struct {
	snap     *snapshot.Snapshot
	tl       *timeline.Timeline
	iters    []int // first event of each iteration (setup excluded)
	seen     int   // iteration spans looked at for iters
	peak     int   // first event reaching the highest allocated bytes; -1 if none
	oom      int   // the first OOM event; -1 if none
	capacity int64 // device capacity, 0 if unknown
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
func (x *index) extend() { x.extendTo(x.snap.Events.Len()) }

// extendTo indexes the events appended to the snapshot since the last call, up to event end, and returns how
// many it indexed.
func (x *index) extendTo(end int) int {
	n := x.tl.UpdateTo(end)
	if n > 0 {
		x.refresh()
	}
	return n
}

// behind returns how many events of the snapshot are not indexed yet.
func (x *index) behind() int { return x.snap.Events.Len() - x.tl.Len() }

// refresh takes from the timeline what changed since the last call: new iterations, the peak, the OOM.
func (x *index) refresh() {
	its := x.tl.Iterations()
	for ; x.seen < len(its); x.seen++ {
		if it := its[x.seen]; it.Iteration >= 0 {
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

// spans returns the phase spans, in order.
func (x *index) spans() []timeline.PhaseSpan { return x.tl.Phases() }

// spanAt returns the phase span holding event i (a span of no phase if there is none).
func (x *index) spanAt(i int) span {
	j := x.tl.PhaseAt(i)
	if j < 0 {
		return span{from: 0, to: x.len(), phase: snapshot.PhaseNone, iteration: -1}
	}
	return toSpan(x.tl.Phases()[j])
}

func toSpan(p timeline.PhaseSpan) span {
	return span{from: p.Start, to: p.End, phase: p.Phase, iteration: p.Iteration, before: p.Before}
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
