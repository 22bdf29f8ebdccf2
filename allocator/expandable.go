package allocator

import (
	"errors"
	"fmt"
	"slices"
)

// expandableSegment is PyTorch's ExpandableSegment: a reservation of virtual address space for one
// (stream, pool) into which physical pages are mapped on demand: 2 MiB pages for the small pool,
// large_segment_size pages (20 MiB) for the large pool.
type expandableSegment struct {
	base     uint64
	pageSize uint64
	numPages uint64           // pages the reservation can hold
	pages    []PhysicalHandle // per page from the base; 0 when not mapped; trimmed of trailing zeros
	mapped   uint64           // mapped bytes
	stream   int64
	seq      uint64
}

func (es *expandableSegment) size() uint64 { return es.numPages * es.pageSize }

// pageFloor and pageCeil are segmentLeft and segmentRight: the page index at or below, and at or above, addr.
func (es *expandableSegment) pageFloor(addr uint64) uint64 { return (addr - es.base) / es.pageSize }
func (es *expandableSegment) pageCeil(addr uint64) uint64 {
	return (addr - es.base + es.pageSize - 1) / es.pageSize
}

// mapRange backs the pages covering [addr, addr+size) with new physical memory. addr must be page
// aligned. It returns the bytes mapped (whole pages), or 0 when the device is out of memory, in which case
// nothing was mapped.
func (es *expandableSegment) mapRange(dev Device, addr, size uint64) (uint64, error) {
	begin, end := es.pageFloor(addr), es.pageCeil(addr+size)
	if begin == end {
		return 0, nil
	}
	for uint64(len(es.pages)) < end {
		es.pages = append(es.pages, 0)
	}
	for i := begin; i < end; i++ {
		h, err := dev.CreatePhysical(es.pageSize)
		if err != nil {
			// Give back what this call created; the mapping is all or nothing.
			for j := begin; j < i; j++ {
				if rerr := dev.ReleasePhysical(es.pages[j]); rerr != nil {
					return 0, fmt.Errorf("alloc: cuMemRelease: %w", rerr)
				}
				es.pages[j] = 0
			}
			es.trim()
			if errors.Is(err, ErrOutOfMemory) {
				return 0, nil
			}
			return 0, fmt.Errorf("alloc: cuMemCreate of %d bytes: %w", es.pageSize, err)
		}
		es.pages[i] = h
	}
	for i := begin; i < end; i++ {
		if err := dev.Map(es.base+i*es.pageSize, es.pageSize, es.pages[i]); err != nil {
			return 0, fmt.Errorf("alloc: cuMemMap: %w", err)
		}
	}
	n := (end - begin) * es.pageSize
	es.mapped += n
	return n, nil
}

// unmapRange unmaps and releases the pages lying wholly inside [addr, addr+size) and returns the range
// unmapped; partial pages stay mapped.
func (es *expandableSegment) unmapRange(dev Device, addr, size uint64) (uint64, uint64, error) {
	begin, end := es.pageCeil(addr), es.pageFloor(addr+size)
	if begin >= end {
		return addr, 0, nil
	}
	for i := begin; i < end; i++ {
		if err := dev.Unmap(es.base+i*es.pageSize, es.pageSize); err != nil {
			return 0, 0, fmt.Errorf("alloc: cuMemUnmap: %w", err)
		}
		if err := dev.ReleasePhysical(es.pages[i]); err != nil {
			return 0, 0, fmt.Errorf("alloc: cuMemRelease: %w", err)
		}
		es.pages[i] = 0
	}
	es.trim()
	n := (end - begin) * es.pageSize
	es.mapped -= n
	return es.base + begin*es.pageSize, n, nil
}

func (es *expandableSegment) trim() {
	for len(es.pages) > 0 && es.pages[len(es.pages)-1] == 0 {
		es.pages = es.pages[:len(es.pages)-1]
	}
}

// allocatable reports whether b can become part of an expandable allocation: free or unmapped, with no
// pending events.
func allocatable(b *block) bool {
	return b != nil && !b.allocated && b.eventCount == 0 && len(b.streamUses) == 0
}

// findExpandableBlock is find_expandable_block: the lowest address, in the stream's existing expandable
// segments of the pool, where free and unmapped blocks together offer size bytes; otherwise a new segment,
// reserved now, whose single unmapped block is returned.
func (a *Allocator) findExpandableBlock(p *allocParams) (*block, error) {
	pool := p.pool
	hasSpace := func(b *block) bool {
		var n uint64
		for n < p.size && allocatable(b) {
			n += b.size
			b = b.next
		}
		return n >= p.size
	}
	a.key = block{stream: p.stream}
	for c := pool.unmapped.lowerBound(&a.key); c != nil && c.stream == p.stream; c = pool.unmapped.after(c) {
		// The lowest unmapped block may follow a free block that can be used too.
		cand := c
		if allocatable(cand.prev) {
			cand = cand.prev
		}
		if hasSpace(cand) {
			return cand, nil
		}
	}
	pageSize := uint64(SmallBuffer)
	if !pool.small {
		pageSize = a.largeSegment
	}
	// Address space for 1 1/8 of the device, so that pages unmapped early in the segment can be mapped
	// again at its end.
	want := a.totalMemory + a.totalMemory/8
	numPages := want / pageSize
	if want%pageSize != 0 {
		numPages++
	}
	base, err := a.dev.ReserveAddressRange(numPages * pageSize)
	if err != nil {
		return nil, fmt.Errorf("alloc: cuMemAddressReserve of %d bytes: %w", numPages*pageSize, err)
	}
	a.segSeq++
	es := &expandableSegment{base: base, pageSize: pageSize, numPages: numPages, stream: p.stream, seq: a.segSeq}
	a.expandable = append(a.expandable, es)
	b := a.newBlock()
	b.addr, b.size, b.stream, b.pool, b.seg, b.segSeq = base, es.size(), p.stream, pool, es, es.seq
	pool.unmapped.insert(b)
	return b, nil
}

// mapBlock is map_block: back the first size bytes of the unmapped block b with pages, leave the rest
// unmapped, merge the newly mapped block with free neighbours and cache it. It reports false when the
// device is out of memory.
func (a *Allocator) mapBlock(b *block, size uint64) (bool, error) {
	es := b.seg
	start := b.addr
	n, err := es.mapRange(a.dev, start, size)
	if err != nil || n == 0 {
		return false, err
	}
	pool := b.pool
	pool.unmapped.erase(b)
	b.mapped = true
	if n < b.size {
		rest := a.newBlock()
		rest.addr, rest.size, rest.stream, rest.pool, rest.seg, rest.segSeq = b.addr+n, b.size-n, b.stream, pool, es, b.segSeq
		rest.splice(b, b.next)
		pool.unmapped.insert(rest)
		b.size = n
	}
	a.tryMerge(b, b.prev)
	a.tryMerge(b, b.next)
	pool.insertFree(b)
	a.totalAllocated += n
	a.stats.ReservedBytes.increase(pool.statType, n)
	a.stats.NumDeviceAlloc++
	if a.obs != nil {
		a.obs.SegmentMap(a.idx, b.stream, start, n)
	}
	return true, nil
}

// tryAllocateExpandableBlock is try_allocate_expandable_block: find room in (or create) an expandable
// segment, map the missing pages, one segment_map per map, and take the resulting free block out of the
// pool.
func (a *Allocator) tryAllocateExpandableBlock(p *allocParams) (*block, error) {
	c, err := a.findExpandableBlock(p)
	if err != nil {
		return nil, err
	}
	// c is unmapped (-> anything), or free -> unmapped -> anything.
	if !c.mapped {
		ok, err := a.mapBlock(c, min(c.size, p.size))
		if !ok || err != nil {
			return nil, err
		}
	}
	for c.size < p.size {
		// c is free -> unmapped: map what is missing; mapBlock merges c into the newly mapped block.
		next := c.next
		ok, err := a.mapBlock(next, min(p.size-c.size, next.size))
		if !ok || err != nil {
			return nil, err
		}
		c = next
	}
	p.pool.blocks.erase(c)
	return c, nil
}

// unmapBlock is unmap_block: give back the whole pages inside the free expandable block b. The partial
// pages at either end stay mapped as free blocks of their own; the unmapped middle merges with unmapped
// neighbours.
func (a *Allocator) unmapBlock(b *block) error {
	es := b.seg
	start, n, err := es.unmapRange(a.dev, b.addr, b.size)
	if err != nil || n == 0 {
		return err
	}
	pool := b.pool
	pool.blocks.erase(b)
	if before := start - b.addr; before > 0 {
		f := a.newBlock()
		f.addr, f.size, f.stream, f.pool, f.seg, f.segSeq, f.mapped = b.addr, before, b.stream, pool, es, b.segSeq, true
		f.splice(b.prev, b)
		pool.insertFree(f)
	}
	if after := b.size - (start - b.addr) - n; after > 0 {
		f := a.newBlock()
		f.addr, f.size, f.stream, f.pool, f.seg, f.segSeq, f.mapped = start+n, after, b.stream, pool, es, b.segSeq, true
		f.splice(b, b.next)
		pool.insertFree(f)
	}
	b.addr, b.size, b.mapped = start, n, false
	a.tryMerge(b, b.prev)
	a.tryMerge(b, b.next)
	pool.unmapped.insert(b)
	a.totalAllocated -= n
	a.stats.ReservedBytes.decrease(pool.statType, n)
	a.stats.NumDeviceFree++
	if a.obs != nil {
		a.obs.SegmentUnmap(a.idx, b.stream, start, n)
	}
	return nil
}

// releaseExpandableSegment destroys an expandable segment whose only block is its unmapped whole.
func (a *Allocator) releaseExpandableSegment(b *block) error {
	es := b.seg
	if b.mapped || b.isSplit() || b.size != es.size() {
		return fmt.Errorf("alloc: expandable segment at %#x is not wholly unmapped", es.base)
	}
	b.pool.unmapped.erase(b)
	if err := a.dev.FreeAddressRange(es.base, es.size()); err != nil {
		return fmt.Errorf("alloc: cuMemAddressFree of %#x: %w", es.base, err)
	}
	if i := slices.Index(a.expandable, es); i >= 0 {
		a.expandable = slices.Delete(a.expandable, i, i+1)
	}
	a.recycle(b)
	return nil
}
