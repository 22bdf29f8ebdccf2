package allocator

import (
	"reflect"
	"testing"
)

// TestTraceOrder pins the order of trace events: segment_alloc immediately before the alloc it serves,
// at the same address; free_requested immediately followed by free_completed without cross-stream use.
func TestTraceOrder(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	addr := e.malloc(1000, 0)
	e.free(addr)
	wantEvents(t, e.rec.events, []traceEvent{
		{Action: "segment_alloc", Addr: addr, Size: SmallBuffer},
		{Action: "alloc", Addr: addr, Size: 1000, Block: 1024},
		{Action: "free_requested", Addr: addr, Size: 1000, Block: 1024},
		{Action: "free_completed", Addr: addr, Size: 1000, Block: 1024},
	})
	if addr != simMallocBase {
		t.Fatalf("first segment at %#x, want %#x", addr, simMallocBase)
	}
	// A cached block is reused without a segment event.
	mark := len(e.rec.events)
	again := e.malloc(900, 0)
	wantEvents(t, e.rec.since(mark), []traceEvent{{Action: "alloc", Addr: addr, Size: 900, Block: 1024}})
	if again != addr {
		t.Fatalf("reuse at %#x, want %#x", again, addr)
	}
}

// TestBestFitLowestAddress checks that among equal-sized cached blocks the lowest address wins, and that
// the smallest block that fits is preferred over a bigger one at a lower address.
func TestBestFitLowestAddress(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	var addrs []uint64
	for range 6 {
		addrs = append(addrs, e.malloc(4096, 0))
	}
	// Free blocks 3 and 1 (4 KiB each, kept apart by allocated blocks), in that order.
	e.free(addrs[3])
	e.free(addrs[1])
	if got := e.malloc(4096, 0); got != addrs[1] {
		t.Fatalf("got %#x, want the lowest 4 KiB block %#x", got, addrs[1])
	}
	// Make a bigger free block below block 3: the exact fit still wins.
	e.free(addrs[0])
	e.free(addrs[1]) // merges with block 0 into 8 KiB at addrs[0]
	if got := e.malloc(4096, 0); got != addrs[3] {
		t.Fatalf("got %#x, want the exact-fit block %#x over the bigger lower one at %#x", got, addrs[3], addrs[0])
	}
}

// TestTieOrderBySegment checks the newest PyTorch's order: among equal sizes, the older segment first even
// at a higher address.
func TestTieOrderBySegment(t *testing.T) {
	for _, tc := range []struct {
		order TieOrder
		older bool // whether the block of the older segment (at the higher address) is reused
	}{{TieByAddress, false}, {TieBySegment, true}} {
		e := newEnvConfig(t, 4*gib, 0, Config{TieOrder: tc.order})
		s1 := e.malloc(4096, 5) // segment 1 at the base, on another stream so that it can be emptied
		s2 := e.malloc(4096, 0) // segment 2
		e.malloc(4096, 0)
		e.malloc(mib, 0)
		e.malloc(mib-8192, 0) // segment 2 is full
		e.free(s1)
		if err := e.a.EmptyCache(); err != nil { // segment 1 goes back; its address is free again
			t.Fatal(err)
		}
		s3 := e.malloc(4096, 0) // segment 3 reuses the base address, below segment 2
		e.malloc(4096, 0)
		if s3 != s1 || s3 >= s2 {
			t.Fatalf("segment 3 at %#x, want %#x below segment 2 (%#x)", s3, s1, s2)
		}
		e.free(s2)
		e.free(s3)
		want := s3
		if tc.older {
			want = s2
		}
		if got := e.malloc(4096, 0); got != want {
			t.Errorf("tie order %d: reused %#x, want %#x", tc.order, got, want)
		}
	}
}

// TestStreamsNeverShare checks that a block cached on one stream is never handed out on another.
func TestStreamsNeverShare(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	a := e.malloc(3*mib, 1)
	e.free(a)
	b := e.malloc(3*mib, 2)
	if b == a || len(e.a.Segments()) != 2 {
		t.Fatalf("stream 2 got %#x (stream 1's block %#x); segments %d", b, a, len(e.a.Segments()))
	}
	if c := e.malloc(3*mib, 1); c != a {
		t.Fatalf("stream 1 got %#x, want its cached %#x", c, a)
	}
	// A stream ordered before this one in the pool must not be picked either (lower_bound lands on the
	// next stream's blocks).
	e2 := newEnv(t, 4*gib, 0, "")
	x := e2.malloc(5*mib, 7)
	e2.free(x)
	if y := e2.malloc(5*mib, 3); y == x {
		t.Fatal("stream 3 reused stream 7's block")
	}
}

// TestOversizeRules checks the one-candidate rules with max_split_size: a normal request never takes an
// oversize block; an oversize request takes one only within max_non_split_rounding of its size, whole.
func TestOversizeRules(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "max_split_size_mb:100")
	big := e.malloc(300*mib, 0)
	e.free(big)
	mark := len(e.rec.events)
	// A 2 MiB request finds the 300 MiB block first and gives up on the cache.
	small := e.malloc(2*mib, 0)
	if small == big || e.rec.actions(mark) != "segment_alloc,alloc" {
		t.Fatalf("normal request: got %#x, events %s; want a new segment", small, e.rec.actions(mark))
	}
	// 250 MiB: oversize, but the 300 MiB block is 50 MiB bigger, over the 20 MiB limit.
	mark = len(e.rec.events)
	x := e.malloc(250*mib, 0)
	if x == big || e.rec.actions(mark) != "segment_alloc,alloc" {
		t.Fatalf("oversize request beyond slack reused the block (events %s)", e.rec.actions(mark))
	}
	// 290 MiB: within 20 MiB; the block is handed out whole.
	y := e.malloc(290*mib, 0)
	if y != big || e.blockSize(y) != 300*mib {
		t.Fatalf("got %#x of %d bytes, want the whole cached block %#x", y, e.blockSize(y), big)
	}
	st := e.a.Stats()
	if st.OversizeAllocations.Current != 2 || st.OversizeSegments.Current != 2 || st.MaxSplitSize != 100*mib {
		t.Fatalf("oversize allocations %d segments %d max_split_size %d", st.OversizeAllocations.Current, st.OversizeSegments.Current, st.MaxSplitSize)
	}
	// Exactly max_non_split_rounding of slack is too much.
	e4 := newEnv(t, 4*gib, 0, "max_split_size_mb:100")
	b300 := e4.malloc(300*mib, 0)
	e4.free(b300)
	if got := e4.malloc(280*mib, 0); got == b300 {
		t.Fatal("a 280 MiB request took a 300 MiB block: slack must stay under 20 MiB")
	}
	// A block of exactly max_split_size is oversize too.
	e3 := newEnv(t, 4*gib, 0, "max_split_size_mb:100")
	edge := e3.malloc(100*mib, 0)
	e3.free(edge)
	if got := e3.malloc(2*mib, 0); got == edge {
		t.Fatal("a normal request took a block of exactly max_split_size")
	}
	// Without max_split_size the 2 MiB request would have split the big block.
	e2 := newEnv(t, 4*gib, 0, "")
	big2 := e2.malloc(300*mib, 0)
	e2.free(big2)
	if got := e2.malloc(2*mib, 0); got != big2 || e2.a.Stats().MaxSplitSize != -1 {
		t.Fatalf("without max_split_size: got %#x, want %#x split", got, big2)
	}
}

// TestNonSplitRoundingSetting checks max_non_split_rounding_mb widens the oversize slack.
func TestNonSplitRoundingSetting(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "max_split_size_mb:100,max_non_split_rounding_mb:64")
	big := e.malloc(300*mib, 0)
	e.free(big)
	if got := e.malloc(250*mib, 0); got != big || e.blockSize(got) != 300*mib {
		t.Fatalf("got %#x, want the 300 MiB block within 64 MiB of slack", got)
	}
}

func TestShouldSplit(t *testing.T) {
	a := New(NewSimDevice(0, gib, 0), Config{MaxSplitSize: 100 * mib})
	tests := map[string]struct {
		small      bool
		block      uint64
		size       uint64
		expandable bool
		want       bool
	}{
		"small 512 left":             {true, 1536, 1024, false, true},
		"small 0 left":               {true, 1024, 1024, false, false},
		"large exactly 1 MiB left":   {false, 20 * mib, 19 * mib, false, false},
		"large 1 MiB + 512 left":     {false, 20 * mib, 19*mib - 512, false, true},
		"large oversize request":     {false, 300 * mib, 100 * mib, false, false},
		"large just under max split": {false, 300 * mib, 100*mib - 512, false, true},
		"expandable 512 left":        {false, 20 * mib, 20*mib - 512, true, true},
		"expandable oversize":        {false, 300 * mib, 200 * mib, true, true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pool := &a.large
			if tc.small {
				pool = &a.small
			}
			b := &block{size: tc.block, pool: pool}
			if got := a.shouldSplit(b, tc.size, tc.expandable); got != tc.want {
				t.Fatalf("shouldSplit = %v, want %v", got, tc.want)
			}
		})
	}
}

// TestSplitThresholds drives the split rules through Malloc and checks the block sizes handed out.
func TestSplitThresholds(t *testing.T) {
	t.Run("large", func(t *testing.T) {
		e := newEnv(t, 4*gib, 0, "")
		x := e.malloc(19*mib, 0) // a 20 MiB segment: 1 MiB left is not > 1 MiB
		if e.blockSize(x) != 20*mib {
			t.Fatalf("19 MiB in a fresh 20 MiB segment: block %d, want the whole segment", e.blockSize(x))
		}
		e.free(x)
		y := e.malloc(18*mib+512*kib, 0) // 1.5 MiB left: split
		if y != x || e.blockSize(y) != 18*mib+512*kib {
			t.Fatalf("18.5 MiB: block %d at %#x", e.blockSize(y), y)
		}
		if st := e.a.Stats(); st.InactiveSplit.Large().Current != 1 || st.InactiveSplitBytes.Large().Current != 1536*kib {
			t.Fatalf("inactive_split %d / %d bytes, want 1 / 1.5 MiB", st.InactiveSplit.Large().Current, st.InactiveSplitBytes.Large().Current)
		}
		if st := e.a.Stats(); st.AllocatedBytes.All().Current != 18*mib+512*kib || st.RequestedBytes.All().Current != 18*mib+512*kib {
			t.Fatalf("allocated %d requested %d", st.AllocatedBytes.All().Current, st.RequestedBytes.All().Current)
		}
		z := e.malloc(9*mib, 0) // 9 MiB request: new 20 MiB segment, 11 MiB left: split
		if e.blockSize(z) != 9*mib {
			t.Fatalf("9 MiB: block %d", e.blockSize(z))
		}
	})
	t.Run("small", func(t *testing.T) {
		e := newEnv(t, 4*gib, 0, "")
		a := e.malloc(1536, 0)
		_ = e.malloc(512, 0)
		e.free(a)
		b := e.malloc(1024, 0) // 1536-byte block, 512 left: split
		if b != a || e.blockSize(b) != 1024 {
			t.Fatalf("1024 from 1536: got %#x size %d", b, e.blockSize(b))
		}
		c := e.malloc(512, 0) // the 512-byte remainder, exact
		if c != a+1024 || e.blockSize(c) != 512 {
			t.Fatalf("512: got %#x size %d, want %#x", c, e.blockSize(c), a+1024)
		}
		if st := e.a.Stats(); st.AllocatedBytes.Small().Current != 2048 || st.InactiveSplit.Small().Current != 1 {
			t.Fatalf("small allocated %d inactive_split %d", st.AllocatedBytes.Small().Current, st.InactiveSplit.Small().Current)
		}
	})
}

// TestMerging checks that freed blocks merge with free neighbours into the whole segment again, that
// stats for inactive split blocks go back to zero, and that blocks of different segments never merge.
func TestMerging(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	a := e.malloc(mib, 0)
	b := e.malloc(512*kib, 0)
	c := e.malloc(256*kib, 0)
	d := e.malloc(mib, 0) // second segment, right after the first in address space
	if b != a+mib || c != b+512*kib || d != a+SmallBuffer {
		t.Fatalf("layout %#x %#x %#x %#x", a, b, c, d)
	}
	e.free(a)
	e.free(c) // merges with the tail
	// Inactive split blocks: a, c merged with segment 1's tail, and segment 2's tail.
	if st := e.a.Stats(); st.InactiveSplit.Small().Current != 3 {
		t.Fatalf("inactive_split %d, want 3", st.InactiveSplit.Small().Current)
	}
	e.free(b) // merges with both
	segs := e.a.Segments()
	if len(segs) != 2 || len(segs[0].Blocks) != 1 || segs[0].Blocks[0].Size != SmallBuffer || segs[0].Blocks[0].State != StateInactive {
		t.Fatalf("segments after merging: %+v", segs)
	}
	st := e.a.Stats()
	if st.InactiveSplit.All().Current != 1 || st.InactiveSplitBytes.All().Current != SmallBuffer-mib {
		// Segment 2 still has d allocated and its 1 MiB tail cached.
		t.Fatalf("inactive_split %d / %d", st.InactiveSplit.All().Current, st.InactiveSplitBytes.All().Current)
	}
	e.free(d)
	if segs := e.a.Segments(); len(segs) != 2 || len(segs[1].Blocks) != 1 {
		t.Fatalf("adjacent segments merged or second segment not whole: %+v", segs)
	}
	checkInvariants(t, e)
}

// TestSegmentsShape checks the state report: address order, block states, pools, requested sizes.
func TestSegmentsShape(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	x := e.malloc(1000, 0)
	y := e.malloc(5*mib, 3)
	if err := e.a.RecordStream(y, 9); err != nil {
		t.Fatal(err)
	}
	e.free(y) // pending: used on stream 9
	want := []Segment{
		{Stream: 0, Addr: x, Size: SmallBuffer, Pool: PoolSmall, Blocks: []Block{
			{Addr: x, Size: 1024, Requested: 1000, State: StateActiveAllocated},
			{Addr: x + 1024, Size: SmallBuffer - 1024, State: StateInactive},
		}},
		{Stream: 3, Addr: y, Size: LargeBuffer, Pool: PoolLarge, Blocks: []Block{
			{Addr: y, Size: 5 * mib, Requested: 5 * mib, State: StateActivePendingFree},
			{Addr: y + 5*mib, Size: 15 * mib, State: StateInactive},
		}},
	}
	got := e.a.Segments()
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Segments() =\n %+v\nwant\n %+v", got, want)
	}
	if got[0].AllocatedSize() != 1024 || got[1].ActiveSize() != 5*mib || got[1].AllocatedSize() != 0 {
		t.Fatal("segment size helpers")
	}
}

func TestZeroAndBadAddresses(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	if addr, err := e.a.Malloc(0, 0); addr != 0 || err != nil || len(e.rec.events) != 0 {
		t.Fatalf("Malloc(0) = %#x, %v, events %v", addr, err, e.rec.events)
	}
	if err := e.a.Free(0); err != nil {
		t.Fatalf("Free(0): %v", err)
	}
	if err := e.a.Free(0x1234); err == nil || err.Error() != "invalid device pointer: 0x1234" {
		t.Fatalf("Free(bad) = %v", err)
	}
	x := e.malloc(100, 0)
	e.free(x)
	if err := e.a.Free(x); err == nil {
		t.Fatal("double free accepted")
	}
	if err := e.a.RecordStream(x, 1); err == nil {
		t.Fatal("RecordStream on a free block accepted")
	}
	if _, ok := e.a.BlockSize(x); ok {
		t.Fatal("BlockSize of a free block")
	}
}

func TestStatsMapKeys(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	x := e.malloc(3*mib, 0)
	e.free(x)
	e.malloc(100, 0)
	st := e.a.Stats()
	m := st.Map()
	want := map[string]int64{
		"allocated_bytes.all.current":        512,
		"allocated_bytes.all.peak":           3 * mib,
		"allocated_bytes.all.allocated":      3*mib + 512,
		"allocated_bytes.all.freed":          3 * mib,
		"allocated_bytes.small_pool.current": 512,
		"allocated_bytes.large_pool.peak":    3 * mib,
		"reserved_bytes.all.current":         LargeBuffer + SmallBuffer,
		"segment.all.current":                2,
		"segment.large_pool.current":         1,
		"allocation.all.current":             1,
		"requested_bytes.all.current":        100,
		"active.all.peak":                    1,
		"inactive_split.large_pool.current":  0,
		"inactive_split_bytes.all.current":   SmallBuffer - 512,
		"num_alloc_retries":                  0,
		"num_ooms":                           0,
		"num_sync_all_streams":               0,
		"num_device_alloc":                   2,
		"num_device_free":                    0,
		"max_split_size":                     -1,
		"oversize_allocations.current":       0,
		"oversize_segments.peak":             0,
	}
	for k, v := range want {
		got, ok := m[k]
		if !ok || got != v {
			t.Errorf("%s = %d (present %v), want %d", k, got, ok, v)
		}
	}
	if n := len(StatKeys()); n != len(m) || n != 9*3*4+6+2*4 {
		t.Errorf("%d keys, want %d", n, 9*3*4+6+2*4)
	}
	e.free(e.malloc(10*mib, 0))
	e.a.ResetPeakStats()
	st = e.a.Stats()
	if st.AllocatedBytes.All().Peak != st.AllocatedBytes.All().Current || st.ReservedBytes.All().Peak != st.ReservedBytes.All().Current {
		t.Fatalf("after ResetPeakStats: allocated peak %d current %d", st.AllocatedBytes.All().Peak, st.AllocatedBytes.All().Current)
	}
	e.a.ResetAccumulatedStats()
	st = e.a.Stats()
	if st.AllocatedBytes.All().Allocated != 0 || st.NumDeviceAlloc != 0 || st.AllocatedBytes.All().Current != 512 {
		t.Fatalf("after ResetAccumulatedStats: %+v", st.AllocatedBytes.All())
	}
}

// TestPoolChoice checks that the pool follows the rounded size: up to 1 MiB small (2 MiB segments),
// above it large.
func TestPoolChoice(t *testing.T) {
	tests := map[string]struct {
		size    uint64
		segment uint64
		pool    string
	}{
		"1 byte":         {1, SmallBuffer, PoolSmall},
		"1 MiB - 1":      {mib - 1, SmallBuffer, PoolSmall},
		"1 MiB":          {mib, SmallBuffer, PoolSmall},
		"1 MiB + 1":      {mib + 1, LargeBuffer, PoolLarge},
		"9 MiB":          {9 * mib, LargeBuffer, PoolLarge},
		"300 KB request": {300_000, SmallBuffer, PoolSmall},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, 4*gib, 0, "")
			addr := e.malloc(tc.size, 0)
			segs := e.a.Segments()
			if len(segs) != 1 || segs[0].Size != tc.segment || segs[0].Pool != tc.pool || segs[0].Addr != addr {
				t.Fatalf("segments %+v, want one %s segment of %d at %#x", segs, tc.pool, tc.segment, addr)
			}
		})
	}
}
