package snapshottest

import (
	"cmp"
	"math"
	"slices"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/snapshot"
)

// allocator is a small stand-in for the CUDA caching allocator: blocks are carved from 2 MiB (small pool) or
// 20 MiB (large pool) segments, or get a segment of their own when large; freed blocks are cached, and a
// request takes the smallest cached block that fits with the lowest address, as PyTorch's best fit over
// (size, address) does, so addresses repeat from one iteration to the next. Unlike PyTorch it neither splits
// cached blocks (it only takes one whose excess PyTorch would not split off either) nor merges neighbours.
type allocator struct {
	nextSegment uint64
	small       carve
	large       carve
	cache       map[int64][]uint64 // block size -> free block addresses, in decreasing order
	sizes       []int64            // the keys of cache, sorted
	segments    []*segment
	allocated   int64
	reserved    int64
}

// carve is the segment a pool is cutting new blocks from.
type carve struct {
	seg      *segment
	cur, end uint64
}

type segment struct {
	addr  uint64
	size  int64
	small bool
}

func newAllocator() *allocator {
	return &allocator{nextSegment: 0x7f3a_0000_0000, cache: make(map[int64][]uint64)}
}

// malloc returns the address and block size for a request of n bytes, and the new segment if one was needed.
func (a *allocator) malloc(n int64) (addr uint64, block int64, seg *segment) {
	size := int64(torchrules.RoundSize(uint64(n), nil))
	small := torchrules.IsSmall(uint64(size))
	// Best fit: the smallest cached block at least as large, if the excess is one PyTorch would not split off.
	unsplit := int64(torchrules.MinBlockSize - 1)
	if !small {
		unsplit = torchrules.SmallSize
	}
	for i, _ := slices.BinarySearch(a.sizes, size); i < len(a.sizes) && a.sizes[i] <= size+unsplit; i++ {
		if free := a.cache[a.sizes[i]]; len(free) > 0 {
			addr, block = free[len(free)-1], a.sizes[i] // the lowest address
			a.cache[block] = free[:len(free)-1]
			a.allocated += block
			return addr, block, nil
		}
	}
	pool := &a.large
	if small {
		pool = &a.small
	}
	if pool.seg == nil || pool.cur+uint64(size) > pool.end {
		segSize := int64(torchrules.AllocationSize(uint64(size), torchrules.LargeBuffer))
		seg = &segment{addr: a.nextSegment, size: segSize, small: small}
		a.nextSegment += uint64(segSize) + torchrules.RoundLarge // a gap between segments, as cudaMalloc leaves
		a.segments = append(a.segments, seg)
		a.reserved += segSize
		*pool = carve{seg: seg, cur: seg.addr, end: seg.addr + uint64(segSize)}
	}
	addr = pool.cur
	block = size
	// A remainder too small to split stays with the block, so its block size exceeds the rounded request.
	rest := int64(pool.end - pool.cur - uint64(size))
	if !torchrules.ShouldSplit(uint64(block+rest), uint64(size), small, math.MaxUint64) {
		block += rest
	}
	pool.cur += uint64(block)
	a.allocated += block
	return addr, block, seg
}

// free caches a block for reuse.
func (a *allocator) free(addr uint64, block int64) {
	free, ok := a.cache[block]
	if !ok {
		i, _ := slices.BinarySearch(a.sizes, block)
		a.sizes = slices.Insert(a.sizes, i, block)
	}
	i, _ := slices.BinarySearchFunc(free, addr, func(x, y uint64) int { return cmp.Compare(y, x) })
	a.cache[block] = slices.Insert(free, i, addr)
	a.allocated -= block
}

// state returns the allocator's segments and their blocks as a footer describes them: live blocks are
// active_allocated, cached ones inactive.
func (a *allocator) state(live []*tensor) []snapshot.Segment {
	segs := make([]snapshot.Segment, len(a.segments))
	for i, s := range a.segments {
		pool := "large"
		if s.small {
			pool = "small"
		}
		segs[i] = snapshot.Segment{Addr: s.addr, Size: s.size, Pool: pool}
	}
	find := func(addr uint64) *snapshot.Segment {
		i, _ := slices.BinarySearchFunc(segs, addr, func(s snapshot.Segment, a uint64) int {
			if a < s.Addr {
				return 1
			}
			if a >= s.Addr+uint64(s.Size) {
				return -1
			}
			return 0
		})
		if i < len(segs) {
			return &segs[i]
		}
		return nil
	}
	for _, t := range live {
		if s := find(t.addr); s != nil {
			s.Blocks = append(s.Blocks, snapshot.Block{Addr: t.addr, Size: t.block, Requested: t.size, State: "active_allocated"})
		}
	}
	for _, size := range a.sizes {
		for _, addr := range a.cache[size] {
			if s := find(addr); s != nil {
				s.Blocks = append(s.Blocks, snapshot.Block{Addr: addr, Size: size, State: "inactive"})
			}
		}
	}
	for i := range segs {
		slices.SortFunc(segs[i].Blocks, func(x, y snapshot.Block) int { return cmp.Compare(x.Addr, y.Addr) })
	}
	return segs
}
