package torch

import (
	"cmp"
	"math"
	"slices"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

// devicePlan is what the analysis of one device's trace and final state produced.
type devicePlan struct {
	dev    int
	segs   []preSeg   // alive before the trace
	blocks []preBlock // in use before the trace
}

// aliveRef is a block in use during the first pass: the alloc entry that made it, or a pre-existing block.
type aliveRef struct {
	idx       int32 // entry index, or -(pre-existing block index)-1
	requested bool  // its free was requested
}

// analyze finds, for one device, what was alive before the trace began, and sizes every block. Its maps and
// the blocks it finds are counted against the budget as they grow.
func (im *importer) analyze(dev int, segs segmentOrder) (devicePlan, error) {
	a := &deviceAnalysis{im: im, p: devicePlan{dev: dev}, alive: make(map[uint64]aliveRef), seen: make(map[uint64]struct{}),
		fixed: make(map[int32]int64), created: map[uint64]bool{}, freed: map[uint64]preSeg{}}
	if dev < len(im.traces) {
		a.entries = im.traces[dev]
	}
	active := 0
	for si := range im.segs {
		if s := &im.segs[si]; s.Device == dev {
			for j := range s.Blocks {
				if s.Blocks[j].State != stateInactive {
					active++
				}
			}
		}
	}
	if err := im.mem.add(int64(active)*int64(unsafe.Sizeof(preBlock{})), analyzing); err != nil {
		return a.p, err
	}
	a.p.blocks = make([]preBlock, 0, active)
	if err := a.followTrace(); err != nil {
		return a.p, err
	}
	if err := a.matchFinalState(segs); err != nil {
		return a.p, err
	}
	if err := a.walkBack(); err != nil {
		return a.p, err
	}
	a.preSegments(segs)
	p := &a.p
	im.startLayout(p.segs, p.blocks)
	if len(a.entries) > 0 {
		if err := im.sizeBlocks(a.entries, p, a.fixed, &a.mm, a.tracked()); err != nil {
			return *p, err
		}
	}
	im.origin.PreExistingSegments += len(p.segs)
	im.origin.PreExistingBlocks += len(p.blocks)
	for i := range p.blocks {
		if p.blocks[i].sizeKnown {
			im.origin.BlockSizesExact++
		} else {
			im.origin.BlockSizesEstimated++
		}
	}
	// The maps are garbage now; of what mm counted, the blocks found beyond the active ones stay.
	im.mem.release(int64(a.mm.charged) * mapEntryBytes)
	return *p, im.mem.add(int64(max(cap(p.blocks)-active, 0))*int64(unsafe.Sizeof(preBlock{}))+int64(cap(p.segs))*int64(unsafe.Sizeof(preSeg{})), analyzing)
}

// analyzing is what the budget says the analysis was doing when it ran out.
const analyzing = "following the trace"

// deviceAnalysis is analyze's work on one device: the plan it makes and the maps its passes fill, whose
// entries mm counts against the budget as they grow.
type deviceAnalysis struct {
	im      *importer
	p       devicePlan
	entries []entry // the device's trace
	mm      mapMeter

	alive   map[uint64]aliveRef // in use as the trace runs, by address
	seen    map[uint64]struct{} // every address the trace allocated or freed
	fixed   map[int32]int64     // alloc entry -> block size from the final state
	created map[uint64]bool     // segments of the final state the trace made
	freed   map[uint64]preSeg   // segments the trace freed that it had not made
	exp     intervals           // expandable ranges mapped, walking back from the end
}

// tracked returns how many map entries and blocks the analysis holds, which mm charges.
func (a *deviceAnalysis) tracked() int {
	return len(a.alive) + len(a.seen) + len(a.p.blocks) + len(a.fixed) + len(a.created) + len(a.freed)
}

// followTrace runs forward through the trace: a free of an address the trace never allocated is a block
// from before the trace.
func (a *deviceAnalysis) followTrace() error {
	im, p := a.im, &a.p
	for i := range a.entries {
		e := &a.entries[i]
		switch e.act {
		case snapshot.ActionAlloc:
			if _, ok := a.alive[e.addr]; ok {
				im.origin.Inconsistencies++ // handed out again without a free
			}
			a.alive[e.addr] = aliveRef{idx: int32(i)}
			a.seen[e.addr] = struct{}{}
			if err := a.mm.grew(&im.mem, a.tracked(), analyzing); err != nil {
				return err
			}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			done := e.act == snapshot.ActionFreeCompleted
			if r, ok := a.alive[e.addr]; ok {
				if done {
					delete(a.alive, e.addr)
				} else {
					r.requested = true
					a.alive[e.addr] = r
				}
				break
			}
			if _, ok := a.seen[e.addr]; ok {
				im.origin.Inconsistencies++ // freed twice
				break
			}
			a.seen[e.addr] = struct{}{}
			p.blocks = append(p.blocks, preBlock{addr: e.addr, requested: e.size, stream: e.stream, stack: e.stack, pending: done})
			if !done {
				a.alive[e.addr] = aliveRef{idx: int32(-len(p.blocks)), requested: true}
			}
			if err := a.mm.grew(&im.mem, a.tracked(), analyzing); err != nil {
				return err
			}
		}
	}
	return nil
}

// matchFinalState reads the final state: blocks still in use that the trace never allocated were allocated
// before it began ("ghosts" in memory_viz). Blocks the trace allocated and never freed take their size from
// the state. Segments are walked by address, so that these blocks come sorted as the layout pass wants them.
func (a *deviceAnalysis) matchFinalState(segs segmentOrder) error {
	im, p := a.im, &a.p
	found := 0
	for _, si := range segs.order {
		s := &im.segs[si]
		if s.Device != p.dev {
			continue
		}
		for j := range s.Blocks {
			b := &s.Blocks[j]
			stack := im.blockStacks[int(segs.blockStart[si])+j]
			if b.State == stateInactive {
				continue
			}
			if r, ok := a.alive[b.Addr]; ok {
				found++
				if r.idx >= 0 {
					a.fixed[r.idx] = b.Size
					if err := a.mm.grew(&im.mem, a.tracked(), analyzing); err != nil {
						return err
					}
				} else {
					pb := &p.blocks[-r.idx-1]
					pb.size, pb.sizeKnown = b.Size, true
				}
				continue
			}
			if _, ok := a.seen[b.Addr]; ok {
				im.origin.Inconsistencies++ // the trace freed it, the state holds it
				continue
			}
			p.blocks = append(p.blocks, preBlock{addr: b.Addr, requested: b.Requested, size: b.Size, stream: s.Stream,
				stack: stack, sizeKnown: true, pending: b.State == statePendingFree})
		}
	}
	if im.haveState {
		im.origin.Inconsistencies += len(a.alive) - found // alive at the end by the trace, absent from the state
	}
	return nil
}

// walkBack runs backward from the final state to the segments that existed when the trace began. Walking
// back, a segment_alloc removes its segment (made during the trace) and a segment_free adds one (made
// before). The expandable ranges mapped at the end are where the walk back starts: a segment_map of a range
// still mapped at the end removes it, an unmap adds it back.
func (a *deviceAnalysis) walkBack() error {
	im := a.im
	for si := range im.segs {
		if s := &im.segs[si]; s.Device == a.p.dev && s.Expandable {
			a.exp.add(s.Addr, s.Addr+uint64(s.Size), s.Stream)
		}
	}
	for i := len(a.entries) - 1; i >= 0; i-- {
		e := &a.entries[i]
		end := e.addr + uint64(e.size)
		switch e.act {
		case snapshot.ActionSegmentAlloc:
			if _, ok := a.freed[e.addr]; ok {
				delete(a.freed, e.addr) // freed later, made here: not from before
			} else if a.created[e.addr] {
				im.origin.Inconsistencies++ // made twice without a free between
			} else {
				a.created[e.addr] = true
			}
			if err := a.mm.grew(&im.mem, a.tracked(), analyzing); err != nil {
				return err
			}
		case snapshot.ActionSegmentFree:
			if _, ok := a.freed[e.addr]; ok {
				im.origin.Inconsistencies++ // freed twice without an alloc between
				break
			}
			// The stack of a segment_free is the releasing caller's (empty_cache), not the creator's: none.
			a.freed[e.addr] = preSeg{addr: e.addr, size: e.size, stream: e.stream, small: e.size <= smallBuffer}
			if err := a.mm.grew(&im.mem, a.tracked(), analyzing); err != nil {
				return err
			}
		case snapshot.ActionSegmentMap:
			if !a.exp.remove(e.addr, end) && im.haveState {
				im.origin.Inconsistencies++
			}
		case snapshot.ActionSegmentUnmap:
			if !a.exp.add(e.addr, end, e.stream) {
				im.origin.Inconsistencies++
			}
		}
	}
	return nil
}

// preSegments lists the segments alive before the trace: those of the final state the trace did not make,
// by address as startLayout wants them, then those the trace freed, then the expandable ranges.
func (a *deviceAnalysis) preSegments(segs segmentOrder) {
	im, p := a.im, &a.p
	nfinal := 0
	for _, si := range segs.order {
		s := &im.segs[si]
		if s.Device != p.dev {
			continue
		}
		if s.Expandable {
			continue // in exp already
		}
		if a.created[s.Addr] {
			nfinal++
			continue
		}
		p.segs = append(p.segs, preSeg{addr: s.Addr, size: s.Size, stream: s.Stream, stack: im.segStacks[si],
			small: s.Pool == "small", known: true})
	}
	if im.haveState && nfinal != len(a.created) {
		im.origin.Inconsistencies += len(a.created) - nfinal // made during the trace, never freed, not in the state
	}
	for _, s := range a.freed {
		s.known = im.haveState // without the final state, blocks alive from start to end are unknown
		p.segs = append(p.segs, s)
	}
	for _, r := range a.exp {
		p.segs = append(p.segs, preSeg{addr: r.start, size: int64(r.end - r.start), stream: r.stream, expandable: true})
	}
}

// segmentOrder is the final state's segments by address (then device), as indices of im.segs, and where
// each segment's blocks start in im.blockStacks.
type segmentOrder struct {
	order, blockStart []int32
}

func (im *importer) segmentOrder() segmentOrder {
	o := segmentOrder{order: make([]int32, len(im.segs)), blockStart: make([]int32, len(im.segs))}
	n := 0
	for i := range im.segs {
		o.order[i] = int32(i)
		o.blockStart[i] = int32(n)
		n += len(im.segs[i].Blocks)
	}
	slices.SortFunc(o.order, func(a, b int32) int {
		sa, sb := &im.segs[a], &im.segs[b]
		return cmp.Or(cmp.Compare(sa.Addr, sb.Addr), cmp.Compare(sa.Device, sb.Device), cmp.Compare(a, b))
	})
	return o
}

// sizeBlocks runs forward through the trace, following the layout of the segments, to size every block.
// Its map and the layout's blocks are counted in mm, on top of the base entries of analyze's maps.
func (im *importer) sizeBlocks(entries []entry, p *devicePlan, fixed map[int32]int64, mm *mapMeter, base int) error {
	lay := layout{pre: p.blocks} // sorted by address
	backing := make([]lseg, 0, len(p.segs))
	for i := range p.segs {
		s := &p.segs[i]
		if s.expandable {
			lay.exp.add(s.addr, s.end(), s.stream)
			continue
		}
		backing = append(backing, lseg{base: s.addr, end: s.end(), known: s.known, unloaded: true})
		lay.segs = append(lay.segs, &backing[len(backing)-1])
	}
	// Sizes of the blocks the trace allocates; those of pre-existing blocks are found in p.blocks (by address).
	sizes := make(map[uint64]int64)
	sizeOf := func(addr uint64) int64 {
		if n, ok := sizes[addr]; ok {
			return n
		}
		if i, ok := slices.BinarySearchFunc(p.blocks, addr, func(b preBlock, a uint64) int { return cmp.Compare(b.addr, a) }); ok {
			return p.blocks[i].size
		}
		return 0
	}
	// A segment_alloc is recorded immediately before the alloc it serves, at the same address.
	fresh := false
	allocs := 0
	for i := range entries {
		e := &entries[i]
		switch e.act {
		case snapshot.ActionSegmentAlloc:
			if !lay.add(&lseg{base: e.addr, end: e.addr + uint64(e.size), known: true}) {
				im.origin.Inconsistencies++
			}
			fresh = e.size > 0 && i+1 < len(entries) && entries[i+1].addr == e.addr
			continue
		case snapshot.ActionSegmentFree:
			lay.remove(e.addr)
		case snapshot.ActionSegmentMap:
			lay.exp.add(e.addr, e.addr+uint64(e.size), e.stream)
		case snapshot.ActionSegmentUnmap:
			lay.exp.remove(e.addr, e.addr+uint64(e.size))
		case snapshot.ActionAlloc:
			e.block = im.blockSize(e, &lay, fixed, int32(i), fresh)
			sizes[e.addr] = e.block
			allocs++
			if err := mm.grew(&im.mem, base+len(sizes)+allocs/4, analyzing); err != nil { // a layout block is a quarter of a map entry
				return err
			}
		case snapshot.ActionFreeRequested:
			e.block = sizeOf(e.addr)
		case snapshot.ActionFreeCompleted:
			e.block = sizeOf(e.addr)
			delete(sizes, e.addr)
			if e.block > smallSize {
				if s := lay.find(e.addr); s != nil {
					s.removeBlock(e.addr)
				}
			}
		case snapshot.ActionOOM:
			e.block = int64(im.rules.allocationSize(uint64(e.size)))
		}
		fresh = false
	}
	return nil
}

// blockSize returns the size of the block an alloc entry got, and records it in the layout.
func (im *importer) blockSize(e *entry, lay *layout, fixed map[int32]int64, idx int32, fresh bool) int64 {
	r := im.rules.roundSize(uint64(e.size))
	var size uint64
	exact := true
	var seg *lseg
	switch {
	case r <= smallSize || lay.exp.contains(e.addr):
		size = r
	default:
		seg = lay.find(e.addr)
		free, ok := uint64(0), false
		if seg != nil {
			free, ok = seg.freeBlockAt(e.addr)
			if fresh && !ok { // a new segment: its one free block is the segment
				free, ok = seg.end-seg.base, seg.base == e.addr
			}
		}
		switch {
		case ok && free >= r:
			size = free
			if im.rules.splits(free, r) {
				size = r
			}
		default:
			size, exact = r, false
			if seg != nil && ok { // the layout says less room than the request: it was wrong
				seg.known = false
			}
		}
	}
	if f, ok := fixed[idx]; ok {
		if exact && uint64(f) != size {
			im.origin.Inconsistencies++
		}
		size, exact = uint64(f), true
	}
	if exact {
		im.origin.BlockSizesExact++
	} else {
		im.origin.BlockSizesEstimated++
	}
	if size > smallSize && seg != nil {
		if exact && seg.known {
			seg.insert(e.addr, size)
		} else {
			seg.known = false
		}
	}
	return int64(min(size, math.MaxInt64))
}
