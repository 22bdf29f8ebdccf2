package torch

import (
	"math"

	"github.com/oomdbg/oomdbg/internal/torchrules"
)

// The caching allocator's constants, from torchrules, the one home of PyTorch's allocator rules.
const (
	smallSize        = torchrules.SmallSize   // kSmallSize: the largest small-pool block request
	smallBuffer      = torchrules.SmallBuffer // kSmallBuffer: small-pool segment size
	roundupIntervals = torchrules.RoundupIntervals
)

// rules are the allocator settings that decide block and segment sizes.
type rules struct {
	maxSplit     uint64 // max_split_size; math.MaxUint64 when unlimited
	largeSegment uint64 // large_segment_size
	divisions    [roundupIntervals]uint64
	anyDivisions bool
	expandable   bool
}

func defaultRules() rules {
	return rules{maxSplit: math.MaxUint64, largeSegment: torchrules.LargeBuffer}
}

// roundSize is round_size: the size a request is served with.
func (r *rules) roundSize(size uint64) uint64 {
	if r.anyDivisions {
		return torchrules.RoundSize(size, &r.divisions)
	}
	return torchrules.RoundSize(size, nil)
}

// allocationSize is get_allocation_size: the segment a request of rounded size would get.
func (r *rules) allocationSize(rounded uint64) uint64 {
	return torchrules.AllocationSize(rounded, r.largeSegment)
}

// splits is should_split for a non-expandable block of size block handed out for a request of rounded size.
func (r *rules) splits(block, rounded uint64) bool {
	return torchrules.ShouldSplit(block, rounded, rounded <= smallSize, r.maxSplit)
}

// applyConf reads the settings the rules need from a PYTORCH_CUDA_ALLOC_CONF string, parsed as PyTorch
// parses it. A string PyTorch would refuse leaves the rules as they are and returns the parser's error: the
// string is still shown to the user verbatim, and the effective values recorded beside it still apply.
func (r *rules) applyConf(conf string) error {
	cfg, err := torchrules.ParseConfig(conf)
	if err != nil {
		return err
	}
	r.maxSplit = cfg.MaxSplit()
	r.largeSegment = cfg.LargeSegment()
	r.expandable = cfg.ExpandableSegments
	r.setDivisions(cfg.RoundupPower2Divisions)
	return nil
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
