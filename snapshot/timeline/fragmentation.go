package timeline

import (
	"slices"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Fragmentation: memory the allocator holds that no tensor uses (PyTorch's "reserved but unallocated"), over
// time and, at any event, block by block.

// growsSegment reports whether a is an event that adds reserved memory for the block handed out next.
func growsSegment(a snapshot.Action) bool {
	return a == snapshot.ActionSegmentAlloc || a == snapshot.ActionSegmentMap
}

// Unallocated returns reserved minus allocated bytes after event seq: memory the allocator holds that no
// tensor uses. A new segment (segment_alloc, or segment_map of expandable pages) counts together with the block
// it was made for, which the allocator hands out in the next event: between the two, the segment is not
// unused memory, only not yet handed out.
func (t *Timeline) Unallocated(seq int) int64 {
	if seq < t.base || seq >= t.n {
		return 0
	}
	for seq+1 < t.n && growsSegment(t.s.Events.Action(seq)) {
		seq++
	}
	return max(0, t.Reserved(seq)-t.Allocated(seq))
}

// UnallocatedColumns splits events [from, to) into len(dst) columns as Columns does and returns each column's
// highest Unallocated bytes in dst (every column -1 for a range of no indexed events). Reserved bytes change only at
// segment events, so a column splits where they change and each piece takes its lowest allocated bytes from
// the pyramid: exact, in O(log n) per segment event in view.
func (t *Timeline) UnallocatedColumns(from, to int, dst []int64) []int64 {
	width := len(dst)
	from, to = max(from, t.base), min(to, t.n)
	for i := range dst {
		dst[i] = -1
	}
	if from >= to || width == 0 {
		return dst
	}
	eachColumn(from, to, width, func(c, lo, hi int) { dst[c] = t.unallocatedMax(lo, hi) })
	return dst
}

// UnallocatedMax returns the highest Unallocated bytes over the events of [from, to) it indexed, 0 for none.
func (t *Timeline) UnallocatedMax(from, to int) int64 {
	from, to = max(from, t.base), min(to, t.n)
	if from >= to {
		return 0
	}
	return t.unallocatedMax(from, to)
}

func (t *Timeline) unallocatedMax(from, to int) int64 {
	var best int64
	// The pieces [start, end) of [from, to) over which reserved bytes stay the same: they change at segment
	// events.
	i, _ := slices.BinarySearch(t.segEvents, uint32(from)+1)
	for start := from; start < to; i++ {
		end := to
		if i < len(t.segEvents) && int(t.segEvents[i]) < to {
			end = int(t.segEvents[i])
		}
		switch {
		case !growsSegment(t.s.Events.Action(start)):
			best = max(best, t.Reserved(start)-t.Range(Allocated, start, end).Min)
		case start+1 < end: // a new segment counts with the events after it, which hold its block
			best = max(best, t.Reserved(start)-t.Range(Allocated, start+1, end).Min)
		case end == to: // the event that holds its block is past the range
			best = max(best, t.Unallocated(start))
		}
		start = end
	}
	return best
}

// Pool returns the allocator pool the segment belongs to, PoolSmall or PoolLarge, as PyTorch's rules decide
// it: a block in use of more than 1 MiB (kSmallSize) can only be in the large pool and one of 1 MiB or less
// only in the small pool; a segment with no block in use is small when it is 2 MiB (kSmallBuffer) or less,
// or, for the pages of an expandable segment, when it is not a whole number of 20 MiB large pages.
func (s *SegmentState) Pool() string {
	for _, b := range s.Blocks {
		if b.Size > 0 {
			if torchrules.IsSmall(uint64(b.Size)) {
				return "small"
			}
			return "large"
		}
	}
	if s.Size <= torchrules.SmallBuffer || s.Expandable && s.Size%torchrules.LargeBuffer != 0 {
		return "small"
	}
	return "large"
}

// FreeBytes returns the bytes of the segment's free blocks.
func (s *SegmentState) FreeBytes() int64 {
	var n int64
	for _, g := range s.Gaps {
		n += g.Size
	}
	return n
}

// LargestGap returns the segment's largest free block, 0 if it has none.
func (s *SegmentState) LargestGap() int64 {
	var n int64
	for _, g := range s.Gaps {
		n = max(n, g.Size)
	}
	return n
}

// Fragmentation is the free memory inside reserved segments at an event. A freed block goes back to its
// segment's free blocks, merging with free neighbours; a segment that still holds a block in use cannot be
// returned to the device, so its free blocks serve only requests that fit in one of them.
type Fragmentation struct {
	Segments  int   // segments reserved
	Reserved  int64 // their bytes
	Allocated int64 // bytes of the blocks in use in them (pending frees included)
	// Free is the bytes of the free blocks, FreeBlocks how many there are, Largest the largest of them.
	Free       int64
	FreeBlocks int
	Largest    int64
	// Split is the free bytes inside segments that also hold a block in use: what empty_cache cannot
	// return (PyTorch's inactive_split_bytes).
	Split int64
}

// Ratio returns (reserved - allocated) / reserved: the share of reserved memory no block uses.
func (f Fragmentation) Ratio() float64 {
	if f.Reserved <= 0 {
		return 0
	}
	return float64(f.Reserved-f.Allocated) / float64(f.Reserved)
}

// Fits reports whether one of the free blocks can hold size bytes.
func (f Fragmentation) Fits(size int64) bool { return f.Largest >= size }

// FragmentationOf sums up segs, those for which keep returns true (nil keeps all).
func FragmentationOf(segs []SegmentState, keep func(*SegmentState) bool) Fragmentation {
	var f Fragmentation
	for i := range segs {
		s := &segs[i]
		if keep != nil && !keep(s) {
			continue
		}
		f.Segments++
		f.Reserved += s.Size
		f.Allocated += s.Allocated()
		free := s.FreeBytes()
		f.Free += free
		f.FreeBlocks += len(s.Gaps)
		f.Largest = max(f.Largest, s.LargestGap())
		if len(s.Blocks) > 0 {
			f.Split += free
		}
	}
	return f
}

// FragmentationAt returns the free memory inside the segments of device at event seq whose pool is pool
// ("" for both pools).
func (t *Timeline) FragmentationAt(seq int, device int16, pool string) Fragmentation {
	return FragmentationOf(t.SegmentsAt(seq), func(s *SegmentState) bool {
		return s.Device == device && (pool == "" || s.Pool() == pool)
	})
}
