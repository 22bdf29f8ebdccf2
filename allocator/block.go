package allocator

// block is PyTorch's Block: a run of a segment's address space, handed out (allocated), waiting on
// cross-stream events (pending free), cached (free), or, in an expandable segment, not backed by memory
// (unmapped). The blocks of a segment form a doubly linked list in address order.
type block struct {
	addr      uint64
	size      uint64
	requested uint64 // the caller's unrounded size; stale once the block is free, as in PyTorch
	stream    int64
	pool      *blockPool
	prev      *block
	next      *block
	seg       *expandableSegment // nil for a cudaMalloc segment
	segSeq    uint64             // creation order of the block's segment, for TieBySegment

	streamUses  []int64 // other streams that used the block (record_stream)
	gcCountBase int64   // pool.getFreeBlocksCallCount when the block entered the pool
	eventCount  int32   // outstanding cross-stream events
	allocated   bool
	mapped      bool // backed by memory; false only for the unmapped tail of expandable segments

	// Links of the intrusive treap the block sits in while free (pool.blocks) or unmapped
	// (pool.unmapped); a block is in at most one.
	left, right *block
	prio        uint32
}

// isSplit reports whether the block shares its segment with other blocks.
func (b *block) isSplit() bool { return b.prev != nil || b.next != nil }

// pendingFree reports whether the block was freed but waits on events of other streams.
func (b *block) pendingFree() bool {
	return !b.allocated && (b.eventCount > 0 || len(b.streamUses) > 0)
}

// splice links b between before and after.
func (b *block) splice(before, after *block) {
	if before != nil {
		before.next = b
	}
	b.prev = before
	if after != nil {
		after.prev = b
	}
	b.next = after
}

// blockPool is one of PyTorch's two BlockPools: the free blocks of small (rounded size <= 1 MiB) or large
// requests, across all streams.
type blockPool struct {
	small    bool
	statType int       // statSmallPool or statLargePool
	blocks   blockTree // free, mapped blocks by (stream, size[, segment], address)
	unmapped blockTree // unmapped blocks of expandable segments by (stream, address)
	// getFreeBlocksCallCount counts best-fit searches while garbage collection is on; a cached block's
	// age is the count's growth since the block was cached.
	getFreeBlocksCallCount int64
}

func (p *blockPool) kind() string {
	if p.small {
		return PoolSmall
	}
	return PoolLarge
}

// insertFree caches b (insert_into_blocks), starting its garbage-collection age.
func (p *blockPool) insertFree(b *block) {
	b.gcCountBase = p.getFreeBlocksCallCount
	p.blocks.insert(b)
}

// gcCount is the block's age in best-fit searches.
func (p *blockPool) gcCount(b *block) int64 { return p.getFreeBlocksCallCount - b.gcCountBase }

// streamLess orders streams as PyTorch does: by the raw cudaStream_t pointer value, unsigned.
func streamCmp(a, b int64) int {
	switch ua, ub := uint64(a), uint64(b); {
	case ua < ub:
		return -1
	case ua > ub:
		return 1
	}
	return 0
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// bySizeAddress is BlockComparatorSize: (stream, size, address).
func bySizeAddress(a, b *block) int {
	if c := streamCmp(a.stream, b.stream); c != 0 {
		return c
	}
	if c := cmpU64(a.size, b.size); c != 0 {
		return c
	}
	return cmpU64(a.addr, b.addr)
}

// bySizeSegment is the newest BlockComparatorSizeCounterAddress: (stream, size, segment order, address).
// Search keys carry segment order 0, before every real segment.
func bySizeSegment(a, b *block) int {
	if c := streamCmp(a.stream, b.stream); c != 0 {
		return c
	}
	if c := cmpU64(a.size, b.size); c != 0 {
		return c
	}
	if c := cmpU64(a.segSeq, b.segSeq); c != 0 {
		return c
	}
	return cmpU64(a.addr, b.addr)
}

// byAddress is BlockComparatorAddress: (stream, address).
func byAddress(a, b *block) int {
	if c := streamCmp(a.stream, b.stream); c != 0 {
		return c
	}
	return cmpU64(a.addr, b.addr)
}
