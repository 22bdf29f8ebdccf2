package timeline

import (
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Allocation is one allocation: where it is, what it holds and when it lived. Its tags are those of its alloc
// event, with category and label as of the event the query asked about (a temporary that autograd saved is
// an activation from then on).
type Allocation struct {
	ID       int // the allocation's index, in allocation order
	Alloc    int // seq of the alloc event
	Free     int // seq of the free_requested event; -1 if not freed by the last indexed event
	Released int // seq of the free_completed event; -1 if not released by the last indexed event

	Device    int16
	Stream    int64
	Addr      uint64
	Requested int64 // the caller's size
	Size      int64 // the block's size: what allocated bytes count

	Category  snapshot.Category
	Label     snapshot.StringID
	Scope     snapshot.StringID
	Stack     snapshot.StackID
	Phase     snapshot.Phase // of the alloc
	Iteration int32          // of the alloc
}

// AllocatedAt reports whether the block counts in allocated bytes after event seq.
func (b *Allocation) AllocatedAt(seq int) bool { return b.Alloc <= seq && (b.Free < 0 || b.Free > seq) }

// NumAllocations returns the number of allocations indexed.
func (t *Timeline) NumAllocations() int { return len(t.blocks.alloc) }

// Allocation returns allocation id with its category and label as of event at.
func (t *Timeline) Allocation(id, at int) Allocation {
	return t.block(int32(id), at)
}

func seqOrNone(s uint32) int {
	if s == noSeq {
		return -1
	}
	return int(s)
}

func (t *Timeline) block(id int32, at int) Allocation {
	bt := &t.blocks
	if int(id) < len(t.carried) {
		b := t.carried[id]
		b.Free, b.Released = seqOrNone(bt.free[id]), seqOrNone(bt.done[id])
		t.applyChanges(&b, id, at)
		return b
	}
	ev := t.s.Events.At(int(bt.alloc[id]))
	e := &ev
	b := Allocation{
		ID: int(id), Alloc: int(bt.alloc[id]), Free: seqOrNone(bt.free[id]), Released: seqOrNone(bt.done[id]),
		Device: e.Device, Stream: e.Stream, Addr: e.Addr, Requested: e.Size, Size: bt.size[id],
		Category: e.Category, Label: e.Label, Scope: e.Scope, Stack: e.Stack, Phase: e.Phase, Iteration: e.Iteration,
	}
	if !b.Category.Valid() {
		b.Category = snapshot.CategoryUnknown
	}
	t.applyChanges(&b, id, at)
	return b
}

// applyChanges sets b's category and label to those block id had after event at.
func (t *Timeline) applyChanges(b *Allocation, id int32, at int) {
	for c := t.blocks.first[id]; c >= 0 && int(t.changes[c].seq) <= at; c = t.changes[c].next {
		b.Category = t.changes[c].cat
		if l := t.changes[c].label; l != 0 {
			b.Label = l
		}
	}
}

// LiveAt appends to dst the blocks allocated after event seq, in allocation order: the blocks whose Size
// sums to Allocated(seq).
func (t *Timeline) LiveAt(seq int, dst []Allocation) []Allocation {
	return t.liveAt(seq, dst, t.blocks.free)
}

// ActiveAt appends to dst the blocks active after event seq, in allocation order: LiveAt and the blocks
// whose free was requested but has not completed. Their Size sums to Active(seq).
func (t *Timeline) ActiveAt(seq int, dst []Allocation) []Allocation {
	return t.liveAt(seq, dst, t.blocks.done)
}

// liveAt appends the blocks allocated at or before seq whose end (free or done) is after seq.
func (t *Timeline) liveAt(seq int, dst []Allocation, ends []uint32) []Allocation {
	if seq < t.base-1 || seq < 0 || t.n == t.base {
		return dst
	}
	seq = min(seq, t.n-1)
	t.eachCandidate(seq, func(id int32) {
		if e := ends[id]; e == noSeq || int(e) > seq {
			dst = append(dst, t.block(id, seq))
		}
	})
	return dst
}

// eachCandidate calls f, in allocation order, with every block that may be active after event seq: those
// of the nearest checkpoint at or before seq and those allocated since, up to seq.
func (t *Timeline) eachCandidate(seq int, f func(id int32)) {
	first := int32(0)
	i, _ := slices.BinarySearchFunc(t.checkpoints, seq, func(c checkpoint, seq int) int {
		if c.seq <= seq {
			return -1
		}
		return 1
	})
	if i > 0 {
		cp := t.checkpoints[i-1]
		for _, id := range t.cpBlocks[cp.start:cp.end] {
			f(id)
		}
		first = t.firstAllocAfter(cp.seq)
	}
	last := t.firstAllocAfter(seq)
	for id := first; id < last; id++ {
		f(id)
	}
}

// firstAllocAfter returns the first block allocated after event seq.
func (t *Timeline) firstAllocAfter(seq int) int32 {
	i, _ := slices.BinarySearch(t.blocks.alloc, uint32(seq)+1)
	return int32(i)
}

// AllocationAt returns the allocation allocated at (device, addr) after event seq, if any.
func (t *Timeline) AllocationAt(device int16, addr uint64, seq int) (Allocation, bool) {
	if seq < t.base-1 || seq < 0 || t.n == t.base {
		return Allocation{}, false
	}
	seq = min(seq, t.n-1)
	found := int32(-1)
	t.eachCandidate(seq, func(id int32) {
		if e := t.blocks.done[id]; e != noSeq && int(e) <= seq {
			return
		}
		var d int16
		var a uint64
		if int(id) < len(t.carried) {
			d, a = t.carried[id].Device, t.carried[id].Addr
		} else {
			ev := t.s.Events.At(int(t.blocks.alloc[id]))
			d, a = ev.Device, ev.Addr
		}
		if a == addr && d == device {
			found = id
		}
	})
	if found < 0 {
		return Allocation{}, false
	}
	return t.block(found, seq), true
}

// Change is what happened to memory between two events.
type Change struct {
	// Allocated are the blocks allocated since the first event and still allocated after the second, with
	// their category as of the second.
	Allocated []Allocation
	// Freed are the blocks that were allocated after the first event and were freed by the second, with
	// their category as of their free.
	Freed []Allocation
	// Transient counts the blocks allocated and freed in between, and TransientBytes their bytes.
	Transient      int
	TransientBytes int64
}

// Changes returns what changed from after event from to after event to (from < to).
func (t *Timeline) Changes(from, to int) Change {
	var c Change
	if t.n == t.base {
		return c
	}
	from, to = max(from, t.base-1), min(to, t.n-1)
	if from >= to {
		return c
	}
	bt := &t.blocks
	t.eachCandidate(from, func(id int32) {
		if f := bt.free[id]; f != noSeq && int(f) > from && int(f) <= to {
			c.Freed = append(c.Freed, t.block(id, int(f)-1))
		}
	})
	for id := t.firstAllocAfter(from); id < t.firstAllocAfter(to); id++ {
		switch f := bt.free[id]; {
		case f == noSeq || int(f) > to:
			c.Allocated = append(c.Allocated, t.block(id, to))
		default:
			c.Transient++
			c.TransientBytes += bt.size[id]
		}
	}
	return c
}

// CategoryBytes returns the bytes of blocks by category.
func CategoryBytes(blocks []Allocation) [snapshot.NumCategories]int64 {
	var by [snapshot.NumCategories]int64
	for i := range blocks {
		by[blocks[i].Category] += blocks[i].Size
	}
	return by
}
