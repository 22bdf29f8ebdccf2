package allocator

import "sort"

// Pool names, as PyTorch snapshots spell segment_type.
const (
	PoolSmall = "small"
	PoolLarge = "large"
)

// Block states, as PyTorch snapshots spell them.
const (
	StateActiveAllocated   = "active_allocated"    // handed out
	StateActivePendingFree = "active_pending_free" // freed, waiting on other streams' events
	StateInactive          = "inactive"            // cached
)

// Segment is one segment of the allocator state, as a PyTorch snapshot reports it: a cudaMalloc'd segment,
// or one contiguous mapped range of an expandable segment. Its blocks tile it in address order.
type Segment struct {
	Device     int
	Stream     int64
	Addr       uint64
	Size       uint64
	Pool       string // PoolSmall or PoolLarge
	Expandable bool
	Blocks     []Block
}

// Block is one block of a Segment.
type Block struct {
	Addr uint64
	Size uint64
	// Requested is the unrounded size of the block's last allocation; PyTorch leaves it stale once the
	// block is inactive, and so does this package.
	Requested uint64
	State     string // StateActiveAllocated, StateActivePendingFree or StateInactive
}

// AllocatedSize returns the bytes of the segment's allocated blocks.
func (s *Segment) AllocatedSize() uint64 {
	var n uint64
	for _, b := range s.Blocks {
		if b.State == StateActiveAllocated {
			n += b.Size
		}
	}
	return n
}

// ActiveSize returns the bytes of the segment's allocated and pending-free blocks.
func (s *Segment) ActiveSize() uint64 {
	var n uint64
	for _, b := range s.Blocks {
		if b.State != StateInactive {
			n += b.Size
		}
	}
	return n
}

// Segments returns the allocator state in address order, as DeviceCachingAllocator::snapshot() builds it:
// every segment with its blocks; an expandable segment appears as one Segment per contiguous mapped range,
// and its unmapped address space not at all.
func (a *Allocator) Segments() []Segment {
	a.mu.Lock()
	defer a.mu.Unlock()
	all := a.allBlocks()
	heads := 0
	for _, b := range all {
		if b.prev == nil || !b.prev.mapped {
			heads++
		}
	}
	// One array for the segments and one for their blocks: a state of hundreds of thousands of segments
	// would otherwise take as many small allocations, each grown by copying.
	segs := make([]Segment, 0, heads)
	blocks := make([]Block, 0, len(all))
	for _, head := range all {
		if head.prev != nil && head.prev.mapped {
			continue // not the first block of a mapped range
		}
		s := Segment{
			Device:     a.idx,
			Stream:     head.stream,
			Addr:       head.addr,
			Pool:       head.pool.kind(),
			Expandable: head.seg != nil,
		}
		first := len(blocks)
		for b := head; b != nil && b.mapped; b = b.next {
			blocks = append(blocks, Block{Addr: b.addr, Size: b.size, Requested: b.requested, State: blockState(b)})
			s.Size += b.size
		}
		s.Blocks = blocks[first:len(blocks):len(blocks)]
		segs = append(segs, s)
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].Addr < segs[j].Addr })
	return segs
}

func blockState(b *block) string {
	switch {
	case b.allocated:
		return StateActiveAllocated
	case b.pendingFree():
		return StateActivePendingFree
	default:
		return StateInactive
	}
}

// allBlocks returns every mapped block: cached, allocated and pending free (get_all_blocks).
func (a *Allocator) allBlocks() []*block {
	var all []*block
	all = a.small.blocks.appendTo(all)
	all = a.large.blocks.appendTo(all)
	for _, b := range a.live {
		all = append(all, b)
	}
	return append(all, a.pendingBlocks()...)
}
