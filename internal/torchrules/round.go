package torchrules

import (
	"math"
	"math/bits"
)

// PyTorch's allocator constants (CUDACachingAllocator.cpp, AllocatorConfig.h), verbatim.
const (
	MinBlockSize  = 512      // kMinBlockSize: all sizes are rounded to at least 512 bytes
	SmallSize     = 1 << 20  // kSmallSize: the largest "small" allocation is 1 MiB
	SmallBuffer   = 2 << 20  // kSmallBuffer: small allocations are packed in 2 MiB segments
	MinLargeAlloc = 10 << 20 // kMinLargeAlloc: requests between 1 and 10 MiB get a large_segment_size segment
	RoundLarge    = 2 << 20  // kRoundLarge: larger requests are rounded up to 2 MiB
	LargeBuffer   = 20 << 20 // kLargeBuffer: the default large_segment_size and max_non_split_rounding_size

	// RoundupIntervals is the number of entries of the roundup_power2_divisions table: one per power-of-two
	// MiB interval from [1 MiB, 2 MiB) (which also covers everything smaller) to [32 GiB, inf).
	RoundupIntervals = 16

	// OneExaByte is the request size at which PyTorch refuses without trying ("more than 1EB").
	OneExaByte = 1 << 60

	mib = 1 << 20
)

// RoundSize is PyTorch's round_size: the size a request of size bytes is served with. Below 512 bytes it is
// 512; where the roundup_power2_divisions table has n > 1 divisions for the size's interval and the size
// exceeds 512*n, it is rounded up to the next of n equal steps between powers of two; otherwise it is
// rounded up to a multiple of 512. A nil table means no divisions. Sizes past 2^63, which only hostile
// input holds (PyTorch refuses anything from 1 EB), are returned as they are rather than wrap around.
func RoundSize(size uint64, divisions *[RoundupIntervals]uint64) uint64 {
	if size < MinBlockSize {
		return MinBlockSize
	}
	if size > math.MaxUint64/2 {
		return size
	}
	if divisions != nil {
		n := divisions[RoundupIndex(size)]
		// Divisions apply only above 512*n, so the docs' example (1200 B with 4 divisions -> 1280) is
		// not what the code does: 1200 <= 2048 and rounds to 1536.
		if n > 1 && size > MinBlockSize*n {
			return roundupPower2NextDivision(size, n)
		}
	}
	return MinBlockSize * ((size + MinBlockSize - 1) / MinBlockSize)
}

// RoundupIndex is the roundup_power2_divisions table entry covering size: log2(size) - 20, clamped to
// [0, 15].
func RoundupIndex(size uint64) int {
	logSize := bits.Len64(size) - 1
	idx := 0
	if logSize > 20 {
		idx = logSize - 20
	}
	return min(idx, RoundupIntervals-1)
}

// roundupPower2NextDivision rounds size up to the next of divisions equal steps between the powers of two
// around it (roundup_power2_next_division). divisions must be a power of two >= 2.
func roundupPower2NextDivision(size, divisions uint64) uint64 {
	if size&(size-1) == 0 {
		return size
	}
	floor := uint64(1) << (bits.Len64(size) - 1)
	step := floor >> (bits.Len64(divisions) - 1)
	if step == 0 {
		return floor << 1
	}
	down := size &^ (step - 1)
	if down == size {
		return size
	}
	return down + step
}

// AllocationSize is PyTorch's get_allocation_size: the size of the segment the allocator asks the device for
// when no cached block fits a request of rounded size bytes. Up to 1 MiB it is 2 MiB; below 10 MiB it is
// largeSegment (20 MiB by default); above, the size rounded up to 2 MiB (sizes within 2 MiB of 2^64 as
// they are, rather than overflow).
func AllocationSize(rounded, largeSegment uint64) uint64 {
	switch {
	case rounded <= SmallSize:
		return SmallBuffer
	case rounded < MinLargeAlloc:
		return largeSegment
	case rounded > math.MaxUint64-RoundLarge:
		return rounded
	default:
		return RoundLarge * ((rounded + RoundLarge - 1) / RoundLarge)
	}
}

// IsSmall reports whether a request of rounded size bytes is served from the small pool (<= 1 MiB).
func IsSmall(rounded uint64) bool { return rounded <= SmallSize }

// ShouldSplit is should_split: whether a free block of block bytes handed out for a request of rounded bytes
// is split, the remainder going back to the cache. A small-pool block (and any block while expandable
// segments are active: small is then true) splits when at least 512 bytes would remain; a large-pool block
// only when more than 1 MiB would remain and the request is below maxSplit (max_split_size).
func ShouldSplit(block, rounded uint64, small bool, maxSplit uint64) bool {
	remaining := block - rounded
	if small {
		return remaining >= MinBlockSize
	}
	return rounded < maxSplit && remaining > SmallSize
}

// HostBlockSize is the size of the block the caching host allocator (page-locked memory: pin_memory(), the
// CPU side of non_blocking copies) serves a request of size bytes with: the next power of two,
// c10::llvm::PowerOf2Ceil in CachingHostAllocatorImpl::allocate (aten/src/ATen/core/CachingHostAllocator.h),
// which also indexes its free lists. It does not split blocks. 0 stays 0 (no allocation); sizes past 2^63 are
// returned as they are.
func HostBlockSize(size uint64) uint64 {
	if size == 0 || size > 1<<63 {
		return size
	}
	return 1 << bits.Len64(size-1)
}
