package timeline

import (
	"slices"

	"github.com/oomdbg/oomdbg/internal/addrmap"
	"github.com/oomdbg/oomdbg/snapshot"
)

// The indexing pass: one loop over the events that keeps the running totals, the block table, the spans and
// the checkpoints.

// noSeq marks a block event that has not happened (yet).
const noSeq = ^uint32(0)

// checkpointEvery is the least number of events between two checkpoints of the live set. A checkpoint is
// also at least as many events after the previous one as it holds blocks, so checkpoints never take more
// than 4 bytes an event, and a live-set query replays at most max(checkpointEvery, live blocks) allocations.
const checkpointEvery = 1 << 14

// blockTable holds one entry per allocation, indexed by block ID (allocations in order), as columns.
type blockTable struct {
	alloc []uint32 // seq of the alloc event
	free  []uint32 // seq of free_requested; noSeq while allocated
	done  []uint32 // seq of free_completed; noSeq while active
	size  []int64  // bytes counted: the block size, or the requested size when the trace has none
	cat   []snapshot.Category
	first []int32 // first category change, -1 for none
}

// categoryChange is a category event applied to a live block; changes of one block are linked in order.
type categoryChange struct {
	seq   uint32
	next  int32
	cat   snapshot.Category
	label snapshot.StringID // 0 keeps the label
}

// checkpoint is the set of active blocks after event seq: cpBlocks[start:end], in allocation order.
type checkpoint struct {
	seq        int
	start, end int
}

// liveKey names a block by where it is.
type liveKey struct {
	device int16
	addr   uint64
}

// builder is the state the indexing pass carries from one Update to the next.
type builder struct {
	cur      [numSeries]int64
	catBytes [snapshot.NumCategories]int64
	live     addrmap.Map // active blocks by place
	lastCP   int
	segs     segmentSet
	dump     int // the heap dump that retain events extend, -1 for none
	// The tags of the open spans.
	phase     snapshot.Phase
	iteration int32
	// The previous event's action and place: a free_completed right after the free_requested of a block the
	// trace never allocated is one unmatched free, not two.
	prevAction snapshot.Action
	prevAddr   uint64
}

func (b *builder) init() {
	b.live = addrmap.Map{}
	b.lastCP, b.dump = -1, -1
}

// blockBytes is what an alloc counts: the block size, or the requested size when the trace gives none.
func blockBytes(e *snapshot.Event) int64 {
	if e.BlockSize > 0 {
		return e.BlockSize
	}
	return max(e.Size, 0)
}

// index runs the pass over events [start, end).
func (t *Timeline) index(start, end int) {
	t.reserve(start, end)
	allocated := t.alloc[:end-t.base]
	b := &t.b
	bt := &t.blocks
	cur := b.cur
	var buf [256]snapshot.Event
	prevAction, prevAddr := b.prevAction, b.prevAddr
	for base := start; base < end; base += len(buf) {
		evs := buf[:t.s.Events.Fill(buf[:min(len(buf), end-base)], base)]
		for i := range evs {
			e := &evs[i]
			seq := base + i
			if int(e.Action) < snapshot.NumActions {
				t.byAction[e.Action]++
			}
			if len(t.phases) == 0 || e.Iteration != b.iteration || e.Phase != b.phase && e.Action != snapshot.ActionIteration {
				t.spans(e, seq)
			}

			switch e.Action {
			case snapshot.ActionAlloc:
				cur = t.allocate(e, seq, cur)

			case snapshot.ActionFreeRequested:
				id, ok := b.live.Get(e.Device, e.Addr)
				if !ok {
					t.stats.UnmatchedFrees++
					break
				}
				if bt.free[id] == noSeq {
					bt.free[id] = uint32(seq)
					cur[Allocated] -= bt.size[id]
					b.catBytes[bt.cat[id]] -= bt.size[id]
				}

			case snapshot.ActionFreeCompleted:
				id, ok := b.live.Get(e.Device, e.Addr)
				if !ok {
					if prevAction != snapshot.ActionFreeRequested || prevAddr != e.Addr {
						t.stats.UnmatchedFrees++ // counted once for a requested-and-completed pair
					}
					break
				}
				cur = t.release(id, e, seq, cur)

			case snapshot.ActionCategory:
				t.recategorize(e, seq)

			case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentFree, snapshot.ActionSegmentMap, snapshot.ActionSegmentUnmap:
				t.segEvents = append(t.segEvents, uint32(seq))
				delta, matched := b.segs.apply(e)
				if !matched {
					t.stats.UnmatchedSegmentFrees++
				}
				cur[Reserved] += delta
				t.reserved.set(seq, cur[Reserved])

			case snapshot.ActionOOM:
				t.ooms = append(t.ooms, seq)

			case snapshot.ActionAnnotation:
				t.notes = append(t.notes, seq)

			case snapshot.ActionSample:
				t.samples = append(t.samples, seq)

			case snapshot.ActionHeapDump:
				b.dump = len(t.dumps)
				t.dumps = append(t.dumps, HeapDump{Seq: seq, Reason: t.s.String(e.Text), Phase: e.Phase, Iteration: e.Iteration})

			case snapshot.ActionRetain:
				if b.dump >= 0 {
					d := &t.dumps[b.dump]
					if d.Seq+d.Edges+1 == seq {
						d.Edges++
					}
				}
			}

			allocated[seq-t.base] = cur[Allocated]
			for k := range cur {
				if p := &t.peaks[k]; cur[k] > p.Bytes || p.Seq < 0 {
					p.Bytes, p.Seq = cur[k], seq
				}
			}
			if seq-b.lastCP >= max(checkpointEvery, b.live.Len()) {
				t.checkpoint(seq)
			}
			prevAction, prevAddr = e.Action, e.Addr
		}
	}
	b.cur, b.prevAction, b.prevAddr = cur, prevAction, prevAddr
	if n := len(t.phases); n > 0 {
		t.phases[n-1].End, t.phases[n-1].After = end, b.catBytes
	}
	if n := len(t.iterations); n > 0 {
		t.iterations[n-1].End = end
	}
}

// reserve sizes the columns for the pass over events [start, end): the allocated column for the events the
// snapshot is expected to hold (Events.Cap), or doubled, so that the columns are copied seldom as they grow;
// the block table for the share of allocs so far, or a training loop's mix (an alloc, two frees and a tag
// or two per block).
func (t *Timeline) reserve(start, end int) {
	expect := max(end, t.s.Events.Cap()) - t.base
	if cap(t.alloc) < end-t.base {
		t.alloc = growTo(t.alloc, room(end-t.base, expect, cap(t.alloc)))
	}
	t.alloc = t.alloc[:end-t.base]
	bt := &t.blocks
	if need := len(bt.alloc) + (end-start)/4; cap(bt.alloc) < need {
		share := 0.25
		if start-t.base > 1<<12 {
			share = float64(len(bt.alloc)-len(t.carried)) / float64(start-t.base) * 1.05
		}
		bt.grow(room(need, int(float64(expect)*share), cap(bt.alloc)))
	}
	if need := len(t.changes) + (end-start)/8; cap(t.changes) < need && start-t.base > 1<<12 {
		share := float64(len(t.changes)) / float64(start-t.base) * 1.05
		t.changes = growTo(t.changes, room(need, int(float64(expect)*share), cap(t.changes)))
	}
}

// allocate adds the block alloc event e at seq makes, releasing the one its place held if the trace never
// freed it.
func (t *Timeline) allocate(e *snapshot.Event, seq int, cur [numSeries]int64) [numSeries]int64 {
	b, bt := &t.b, &t.blocks
	if old, ok := b.live.Get(e.Device, e.Addr); ok {
		// The address is handed out again, so the block there was freed without a trace of it.
		if bt.free[old] == noSeq {
			t.stats.ReusedAddresses++
		}
		cur = t.release(old, e, seq, cur)
	}
	size := blockBytes(e)
	cat := e.Category
	if !cat.Valid() {
		cat = snapshot.CategoryUnknown
	}
	id := int32(len(bt.alloc))
	bt.alloc = append(bt.alloc, uint32(seq))
	bt.free = append(bt.free, noSeq)
	bt.done = append(bt.done, noSeq)
	bt.size = append(bt.size, size)
	bt.cat = append(bt.cat, cat)
	bt.first = append(bt.first, -1)
	b.live.Put(e.Device, e.Addr, id)
	cur[Allocated] += size
	cur[Active] += size
	b.catBytes[cat] += size
	return cur
}

// recategorize applies category event e at seq to the live block at its place, and links the change to the
// block's others.
func (t *Timeline) recategorize(e *snapshot.Event, seq int) {
	b, bt := &t.b, &t.blocks
	id, ok := b.live.Get(e.Device, e.Addr)
	if !ok || bt.free[id] != noSeq || !e.Category.Valid() {
		return
	}
	if old := bt.cat[id]; old != e.Category {
		b.catBytes[old] -= bt.size[id]
		b.catBytes[e.Category] += bt.size[id]
		bt.cat[id] = e.Category
	}
	c := int32(len(t.changes))
	t.changes = append(t.changes, categoryChange{seq: uint32(seq), next: -1, cat: e.Category, label: e.Label})
	if l := bt.first[id]; l < 0 {
		bt.first[id] = c
	} else {
		for t.changes[l].next >= 0 { // a block changes category once or twice
			l = t.changes[l].next
		}
		t.changes[l].next = c
	}
}

// release ends block id at seq (event e names its place): its free completed, and was requested if that
// was not recorded.
func (t *Timeline) release(id int32, e *snapshot.Event, seq int, cur [numSeries]int64) [numSeries]int64 {
	b, bt := &t.b, &t.blocks
	if bt.free[id] == noSeq {
		bt.free[id] = uint32(seq)
		cur[Allocated] -= bt.size[id]
		b.catBytes[bt.cat[id]] -= bt.size[id]
	}
	bt.done[id] = uint32(seq)
	cur[Active] -= bt.size[id]
	b.live.Del(e.Device, e.Addr)
	return cur
}

// grow makes room for n blocks in all.
func (bt *blockTable) grow(n int) {
	bt.alloc, bt.free, bt.done = growTo(bt.alloc, n), growTo(bt.free, n), growTo(bt.done, n)
	bt.size, bt.cat, bt.first = growTo(bt.size, n), growTo(bt.cat, n), growTo(bt.first, n)
}

// room returns the capacity for a column that must hold need entries and has have: the entries expected in
// all when they are more, else twice what it has.
func room(need, expect, have int) int {
	if expect >= need {
		return expect
	}
	return max(need, 2*have)
}

// growTo returns s with room for n elements in all, allocating exactly that when it has less.
func growTo[S ~[]E, E any](s S, n int) S {
	if cap(s) >= n {
		return s
	}
	out := make(S, len(s), n)
	copy(out, s)
	return out
}

// spans opens a new iteration or phase span when event e starts one. It runs before e is applied, so a
// span's Before holds the bytes before its first event.
func (t *Timeline) spans(e *snapshot.Event, seq int) {
	if n := len(t.iterations); n == 0 || t.iterations[n-1].Iteration != e.Iteration {
		if n > 0 {
			t.iterations[n-1].End = seq
		}
		t.iterations = append(t.iterations, IterationSpan{Iteration: e.Iteration, Start: seq, End: seq + 1})
	}
	// An iteration marker carries the new iteration but still the previous phase: it opens no phase span.
	n := len(t.phases)
	if n > 0 && (e.Action == snapshot.ActionIteration || t.phases[n-1].Phase == e.Phase && t.phases[n-1].Iteration == e.Iteration) {
		return
	}
	if n > 0 {
		t.phases[n-1].End, t.phases[n-1].After = seq, t.b.catBytes
	}
	t.phases = append(t.phases, PhaseSpan{Phase: e.Phase, Iteration: e.Iteration, Start: seq, End: seq + 1, Before: t.b.catBytes})
	t.b.phase, t.b.iteration = e.Phase, e.Iteration
}

// checkpoint records the active blocks after event seq.
func (t *Timeline) checkpoint(seq int) {
	start := len(t.cpBlocks)
	t.cpBlocks = t.b.live.AppendValues(t.cpBlocks)
	slices.Sort(t.cpBlocks[start:]) // allocation order
	t.checkpoints = append(t.checkpoints, checkpoint{seq: seq, start: start, end: len(t.cpBlocks)})
	t.b.lastCP = seq
}
