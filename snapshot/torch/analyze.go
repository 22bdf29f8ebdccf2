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
	p := devicePlan{dev: dev}
	var mm mapMeter
	const what = "following the trace"
	var entries []entry
	if dev < len(im.traces) {
		entries = im.traces[dev]
	}

	// Forward: a free of an address the trace never allocated is a block from before the trace.
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
	if err := im.mem.add(int64(active)*int64(unsafe.Sizeof(preBlock{})), what); err != nil {
		return p, err
	}
	p.blocks = make([]preBlock, 0, active)
	alive := make(map[uint64]aliveRef)
	seen := make(map[uint64]struct{})
	for i := range entries {
		e := &entries[i]
		switch e.act {
		case snapshot.ActionAlloc:
			if _, ok := alive[e.addr]; ok {
				im.origin.Inconsistencies++ // handed out again without a free
			}
			alive[e.addr] = aliveRef{idx: int32(i)}
			seen[e.addr] = struct{}{}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks), what); err != nil {
				return p, err
			}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			done := e.act == snapshot.ActionFreeCompleted
			if r, ok := alive[e.addr]; ok {
				if done {
					delete(alive, e.addr)
				} else {
					r.requested = true
					alive[e.addr] = r
				}
				break
			}
			if _, ok := seen[e.addr]; ok {
				im.origin.Inconsistencies++ // freed twice
				break
			}
			seen[e.addr] = struct{}{}
			p.blocks = append(p.blocks, preBlock{addr: e.addr, requested: e.size, stream: e.stream, stack: e.stack, pending: done})
			if !done {
				alive[e.addr] = aliveRef{idx: int32(-len(p.blocks)), requested: true}
			}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks), what); err != nil {
				return p, err
			}
		}
	}

	// The final state: blocks still in use that the trace never allocated were allocated before it began
	// ("ghosts" in memory_viz). Blocks the trace allocated and never freed take their size from the state.
	// Segments are walked by address, so that these blocks come sorted as the layout pass wants them.
	fixed := make(map[int32]int64) // alloc entry -> block size from the final state
	found := 0
	for _, si := range segs.order {
		s := &im.segs[si]
		if s.Device != dev {
			continue
		}
		for j := range s.Blocks {
			b := &s.Blocks[j]
			stack := im.blockStacks[int(segs.blockStart[si])+j]
			if b.State == stateInactive {
				continue
			}
			if r, ok := alive[b.Addr]; ok {
				found++
				if r.idx >= 0 {
					fixed[r.idx] = b.Size
					if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks)+len(fixed), what); err != nil {
						return p, err
					}
				} else {
					pb := &p.blocks[-r.idx-1]
					pb.size, pb.sizeKnown = b.Size, true
				}
				continue
			}
			if _, ok := seen[b.Addr]; ok {
				im.origin.Inconsistencies++ // the trace freed it, the state holds it
				continue
			}
			p.blocks = append(p.blocks, preBlock{addr: b.Addr, requested: b.Requested, size: b.Size, stream: s.Stream,
				stack: stack, sizeKnown: true, pending: b.State == statePendingFree})
		}
	}
	if im.haveState {
		im.origin.Inconsistencies += len(alive) - found // alive at the end by the trace, absent from the state
	}

	// Backward from the final state: the segments that existed when the trace began. Walking back, a
	// segment_alloc removes its segment (made during the trace) and a segment_free adds one (made before).
	// The expandable ranges mapped at the end are where the walk back starts: a segment_map of a range still
	// mapped at the end removes it, an unmap adds it back.
	var exp intervals
	for si := range im.segs {
		if s := &im.segs[si]; s.Device == dev && s.Expandable {
			exp.add(s.Addr, s.Addr+uint64(s.Size), s.Stream)
		}
	}
	created := map[uint64]bool{} // segments of the final state the trace made
	freed := map[uint64]preSeg{} // segments the trace freed that it had not made
	for i := len(entries) - 1; i >= 0; i-- {
		e := &entries[i]
		end := e.addr + uint64(e.size)
		switch e.act {
		case snapshot.ActionSegmentAlloc:
			if _, ok := freed[e.addr]; ok {
				delete(freed, e.addr) // freed later, made here: not from before
			} else if created[e.addr] {
				im.origin.Inconsistencies++ // made twice without a free between
			} else {
				created[e.addr] = true
			}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks)+len(fixed)+len(created)+len(freed), what); err != nil {
				return p, err
			}
		case snapshot.ActionSegmentFree:
			if _, ok := freed[e.addr]; ok {
				im.origin.Inconsistencies++ // freed twice without an alloc between
				break
			}
			// The stack of a segment_free is the releasing caller's (empty_cache), not the creator's: none.
			freed[e.addr] = preSeg{addr: e.addr, size: e.size, stream: e.stream, small: e.size <= smallBuffer}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks)+len(fixed)+len(created)+len(freed), what); err != nil {
				return p, err
			}
		case snapshot.ActionSegmentMap:
			if !exp.remove(e.addr, end) && im.haveState {
				im.origin.Inconsistencies++
			}
		case snapshot.ActionSegmentUnmap:
			if !exp.add(e.addr, end, e.stream) {
				im.origin.Inconsistencies++
			}
		}
	}
	nfinal := 0
	for _, si := range segs.order { // by address, as startLayout wants them
		s := &im.segs[si]
		if s.Device != dev {
			continue
		}
		if s.Expandable {
			continue // in exp already
		}
		if created[s.Addr] {
			nfinal++
			continue
		}
		p.segs = append(p.segs, preSeg{addr: s.Addr, size: s.Size, stream: s.Stream, stack: im.segStacks[si],
			small: s.Pool == "small", known: true})
	}
	if im.haveState && nfinal != len(created) {
		im.origin.Inconsistencies += len(created) - nfinal // made during the trace, never freed, not in the state
	}
	for _, s := range freed {
		s.known = im.haveState // without the final state, blocks alive from start to end are unknown
		p.segs = append(p.segs, s)
	}
	for _, r := range exp {
		p.segs = append(p.segs, preSeg{addr: r.start, size: int64(r.end - r.start), stream: r.stream, expandable: true})
	}
	im.startLayout(p.segs, p.blocks)

	if len(entries) > 0 {
		if err := im.sizeBlocks(entries, &p, fixed, &mm, len(alive)+len(seen)+len(p.blocks)+len(fixed)+len(created)+len(freed)); err != nil {
			return p, err
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
	im.mem.release(int64(mm.charged) * mapEntryBytes)
	return p, im.mem.add(int64(max(cap(p.blocks)-active, 0))*int64(unsafe.Sizeof(preBlock{}))+int64(cap(p.segs))*int64(unsafe.Sizeof(preSeg{})), what)
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
			if err := mm.grew(&im.mem, base+len(sizes)+allocs/4, "following the trace"); err != nil { // a layout block is a quarter of a map entry
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
