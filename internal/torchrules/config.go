package torchrules

import (
	"math"
	"strconv"
	"strings"
)

// Config holds the caching allocator's settings: what PYTORCH_CUDA_ALLOC_CONF (PYTORCH_ALLOC_CONF) sets,
// plus the memory fraction and the best-fit tie order. The zero value is PyTorch's default configuration;
// ParseConfig builds one from a settings string and String renders it back.
type Config struct {
	// Source is the settings string the Config was parsed from, verbatim, as PyTorch reports it in a
	// snapshot's allocator_settings; "" for a Config built in code.
	Source string

	// Backend is "native" or "" (the same), or "cudaMallocAsync".
	Backend string
	// MaxSplitSize is max_split_size_mb in bytes: cached blocks at least this big are "oversize", never
	// split and reused only by requests of at least this size. 0 means unlimited (PyTorch's SIZE_MAX).
	MaxSplitSize uint64
	// MaxNonSplitRounding is max_non_split_rounding_mb in bytes: how much bigger than an oversize request
	// a reused oversize block may be. 0 means LargeSegmentSize.
	MaxNonSplitRounding uint64
	// LargeSegmentSize is large_segment_size_mb in bytes: the segment size for requests between 1 and
	// 10 MiB and the page size of large-pool expandable segments. 0 means 20 MiB (kLargeBuffer).
	LargeSegmentSize uint64
	// RoundupPower2Divisions is the roundup_power2_divisions table: entry i holds the number of divisions
	// for sizes in [2^i MiB, 2^(i+1) MiB) (entry 0 also covers smaller sizes, entry 15 larger ones); 0 or 1
	// means plain 512-byte rounding.
	RoundupPower2Divisions [RoundupIntervals]uint64
	// GarbageCollectionThreshold is garbage_collection_threshold, in (0, 1); 0 means off. It acts only
	// together with a memory fraction.
	GarbageCollectionThreshold float64
	// ExpandableSegments is expandable_segments: segments that grow by mapping pages instead of one
	// cudaMalloc per segment.
	ExpandableSegments bool
	// PerProcessMemoryFraction is per_process_memory_fraction: the share of the device's total memory the
	// allocator may reserve, as torch.cuda.set_per_process_memory_fraction sets it. 0 (the zero value)
	// and 1 mean no limit.
	PerProcessMemoryFraction float64
	// ThrowOnCudaMallocOOM is throw_on_cudamalloc_oom: a request over the memory fraction fails at once
	// instead of walking the release-and-retry chain.
	ThrowOnCudaMallocOOM bool

	// TieOrder chooses how equal-sized cached blocks are ordered for best fit: PyTorch changed it in 2026.
	// It is not a setting of PyTorch's and String does not render it.
	TieOrder TieOrder

	// Inert holds settings PyTorch accepts that do not decide where device memory goes (the pinned host
	// allocator, lock release around cudaMalloc, graph capture, the address space expandable segments
	// reserve). They are kept, in order, so that String renders them.
	Inert []Setting
}

// Setting is one key:value pair of a settings string; a list value keeps its brackets.
type Setting struct {
	Key, Value string
}

// TieOrder is the order among cached free blocks of the same stream and size.
type TieOrder uint8

const (
	// TieByAddress orders equal-sized blocks by address, lowest first, as PyTorch did up to 2026. It
	// reproduces every reuse in the real traces checked (docs/allocator.md §5) and is the default.
	TieByAddress TieOrder = iota
	// TieBySegment orders equal-sized blocks by the creation order of their segments, then by address,
	// as the newest PyTorch does (PR #183591).
	TieBySegment
)

// DefaultConfig returns PyTorch's default allocator configuration.
func DefaultConfig() Config { return Config{} }

// MaxSplit is max_split_size in bytes, math.MaxUint64 when unlimited. Values below the minimum PyTorch
// accepts (large_segment_size) are raised to it.
func (c Config) MaxSplit() uint64 {
	if c.MaxSplitSize == 0 {
		return math.MaxUint64
	}
	return max(c.MaxSplitSize, c.LargeSegment())
}

// LargeSegment is large_segment_size in bytes. Values PyTorch refuses (10 MiB or less) fall back to the
// default, so that a segment always holds the request it is made for.
func (c Config) LargeSegment() uint64 {
	if c.LargeSegmentSize <= MinLargeAlloc {
		return LargeBuffer
	}
	return c.LargeSegmentSize
}

// MaxNonSplitRoundingSize is max_non_split_rounding_size in bytes.
func (c Config) MaxNonSplitRoundingSize() uint64 {
	if c.MaxNonSplitRounding == 0 {
		return c.LargeSegment()
	}
	return c.MaxNonSplitRounding
}

// Validate checks c against PyTorch's rules for each setting and returns a *ConfigError with PyTorch's
// message for the first one broken. Configs from ParseConfig are always valid.
func (c Config) Validate() error {
	if c.Backend != "" && c.Backend != "native" && c.Backend != "cudaMallocAsync" {
		return &ConfigError{Key: "backend", Msg: "Unknown allocator backend, options are native and cudaMallocAsync"}
	}
	if c.LargeSegmentSize != 0 && (c.LargeSegmentSize <= MinLargeAlloc || c.LargeSegmentSize%mib != 0) {
		return &ConfigError{Key: "large_segment_size_mb", Msg: "CachingAllocator option large_segment_size_mb must be > 10 MB"}
	}
	minSplit := c.LargeSegment()
	if c.MaxSplitSize != 0 && (c.MaxSplitSize < minSplit || c.MaxSplitSize%mib != 0) {
		return &ConfigError{Key: "max_split_size_mb", Msg: "CachingAllocator option max_split_size_mb too small, must be >= " + strconv.FormatUint(minSplit/mib, 10)}
	}
	if c.MaxNonSplitRounding != 0 && (c.MaxNonSplitRounding < minSplit || c.MaxNonSplitRounding%mib != 0) {
		return &ConfigError{Key: "max_non_split_rounding_mb", Msg: "CachingAllocator option max_non_split_rounding_mb too small, must be >= " + strconv.FormatUint(minSplit/mib, 10)}
	}
	for _, d := range c.RoundupPower2Divisions {
		if d != 0 && d&(d-1) != 0 {
			return &ConfigError{Key: "roundup_power2_divisions", Msg: "For roundups, the divisions has to be power of 2 or 0 to disable roundup "}
		}
	}
	if g := c.GarbageCollectionThreshold; g != 0 && !(g > 0 && g < 1) {
		return &ConfigError{Key: "garbage_collection_threshold", Msg: "garbage_collect_threshold is invalid, set it in (0.0, 1.0)"}
	}
	if f := c.PerProcessMemoryFraction; !(f >= 0 && f <= 1) {
		return &ConfigError{Key: "per_process_memory_fraction", Msg: "per_process_memory_fraction is invalid, set it in [0.0, 1.0]"}
	}
	return nil
}

// String renders c as a canonical settings string: every setting that differs from PyTorch's default, in
// a fixed order, then the inert ones. ParseConfig(c.String()) gives back c (but for Source). The default
// configuration renders as "".
func (c Config) String() string {
	var parts []string
	add := func(k, v string) { parts = append(parts, k+":"+v) }
	if c.Backend != "" && c.Backend != "native" {
		add("backend", c.Backend)
	}
	if c.LargeSegmentSize != 0 {
		add("large_segment_size_mb", strconv.FormatUint(c.LargeSegmentSize/mib, 10))
	}
	if c.MaxSplitSize != 0 {
		add("max_split_size_mb", strconv.FormatUint(c.MaxSplitSize/mib, 10))
	}
	if c.MaxNonSplitRounding != 0 {
		add("max_non_split_rounding_mb", strconv.FormatUint(c.MaxNonSplitRounding/mib, 10))
	}
	if v := renderDivisions(&c.RoundupPower2Divisions); v != "" {
		add("roundup_power2_divisions", v)
	}
	if c.GarbageCollectionThreshold != 0 {
		add("garbage_collection_threshold", strconv.FormatFloat(c.GarbageCollectionThreshold, 'g', -1, 64))
	}
	if c.ExpandableSegments {
		add("expandable_segments", "True")
	}
	if c.PerProcessMemoryFraction != 0 {
		add("per_process_memory_fraction", strconv.FormatFloat(c.PerProcessMemoryFraction, 'g', -1, 64))
	}
	if c.ThrowOnCudaMallocOOM {
		add("throw_on_cudamalloc_oom", "True")
	}
	for _, s := range c.Inert {
		add(s.Key, s.Value)
	}
	return strings.Join(parts, ",")
}

// Includes reports whether every setting other makes (those that differ from PyTorch's defaults, as String
// renders them) is already made, with the same value, in c: a fix of other's settings would change nothing
// in a run under c. Inert settings do not count.
func (c Config) Includes(other Config) bool {
	c.Inert, other.Inert = nil, nil
	have := map[string]bool{}
	for _, kv := range strings.Split(c.String(), ",") {
		have[kv] = true
	}
	for _, kv := range strings.Split(other.String(), ",") {
		if kv != "" && !have[kv] {
			return false
		}
	}
	return true
}

// renderDivisions writes the roundup table in the shortest form the parser reads back exactly: a single
// power of two when all entries agree, otherwise a list whose first key also covers the intervals below
// it and whose ">" covers the trailing run. Keys between are explicit, since the parser leaves unlisted
// entries at 0.
func renderDivisions(t *[RoundupIntervals]uint64) string {
	last := t[RoundupIntervals-1]
	end := -1 // last index whose value differs from the final run
	for i := RoundupIntervals - 1; i >= 0; i-- {
		if t[i] != last {
			end = i
			break
		}
	}
	if end < 0 {
		if last == 0 || last&(last-1) != 0 {
			return "" // all zero: the default; not a power of two: cannot be written as one value
		}
		return strconv.FormatUint(last, 10)
	}
	first := 0 // the first key fills every interval below it, so skip the leading run
	for first < end && t[first+1] == t[0] {
		first++
	}
	var b strings.Builder
	b.WriteByte('[')
	for i := first; i <= end; i++ {
		if i > first {
			b.WriteByte(',')
		}
		b.WriteString(strconv.FormatUint(1<<i, 10))
		b.WriteByte(':')
		b.WriteString(strconv.FormatUint(t[i], 10))
	}
	if end < RoundupIntervals-1 {
		b.WriteString(",>:")
		b.WriteString(strconv.FormatUint(last, 10))
	}
	b.WriteByte(']')
	return b.String()
}
