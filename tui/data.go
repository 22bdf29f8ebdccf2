package tui

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// index is what the panes ask of a snapshot: memory after every event, phase spans, the peak, the OOM, the
// live set and retainers at any event. It grows as events stream in.
type index struct {
	snap      *snapshot.Snapshot
	allocated []int64 // memory_allocated after each event
	reserved  []int64 // memory_reserved after each event
	spans     []span  // phase spans, in order
	iters     []int   // first event of each iteration marker
	peak      int     // first event reaching the highest allocated bytes; -1 if none
	oom       int     // the OOM event; -1 if none
	capacity  int64   // device capacity, 0 if unknown
	context   int64   // CUDA-context reserve

	live map[blockKey]int // blocks alive after the last event: address -> alloc event
}

// span is a run of events in one phase of one iteration.
type span struct {
	from, to  int // [from, to)
	phase     snapshot.Phase
	iteration int32
}

type blockKey struct {
	device int16
	addr   uint64
}

func newIndex(s *snapshot.Snapshot) *index {
	x := &index{snap: s, peak: -1, oom: -1, live: map[blockKey]int{}}
	for _, d := range s.Meta.Devices {
		x.capacity += d.Capacity
		x.context += d.ContextReserve
	}
	x.extend()
	return x
}

// extend indexes the events appended to the snapshot since the last call.
func (x *index) extend() {
	evs := x.snap.Events
	var alloc, res int64
	if n := len(x.allocated); n > 0 {
		alloc, res = x.allocated[n-1], x.reserved[n-1]
	}
	for i := len(x.allocated); i < len(evs); i++ {
		e := &evs[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			alloc += e.BlockSize
			x.live[blockKey{e.Device, e.Addr}] = i
		case snapshot.ActionFreeRequested:
			if _, ok := x.live[blockKey{e.Device, e.Addr}]; ok { // a block from before the trace is not counted
				alloc -= e.BlockSize
				delete(x.live, blockKey{e.Device, e.Addr})
			}
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			res += e.Size
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			res = max(res-e.Size, 0)
		case snapshot.ActionOOM:
			if x.oom < 0 {
				x.oom = i
			}
		case snapshot.ActionPhase:
			x.openSpan(i, e.Phase, e.Iteration)
		case snapshot.ActionIteration:
			x.iters = append(x.iters, i)
		}
		x.allocated = append(x.allocated, alloc)
		x.reserved = append(x.reserved, res)
		if x.peak < 0 || alloc > x.allocated[x.peak] {
			x.peak = i
		}
	}
	if n := len(x.spans); n > 0 {
		x.spans[n-1].to = len(evs)
	}
}

func (x *index) openSpan(at int, p snapshot.Phase, it int32) {
	if n := len(x.spans); n > 0 {
		x.spans[n-1].to = at
	} else if at > 0 {
		x.spans = append(x.spans, span{from: 0, to: at, phase: snapshot.PhaseNone, iteration: -1})
	}
	x.spans = append(x.spans, span{from: at, to: at + 1, phase: p, iteration: it})
}

// len returns the number of events.
func (x *index) len() int { return len(x.allocated) }

// spanAt returns the phase span holding event i (the zero span if there are no markers).
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
	if !found || j >= len(x.spans) {
		return span{from: 0, to: x.len(), phase: snapshot.PhaseNone, iteration: -1}
	}
	return x.spans[j]
}

// columns returns, for width columns over events [from, to), the highest allocated and reserved bytes of each
// column. Peaks are drawn by maximum per column: averaging would hide them.
func (x *index) columns(from, to, width int) (alloc, res []int64) {
	alloc, res = make([]int64, width), make([]int64, width)
	n := to - from
	if n <= 0 || width <= 0 {
		return alloc, res
	}
	for c := range width {
		a, b := from+c*n/width, from+(c+1)*n/width
		if b <= a {
			b = a + 1
		}
		if a >= to {
			alloc[c], res[c] = -1, -1 // past the data (fewer events than columns)
			continue
		}
		alloc[c], res[c] = slices.Max(x.allocated[a:min(b, to)]), slices.Max(x.reserved[a:min(b, to)])
	}
	return alloc, res
}

// liveBlock is a block alive at some event.
type liveBlock struct {
	alloc    int // the alloc event
	addr     uint64
	device   int16
	size     int64 // block bytes
	category snapshot.Category
}

// liveAt returns the blocks alive after event at, largest first.
func (x *index) liveAt(at int) []liveBlock {
	live := map[blockKey]*liveBlock{}
	evs := x.snap.Events[:at+1]
	for i := range evs {
		e := &evs[i]
		k := blockKey{e.Device, e.Addr}
		switch e.Action {
		case snapshot.ActionAlloc:
			live[k] = &liveBlock{alloc: i, addr: e.Addr, device: e.Device, size: e.BlockSize, category: e.Category}
		case snapshot.ActionFreeRequested:
			delete(live, k)
		case snapshot.ActionCategory:
			if b := live[k]; b != nil {
				b.category = e.Category
			}
		}
	}
	out := make([]liveBlock, 0, len(live))
	for _, b := range live {
		out = append(out, *b)
	}
	slices.SortFunc(out, func(a, b liveBlock) int {
		if c := cmp.Compare(b.size, a.size); c != 0 {
			return c
		}
		return cmp.Compare(a.alloc, b.alloc)
	})
	return out
}

// byCategory sums live block bytes per category.
func byCategory(blocks []liveBlock) [snapshot.NumCategories]int64 {
	var sums [snapshot.NumCategories]int64
	for _, b := range blocks {
		if b.category.Valid() {
			sums[b.category] += b.size
		}
	}
	return sums
}

// retainerPath returns the chain of holders that keeps the block at addr alive, from the block outwards, as
// the heap dump nearest to event at records it (the first one after at within its iteration, else the last
// before it). It returns nil when no heap dump names the block.
func (x *index) retainerPath(at int, device int16, addr uint64) []string {
	dump := x.nearestDump(at)
	if dump < 0 {
		return nil
	}
	evs := x.snap.Events
	type holder struct {
		parent uint64
		text   string
	}
	holders := map[uint64]holder{}
	var start uint64
	for i := dump + 1; i < len(evs) && evs[i].Action == snapshot.ActionRetain; i++ {
		e := &evs[i]
		holders[e.Holder] = holder{e.Parent, x.snap.String(e.Text)}
		if start == 0 && e.Addr == addr && e.Device == device {
			start = e.Holder
		}
	}
	var path []string
	for h, n := start, 0; h != 0 && n < 64; n++ {
		hd, ok := holders[h]
		if !ok {
			break
		}
		path = append(path, hd.text)
		h = hd.parent
	}
	return path
}

// nearestDump returns the heap-dump event nearest to at, or -1.
func (x *index) nearestDump(at int) int {
	evs := x.snap.Events
	for i := at; i < len(evs); i++ {
		switch evs[i].Action {
		case snapshot.ActionHeapDump:
			return i
		case snapshot.ActionIteration:
			i = len(evs) // stop: the next iteration's dump describes other memory
		}
	}
	for i := min(at, len(evs)-1); i >= 0; i-- {
		if evs[i].Action == snapshot.ActionHeapDump {
			return i
		}
	}
	return -1
}
