package tracer

import "github.com/oomdbg/oomdbg/snapshot"

// summaryBuilder keeps the footer's summary up to date as events are written, so Close needs no second pass.
// Allocated bytes follow PyTorch's allocated_bytes: a block counts from its alloc until its free is requested.
type summaryBuilder struct {
	counts    [snapshot.NumActions]uint64
	events    uint64
	allocated int64
	reserved  int64
	s         snapshot.Summary
}

func (b *summaryBuilder) add(e *snapshot.Event) {
	b.events++
	if e.Action.Valid() {
		b.counts[e.Action]++
	}
	b.s.EndTime = e.Time
	switch e.Action {
	case snapshot.ActionAlloc:
		b.allocated += e.BlockSize
		if b.allocated > b.s.PeakAllocated {
			b.s.PeakAllocated, b.s.PeakAllocatedSeq = b.allocated, e.Seq
		}
	case snapshot.ActionFreeRequested:
		b.allocated -= e.BlockSize
	case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
		b.reserved += e.Size
		b.s.PeakReserved = max(b.s.PeakReserved, b.reserved)
	case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
		b.reserved -= e.Size
	}
}

func (b *summaryBuilder) snapshot() snapshot.Summary {
	s := b.s
	s.Events = b.events
	s.ByAction = make(map[string]uint64)
	for a, n := range b.counts {
		if n > 0 {
			s.ByAction[snapshot.Action(a).String()] = n
		}
	}
	return s
}
