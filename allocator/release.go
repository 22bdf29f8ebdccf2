package allocator

import "fmt"

// EmptyCache returns every cached segment that holds no block in use to the device, as
// torch.cuda.empty_cache() does: it first waits on outstanding cross-stream events, then frees the unsplit
// cached segments (segment_free) and unmaps the free pages of expandable segments (segment_unmap).
// Segments with a block in use stay reserved, free parts included.
func (a *Allocator) EmptyCache() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.releaseCachedBlocks()
}

// releaseCachedBlocks is release_cached_blocks for the default pools.
func (a *Allocator) releaseCachedBlocks() error {
	a.synchronizeAndFreeEvents()
	if err := a.releaseBlocks(&a.large); err != nil {
		return err
	}
	return a.releaseBlocks(&a.small)
}

// releaseBlocks frees every cached block that is a whole segment and unmaps the free pages of expandable
// blocks, destroying an expandable segment once nothing of it is mapped.
func (a *Allocator) releaseBlocks(pool *blockPool) error {
	blocks := pool.blocks.appendTo(a.scratch[:0])
	defer func() { a.scratch = clearBlocks(blocks) }()
	var toUnmap []*block
	for _, b := range blocks {
		switch {
		case b.seg != nil:
			// Unmapping changes the pool, so gather first, as PyTorch does.
			toUnmap = append(toUnmap, b)
		case !b.isSplit():
			if err := a.releaseBlock(b); err != nil {
				return err
			}
		}
	}
	for _, b := range toUnmap {
		if err := a.unmapBlock(b); err != nil {
			return err
		}
		if !b.mapped && !b.isSplit() {
			if err := a.releaseExpandableSegment(b); err != nil {
				return err
			}
		}
	}
	return nil
}

func clearBlocks(s []*block) []*block {
	clear(s)
	return s[:0]
}

// releaseBlock is release_block: cudaFree of a cached block that is a whole segment.
func (a *Allocator) releaseBlock(b *block) error {
	pool := b.pool
	a.stats.NumDeviceFree++
	if a.obs != nil {
		a.obs.SegmentFree(a.idx, b.stream, b.addr, b.size)
	}
	if err := a.dev.Free(b.addr); err != nil {
		return fmt.Errorf("alloc: cudaFree of %#x: %w", b.addr, err)
	}
	a.totalAllocated -= b.size
	a.stats.Segment.decrease(pool.statType, 1)
	a.stats.ReservedBytes.decrease(pool.statType, b.size)
	if b.size >= a.maxSplit {
		a.stats.OversizeSegments.decrease(1)
	}
	pool.blocks.erase(b)
	a.recycle(b)
	return nil
}

// releaseAvailableCachedBlocks is release_available_cached_blocks, the first recovery step, taken only when
// max_split_size is set: free the smallest single oversize cached block on the request's stream that is at
// least max(request, max_split_size); failing that, free oversize blocks from the largest down until that
// much is freed. It reports whether enough was freed.
func (a *Allocator) releaseAvailableCachedBlocks(p *allocParams) (bool, error) {
	if a.maxSplit == ^uint64(0) {
		return false, nil
	}
	pool := p.pool
	a.key = block{stream: p.stream, size: max(p.size, a.maxSplit)}
	target := a.key.size
	b := pool.blocks.lowerBound(&a.key)
	// Oversize blocks are never split under valid settings, so they are whole segments. A split one can
	// only appear when max_split_size is lowered mid-run; PyTorch would hand cudaFree an address inside a
	// segment there, which is left out: such blocks are skipped.
	if b != nil && b.stream == p.stream && b.seg == nil && !b.isSplit() {
		return true, a.releaseBlock(b)
	}
	// No single block is big enough: free oversize blocks from the largest on this stream down.
	cur := pool.blocks.before(&a.key)
	var released uint64
	for cur != nil && released < target && cur.size >= a.maxSplit && cur.stream == p.stream {
		prev := pool.blocks.before(cur)
		if cur.seg == nil && !cur.isSplit() {
			released += cur.size
			if err := a.releaseBlock(cur); err != nil {
				return false, err
			}
		}
		cur = prev
	}
	return released >= target, nil
}

// garbageCollectCachedBlocks is garbage_collect_cached_blocks: when the reserved bytes exceed
// garbage_collection_threshold of the memory-fraction limit, free the large pool's unsplit cached segments
// that have gone unused for at least the average age, repeating with the remaining ones until the excess is
// reclaimed or nothing more can be freed. It does not synchronize and leaves the small pool alone.
func (a *Allocator) garbageCollectCachedBlocks() error {
	gcThreshold := uint64(a.cfg.GarbageCollectionThreshold * float64(a.allowedMax))
	if a.totalAllocated <= gcThreshold {
		return nil
	}
	target := a.totalAllocated - gcThreshold
	pool := &a.large
	blocks := pool.blocks.appendTo(a.scratch[:0])
	defer func() { a.scratch = clearBlocks(blocks) }()
	var totalAge int64
	freeable := 0
	for _, b := range blocks {
		if !b.isSplit() {
			totalAge += pool.gcCount(b)
			freeable++
		}
	}
	if freeable == 0 {
		return nil
	}
	var reclaimed uint64
	for freed := true; reclaimed < target && freed && freeable > 0; {
		ageThreshold := float64(totalAge) / float64(freeable)
		freed = false
		// Free every block at least as old as the average; do not stop at the target, so that
		// collection does not run again soon.
		blocks = pool.blocks.appendTo(clearBlocks(blocks))
		for _, b := range blocks {
			if b.isSplit() || b.seg != nil || float64(pool.gcCount(b)) < ageThreshold {
				continue
			}
			freed = true
			reclaimed += b.size
			totalAge -= pool.gcCount(b)
			freeable--
			if err := a.releaseBlock(b); err != nil {
				return err
			}
		}
	}
	return nil
}
