package timeline

import (
	"slices"
	"unsafe"

	"github.com/oomdbg/oomdbg/internal/addrmap"
	"github.com/oomdbg/oomdbg/snapshot"
)

// State is where the indexing pass stands after an event: the running totals, the blocks active then with
// what they held, the allocator's segments, the tags of the open spans. It costs what is alive, whatever the
// length of the run before it.
//
// A Timeline resumed from a State indexes the events after it as the Timeline of the whole run would, and
// holds memory for those events only: a run too long to index whole is indexed page by page, each page's
// Timeline resumed from the State the previous one ended in, and any page can be indexed again later from
// the State kept at its start.
type State struct {
	seq        int
	cur        [numSeries]int64
	catBytes   [snapshot.NumCategories]int64
	live       []Allocation // active blocks, in allocation order, with their category and label then
	segs       []segRange
	phase      snapshot.Phase
	iteration  int32
	prevAction snapshot.Action
	prevAddr   uint64
}

// Seq returns the first event a Timeline resumed from the State indexes.
func (st *State) Seq() int { return st.seq }

// Allocated returns the allocated bytes before Seq.
func (st *State) Allocated() int64 { return st.cur[Allocated] }

// Live returns the blocks active before Seq, in allocation order. The slice is the State's own: do not modify
// it.
func (st *State) Live() []Allocation { return st.live }

// Bytes returns the memory the State holds, in bytes.
func (st *State) Bytes() int64 {
	return int64(cap(st.live))*int64(unsafe.Sizeof(Allocation{})) + int64(cap(st.segs))*int64(unsafe.Sizeof(segRange{})) +
		int64(unsafe.Sizeof(*st))
}

// State returns the State after the last event indexed.
func (t *Timeline) State() State {
	b := &t.b
	st := State{seq: t.n, cur: b.cur, catBytes: b.catBytes, segs: slices.Clone(b.segs.segs), phase: b.phase,
		iteration: b.iteration, prevAction: b.prevAction, prevAddr: b.prevAddr}
	if t.n > 0 {
		st.live = t.ActiveAt(t.n-1, nil)
	}
	return st
}

// Resume returns a Timeline of the events of s from st.Seq() on, as if it had indexed those before it. s must
// hold them: s.Events.Base() <= st.Seq(). Its queries answer for events from st.Seq() on; its spans, heap
// dumps, peaks and stats are those of the events it indexed. Allocation IDs number the blocks active at
// st.Seq() first, then those allocated after.
func Resume(s *snapshot.Snapshot, st State) *Timeline {
	t := &Timeline{s: s, base: st.seq, n: st.seq}
	t.b.init()
	b, bt := &t.b, &t.blocks
	b.cur, b.catBytes, b.phase, b.iteration = st.cur, st.catBytes, st.phase, st.iteration
	b.prevAction, b.prevAddr = st.prevAction, st.prevAddr
	b.segs.segs = slices.Clone(st.segs)
	b.lastCP = st.seq - 1
	t.startSegs = slices.Clone(st.segs)
	t.carried = slices.Clone(st.live)
	bt.grow(len(st.live))
	b.live = addrmap.Map{}
	for i, a := range st.live {
		free := noSeq
		if a.Free >= 0 {
			free = uint32(a.Free)
		}
		bt.alloc = append(bt.alloc, uint32(a.Alloc))
		bt.free = append(bt.free, free)
		bt.done = append(bt.done, noSeq)
		bt.size = append(bt.size, a.Size)
		bt.cat = append(bt.cat, a.Category)
		bt.first = append(bt.first, -1)
		b.live.Put(a.Device, a.Addr, int32(i))
		t.carried[i].ID, t.carried[i].Released = i, -1
	}
	if st.seq > 0 {
		t.reserved.set(st.seq-1, st.cur[Reserved])
	}
	for i := range t.peaks {
		t.peaks[i].Seq = -1
	}
	t.Update()
	return t
}
