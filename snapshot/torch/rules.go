package torch

import (
	"math"
	"math/bits"
	"strconv"
	"strings"
)

// The caching allocator's constants (c10/cuda/CUDACachingAllocator.cpp), as docs/pytorch-reference.md §2.1
// quotes them. This package may import only snapshot, so the few rules the importer needs to size blocks are
// restated here; workloads/alloc holds the full model, and the replay tests check the two agree on every
// block of the real traces.
const (
	minBlockSize     = 512      // kMinBlockSize
	smallSize        = 1 << 20  // kSmallSize: the largest small-pool block request
	smallBuffer      = 2 << 20  // kSmallBuffer: small-pool segment size
	minLargeAlloc    = 10 << 20 // kMinLargeAlloc
	roundLarge       = 2 << 20  // kRoundLarge
	largeBuffer      = 20 << 20 // kLargeBuffer: default large_segment_size
	roundupIntervals = 16       // entries of the roundup_power2_divisions table
)

// rules are the allocator settings that decide block and segment sizes.
type rules struct {
	maxSplit     uint64 // max_split_size; math.MaxUint64 when unlimited
	largeSegment uint64 // large_segment_size
	divisions    [roundupIntervals]uint64
	anyDivisions bool
	expandable   bool
}

func defaultRules() rules { return rules{maxSplit: math.MaxUint64, largeSegment: largeBuffer} }

// roundSize is round_size: the size a request is served with.
func (r *rules) roundSize(size uint64) uint64 {
	if size < minBlockSize {
		return minBlockSize
	}
	if r.anyDivisions {
		idx := 0
		if l := bits.Len64(size) - 1; l > 20 {
			idx = min(l-20, roundupIntervals-1)
		}
		if n := r.divisions[idx]; n > 1 && size > minBlockSize*n {
			return roundupPower2NextDivision(size, n)
		}
	}
	if size > math.MaxUint64-minBlockSize {
		return size // absurd sizes of hostile input: no rounding rather than an overflow
	}
	return minBlockSize * ((size + minBlockSize - 1) / minBlockSize)
}

// roundupPower2NextDivision is roundup_power2_next_division; divisions is a power of two >= 2.
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

// allocationSize is get_allocation_size: the segment a request of rounded size would get.
func (r *rules) allocationSize(rounded uint64) uint64 {
	switch {
	case rounded <= smallSize:
		return smallBuffer
	case rounded < minLargeAlloc:
		return r.largeSegment
	case rounded > math.MaxUint64-roundLarge:
		return rounded
	default:
		return roundLarge * ((rounded + roundLarge - 1) / roundLarge)
	}
}

// splits is should_split for a non-expandable block of size block handed out for a request of rounded size:
// the small pool splits off any remainder (all its sizes are multiples of 512), the large pool only a
// remainder over 1 MiB, and never for an oversize request.
func (r *rules) splits(block, rounded uint64) bool {
	rem := block - rounded
	if rounded <= smallSize {
		return rem >= minBlockSize
	}
	return rounded < r.maxSplit && rem > smallSize
}

// applyConf reads the settings the rules need from a PYTORCH_CUDA_ALLOC_CONF string, leniently: keys it does
// not know and values it cannot read are ignored (the string is shown to the user verbatim anyway).
func (r *rules) applyConf(conf string) {
	conf = strings.Map(func(c rune) rune {
		if c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			return -1
		}
		return c
	}, conf)
	for conf != "" {
		// Split off one key:value, where a value may be a bracketed list holding commas.
		end := len(conf)
		depth := 0
		for i := 0; i < len(conf); i++ {
			switch conf[i] {
			case '[':
				depth++
			case ']':
				depth--
			case ',':
				if depth <= 0 {
					end = i
				}
			}
			if end != len(conf) {
				break
			}
		}
		kv := conf[:end]
		conf = strings.TrimPrefix(conf[end:], ",")
		k, v, ok := strings.Cut(kv, ":")
		if !ok {
			continue
		}
		switch k {
		case "max_split_size_mb":
			if n, err := strconv.ParseUint(v, 10, 64); err == nil && n > 0 && n < 1<<40 {
				r.maxSplit = max(n<<20, r.largeSegment)
			}
		case "large_segment_size_mb":
			if n, err := strconv.ParseUint(v, 10, 64); err == nil && n > minLargeAlloc>>20 && n < 1<<40 {
				r.largeSegment = n << 20
			}
		case "expandable_segments":
			r.expandable = v == "True" || v == "true"
		case "roundup_power2_divisions":
			r.parseDivisions(v)
		}
	}
}

// parseDivisions reads a roundup_power2_divisions value: one power of two for every interval, or the list
// form [k:v,...,>:v] in which the first key also covers the intervals below it and ">" those after the last
// key (docs/pytorch-reference.md §2.4, newest parser).
func (r *rules) parseDivisions(v string) {
	var t [roundupIntervals]uint64
	if !strings.HasPrefix(v, "[") {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil || n&(n-1) != 0 || n > 1<<20 {
			return
		}
		for i := range t {
			t[i] = n
		}
		r.setDivisions(t)
		return
	}
	last := -1
	for _, kv := range strings.Split(strings.Trim(v, "[]"), ",") {
		k, val, ok := strings.Cut(kv, ":")
		n, err := strconv.ParseUint(val, 10, 64)
		if !ok || err != nil || n&(n-1) != 0 || n > 1<<20 {
			return
		}
		if k == ">" {
			for i := last + 1; i < roundupIntervals; i++ {
				t[i] = n
			}
			continue
		}
		m, err := strconv.ParseUint(k, 10, 64)
		if err != nil || m == 0 || m&(m-1) != 0 {
			return
		}
		idx := min(bits.Len64(m)-1, roundupIntervals-1)
		if last < 0 {
			for i := 0; i < idx; i++ {
				t[i] = n
			}
		}
		t[idx] = n
		last = idx
	}
	r.setDivisions(t)
}

func (r *rules) setDivisions(t [roundupIntervals]uint64) {
	r.divisions = t
	r.anyDivisions = false
	for _, n := range t {
		if n > 1 {
			r.anyDivisions = true
		}
	}
}
