package allocator

import "fmt"

// Free returns the block at addr to the allocator, as freeing a tensor's storage does. The block is cached
// at once (free_requested, then free_completed), unless RecordStream marked it used on other streams: an
// event is then recorded on each of them, and the block stays active_pending_free until they complete
// (seen by a later Malloc or ProcessEvents, or waited for by Synchronize or EmptyCache). Freeing address 0 does nothing; freeing anything else that is not an allocated block is an
// error, as in PyTorch.
func (a *Allocator) Free(addr uint64) error {
	if addr == 0 {
		return nil
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.live[addr]
	if !ok {
		return fmt.Errorf("invalid device pointer: %#x", addr)
	}
	delete(a.live, addr)
	b.allocated = false
	st := b.pool.statType
	a.stats.Allocation.decrease(st, 1)
	a.stats.AllocatedBytes.decrease(st, b.size)
	if a.obs != nil {
		a.obs.FreeRequested(a.idx, b.stream, b.addr, b.requested, b.size)
	}
	if b.size >= a.maxSplit {
		a.stats.OversizeAllocations.decrease(1)
	}
	if len(b.streamUses) > 0 {
		a.insertEvents(b)
	} else {
		a.freeBlock(b)
	}
	return nil
}

// freeBlock is free_block: cache b, merging it with free neighbours of its segment, and update the stats.
func (a *Allocator) freeBlock(b *block) {
	pool := b.pool
	st := pool.statType
	if a.obs != nil {
		a.obs.FreeCompleted(a.idx, b.stream, b.addr, b.requested, b.size)
	}
	origSize, requested := b.size, b.requested
	var netBlocks, netBytes int64
	for _, c := range [2]*block{b.prev, b.next} {
		if n := a.tryMerge(b, c); n > 0 {
			netBlocks--
			netBytes -= int64(n)
		}
	}
	pool.insertFree(b)
	if b.isSplit() {
		netBlocks++
		netBytes += int64(b.size)
	}
	// inactive_split leaves expandable segments out: their free pages can always be released.
	if b.seg == nil {
		changeStat(&a.stats.InactiveSplit, st, netBlocks)
		changeStat(&a.stats.InactiveSplitBytes, st, netBytes)
	}
	a.stats.Active.decrease(st, 1)
	a.stats.ActiveBytes.decrease(st, origSize)
	a.stats.RequestedBytes.decrease(st, requested)
}

// changeStat applies a signed change the way PyTorch does: an increase or a decrease, never both, so that
// the allocated and freed totals move as they do there.
func changeStat(s *StatArray, pool int, delta int64) {
	switch {
	case delta > 0:
		s.increase(pool, uint64(delta))
	case delta < 0:
		s.decrease(pool, uint64(-delta))
	}
}

// tryMerge is try_merge_blocks: fold src, a neighbour of dst, into dst if src is free, has no pending
// events and has dst's mapped state. It returns the bytes gained, 0 if no merge happened. dst must not be in
// a tree, since its key changes.
func (a *Allocator) tryMerge(dst, src *block) uint64 {
	if src == nil || src.allocated || src.eventCount > 0 || len(src.streamUses) > 0 || dst.mapped != src.mapped {
		return 0
	}
	if dst.prev == src { // [src dst]
		dst.addr = src.addr
		dst.prev = src.prev
		if dst.prev != nil {
			dst.prev.next = dst
		}
	} else { // [dst src]
		dst.next = src.next
		if dst.next != nil {
			dst.next.prev = dst
		}
	}
	n := src.size
	dst.size += n
	if src.mapped {
		src.pool.blocks.erase(src)
	} else {
		src.pool.unmapped.erase(src)
	}
	a.recycle(src)
	return n
}
