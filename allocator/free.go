package allocator

import (
	"fmt"
	"slices"
)

// streamEvent is a CUDA event recorded on stream when a block used there was freed.
type streamEvent struct {
	stream int64
	block  *block
}

// Free returns the block at addr to the allocator, as freeing a tensor's storage does. The block is cached
// at once (free_requested, then free_completed), unless RecordStream marked it used on other streams: it
// then stays active_pending_free until those streams' events complete, at the next Malloc, Synchronize or
// EmptyCache. Freeing address 0 does nothing; freeing anything else that is not an allocated block is an
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

// RecordStream marks the allocated block at addr as used on stream (Tensor.record_stream), so that freeing
// it waits for that stream's work. Uses on the block's own stream are ignored.
func (a *Allocator) RecordStream(addr uint64, stream int64) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	b, ok := a.live[addr]
	if !ok {
		return fmt.Errorf("record_stream: no allocated block at %#x", addr)
	}
	if stream == b.stream || slices.Contains(b.streamUses, stream) {
		return nil
	}
	b.streamUses = append(b.streamUses, stream)
	return nil
}

// Synchronize waits for every outstanding cross-stream event and caches the blocks that were waiting
// (synchronize_and_free_events, which counts in num_sync_all_streams).
func (a *Allocator) Synchronize() {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.synchronizeAndFreeEvents()
}

// insertEvents records one event per stream that used b (insert_events); b stays active until they
// complete. Streams are taken in ascending order so that runs are reproducible.
func (a *Allocator) insertEvents(b *block) {
	slices.SortFunc(b.streamUses, streamCmp)
	for _, s := range b.streamUses {
		b.eventCount++
		a.events = append(a.events, streamEvent{stream: s, block: b})
	}
	b.streamUses = b.streamUses[:0]
}

// processEvents is process_events under this package's model, where the other streams' work is done by
// the time the program asks for memory again: every outstanding event completes. PyTorch keeps one queue
// per stream and walks the streams in hash order; here they are walked in ascending order, each queue
// oldest first. A block is cached when its last event completes.
func (a *Allocator) processEvents() {
	if len(a.events) == 0 {
		return
	}
	slices.SortStableFunc(a.events, func(x, y streamEvent) int { return streamCmp(x.stream, y.stream) })
	for i := range a.events {
		b := a.events[i].block
		a.events[i] = streamEvent{}
		b.eventCount--
		if b.eventCount == 0 {
			a.freeBlock(b)
		}
	}
	a.events = a.events[:0]
}

// synchronizeAndFreeEvents waits on every outstanding event and frees the blocks waiting on them.
func (a *Allocator) synchronizeAndFreeEvents() {
	a.stats.NumSyncAllStreams++
	a.processEvents()
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
