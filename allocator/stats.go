package allocator

import "sort"

// Stat is one of PyTorch's counters: its current value, the peak since the last reset, and the totals added
// and removed since the last reset of accumulated stats.
type Stat struct {
	Current   int64
	Peak      int64
	Allocated int64
	Freed     int64
}

func (s *Stat) increase(n uint64) {
	s.Current += int64(n)
	s.Peak = max(s.Peak, s.Current)
	s.Allocated += int64(n)
}

func (s *Stat) decrease(n uint64) {
	s.Current -= int64(n)
	s.Freed += int64(n)
}

// The entries of a StatArray: PyTorch's StatType AGGREGATE, SMALL_POOL, LARGE_POOL.
const (
	statAll       = 0
	statSmallPool = 1
	statLargePool = 2
	numStatTypes  = 3
)

// StatArray is a Stat for all pools together ("all"), the small pool and the large pool.
type StatArray [numStatTypes]Stat

// All returns the stat over both pools.
func (a StatArray) All() Stat { return a[statAll] }

// Small returns the small-pool stat.
func (a StatArray) Small() Stat { return a[statSmallPool] }

// Large returns the large-pool stat.
func (a StatArray) Large() Stat { return a[statLargePool] }

func (a *StatArray) increase(pool int, n uint64) {
	a[statAll].increase(n)
	a[pool].increase(n)
}

func (a *StatArray) decrease(pool int, n uint64) {
	a[statAll].decrease(n)
	a[pool].decrease(n)
}

// Stats mirrors PyTorch's DeviceStats, the data behind torch.cuda.memory_stats().
type Stats struct {
	Allocation         StatArray // allocated blocks
	Segment            StatArray // cudaMalloc segments (expandable segments are not counted, as in PyTorch)
	Active             StatArray // allocated or pending-free blocks
	InactiveSplit      StatArray // free blocks of split, non-expandable segments
	AllocatedBytes     StatArray // bytes of allocated blocks (rounded or unsplit block sizes)
	ReservedBytes      StatArray // bytes of segments and mapped expandable pages
	ActiveBytes        StatArray // bytes of active blocks
	InactiveSplitBytes StatArray // bytes of inactive split blocks: cached memory that cannot be released
	RequestedBytes     StatArray // unrounded bytes requested by active blocks

	NumAllocRetries   int64 // retries after releasing every cached segment
	NumOOMs           int64 // requests that failed with an OutOfMemoryError
	NumSyncAllStreams int64 // synchronize_and_free_events calls
	NumDeviceAlloc    int64 // cudaMalloc calls and expandable map operations
	NumDeviceFree     int64 // cudaFree calls and expandable unmap operations
	// MaxSplitSize is max_split_size in bytes when the allocator was created; -1 means unlimited.
	MaxSplitSize        int64
	OversizeAllocations Stat // allocated blocks of at least max_split_size
	OversizeSegments    Stat // segments of at least max_split_size
}

// Map returns the stats under the flat keys of torch.cuda.memory_stats(), e.g. "allocated_bytes.all.current",
// "reserved_bytes.large_pool.peak", "num_alloc_retries", "oversize_allocations.current".
func (s *Stats) Map() map[string]int64 {
	m := make(map[string]int64, 9*3*4+6+2*4)
	arrays := []struct {
		name string
		a    *StatArray
	}{
		{"allocation", &s.Allocation},
		{"segment", &s.Segment},
		{"active", &s.Active},
		{"inactive_split", &s.InactiveSplit},
		{"allocated_bytes", &s.AllocatedBytes},
		{"reserved_bytes", &s.ReservedBytes},
		{"active_bytes", &s.ActiveBytes},
		{"inactive_split_bytes", &s.InactiveSplitBytes},
		{"requested_bytes", &s.RequestedBytes},
	}
	pools := [numStatTypes]string{"all", "small_pool", "large_pool"}
	for _, arr := range arrays {
		for i, pool := range pools {
			putStat(m, arr.name+"."+pool, arr.a[i])
		}
	}
	m["num_alloc_retries"] = s.NumAllocRetries
	m["num_ooms"] = s.NumOOMs
	m["num_sync_all_streams"] = s.NumSyncAllStreams
	m["num_device_alloc"] = s.NumDeviceAlloc
	m["num_device_free"] = s.NumDeviceFree
	m["max_split_size"] = s.MaxSplitSize
	putStat(m, "oversize_allocations", s.OversizeAllocations)
	putStat(m, "oversize_segments", s.OversizeSegments)
	return m
}

func putStat(m map[string]int64, prefix string, s Stat) {
	m[prefix+".current"] = s.Current
	m[prefix+".peak"] = s.Peak
	m[prefix+".allocated"] = s.Allocated
	m[prefix+".freed"] = s.Freed
}

// StatKeys returns the keys of Map in sorted order, as memory_stats() lists them.
func StatKeys() []string {
	var s Stats
	m := s.Map()
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// resetPeaks sets every peak to its current value (reset_peak_memory_stats).
func (s *Stats) resetPeaks() {
	for _, a := range s.arrays() {
		for i := range a {
			a[i].Peak = a[i].Current
		}
	}
	s.OversizeAllocations.Peak = s.OversizeAllocations.Current
	s.OversizeSegments.Peak = s.OversizeSegments.Current
}

// resetAccumulated zeroes the allocated/freed totals and the event counters (reset_accumulated_memory_stats).
func (s *Stats) resetAccumulated() {
	for _, a := range s.arrays() {
		for i := range a {
			a[i].Allocated, a[i].Freed = 0, 0
		}
	}
	s.NumAllocRetries, s.NumOOMs, s.NumSyncAllStreams, s.NumDeviceAlloc, s.NumDeviceFree = 0, 0, 0, 0, 0
	s.OversizeAllocations.Allocated, s.OversizeAllocations.Freed = 0, 0
	s.OversizeSegments.Allocated, s.OversizeSegments.Freed = 0, 0
}

func (s *Stats) arrays() []*StatArray {
	return []*StatArray{&s.Allocation, &s.Segment, &s.Active, &s.InactiveSplit, &s.AllocatedBytes,
		&s.ReservedBytes, &s.ActiveBytes, &s.InactiveSplitBytes, &s.RequestedBytes}
}

// maxSplitStat is max_split_size as memory_stats reports it: int64 of a size_t, so unlimited is -1.
func maxSplitStat(maxSplit uint64) int64 { return int64(maxSplit) }
