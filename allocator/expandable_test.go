package allocator

import (
	"errors"
	"testing"
)

// reservation returns the size an expandable segment reserves on a device of the given capacity.
func reservation(capacity, page uint64) uint64 {
	return (capacity + capacity/8 + page - 1) / page * page
}

// TestExpandableMapAndUnmap follows one small and one large expandable segment through mapping, reuse and
// empty_cache: 2 MiB pages for the small pool, 20 MiB for the large, one segment_map per map, unmapping
// only whole free pages.
func TestExpandableMapAndUnmap(t *testing.T) {
	e := newEnv(t, gib, 0, "expandable_segments:True")
	small := uint64(simReserveBase)
	large := small + reservation(gib, SmallBuffer)

	x := e.malloc(1000, 0)
	wantEvents(t, e.rec.events, []traceEvent{
		{Action: "segment_map", Addr: small, Size: SmallBuffer},
		{Action: "alloc", Addr: small, Size: 1000, Block: 1024},
	})
	if x != small {
		t.Fatalf("small block at %#x, want %#x", x, small)
	}

	mark := len(e.rec.events)
	a := e.malloc(5*mib, 0) // one 20 MiB page; the remainder is split off (small-pool rule)
	b := e.malloc(30*mib, 0)
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "segment_map", Addr: large, Size: LargeBuffer},
		{Action: "alloc", Addr: large, Size: 5 * mib, Block: 5 * mib},
		// 30 MiB: the 15 MiB free block plus one more page mapped after it.
		{Action: "segment_map", Addr: large + LargeBuffer, Size: LargeBuffer},
		{Action: "alloc", Addr: large + 5*mib, Size: 30 * mib, Block: 30 * mib},
	})
	if a != large || b != large+5*mib {
		t.Fatalf("blocks at %#x %#x", a, b)
	}
	segs := e.a.Segments()
	if len(segs) != 2 || !segs[0].Expandable || segs[0].Size != SmallBuffer || segs[1].Size != 2*LargeBuffer ||
		segs[1].Pool != PoolLarge || len(segs[1].Blocks) != 3 {
		t.Fatalf("segments %+v", segs)
	}
	st := e.a.Stats()
	if st.ReservedBytes.All().Current != SmallBuffer+2*LargeBuffer || st.Segment.All().Current != 0 || st.NumDeviceAlloc != 3 {
		t.Fatalf("reserved %d segments %d device allocs %d", st.ReservedBytes.All().Current, st.Segment.All().Current, st.NumDeviceAlloc)
	}
	checkInvariants(t, e)

	// b freed, a kept: only the second page [20, 40) MiB is wholly free.
	e.free(b)
	mark = len(e.rec.events)
	if err := e.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, e.rec.since(mark), []traceEvent{{Action: "segment_unmap", Addr: large + LargeBuffer, Size: LargeBuffer}})
	checkInvariants(t, e)

	e.free(a)
	e.free(x)
	mark = len(e.rec.events)
	if err := e.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "segment_unmap", Addr: large, Size: LargeBuffer},
		{Action: "segment_unmap", Addr: small, Size: SmallBuffer},
	})
	st = e.a.Stats()
	if st.ReservedBytes.All().Current != 0 || st.NumDeviceFree != 3 || len(e.a.expandable) != 0 || e.dev.Used() != 0 {
		t.Fatalf("after empty_cache: reserved %d device frees %d segments %d", st.ReservedBytes.All().Current, st.NumDeviceFree, len(e.a.expandable))
	}
	if len(e.dev.reservations) != 0 {
		t.Fatalf("%d reservations left", len(e.dev.reservations))
	}
}

// TestExpandablePageSize checks large_segment_size_mb sets the large pool's page size.
func TestExpandablePageSize(t *testing.T) {
	for conf, page := range map[string]uint64{
		"expandable_segments:True":                          20 * mib,
		"expandable_segments:True,large_segment_size_mb:40": 40 * mib,
	} {
		e := newEnv(t, gib, 0, conf)
		e.malloc(5*mib, 0)
		e.malloc(100, 0)
		if ev := e.rec.events; ev[0].Size != page || ev[2].Size != SmallBuffer {
			t.Errorf("%s: mapped %d and %d, want %d and %d", conf, ev[0].Size, ev[2].Size, page, SmallBuffer)
		}
	}
}

// TestExpandablePerStream checks each stream gets its own segment.
func TestExpandablePerStream(t *testing.T) {
	e := newEnv(t, gib, 0, "expandable_segments:True")
	a := e.malloc(5*mib, 1)
	b := e.malloc(5*mib, 2)
	c := e.malloc(5*mib, 1)
	if len(e.a.expandable) != 2 || c != a+5*mib || b < a+reservation(gib, LargeBuffer) {
		t.Fatalf("segments %d, blocks %#x %#x %#x", len(e.a.expandable), a, b, c)
	}
}

// TestExpandableBestFit checks best fit counts a block followed by unmapped space at the size it could grow
// to, so an exact-size block at the growing end loses to a bigger block elsewhere.
func TestExpandableBestFit(t *testing.T) {
	e := newEnv(t, gib, 0, "expandable_segments:True")
	a := e.malloc(12*mib, 0) // [0, 12)
	e.malloc(8*mib, 0)       // [12, 20)
	e.malloc(10*mib, 0)      // [20, 30), page [20, 40) mapped: [30, 40) free, then unmapped
	e.free(a)
	if got := e.malloc(10*mib, 0); got != a {
		t.Fatalf("got %#x, want the 12 MiB block at %#x over the growable 10 MiB one", got, a)
	}
}

// TestExpandableOOMUnmaps checks that an OOM retry unmaps another stream's free pages to make room.
func TestExpandableOOMUnmaps(t *testing.T) {
	e := newEnv(t, 256*mib, 0, "expandable_segments:True")
	x := e.malloc(100*mib, 0)
	e.free(x)
	mark := len(e.rec.events)
	y := e.malloc(200*mib, 1) // 100 MiB mapped for stream 0, 156 MiB free: release, retry
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "segment_unmap", Addr: x, Size: 100 * mib},
		{Action: "segment_map", Addr: y, Size: 200 * mib},
		{Action: "alloc", Addr: y, Size: 200 * mib},
	})
	if st := e.a.Stats(); st.NumAllocRetries != 1 || st.ReservedBytes.All().Current != 200*mib {
		t.Fatalf("retries %d reserved %d", st.NumAllocRetries, st.ReservedBytes.All().Current)
	}
	checkInvariants(t, e)
	// Out of memory for good: the OOM message still prints alloc_size.
	_, err := e.a.Malloc(100*mib, 1)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || oom.AllocSize != 100*mib || oom.Rounded != 100*mib {
		t.Fatalf("Malloc: %v", err)
	}
	checkInvariants(t, e)
}

// TestExpandableSwitchedOff checks that once expandable_segments is turned off, best fit skips the
// expandable blocks and new memory comes from cudaMalloc.
func TestExpandableSwitchedOff(t *testing.T) {
	e := newEnv(t, gib, 0, "expandable_segments:True")
	x := e.malloc(5*mib, 0)
	e.free(x)
	e.a.SetConfig(Config{})
	mark := len(e.rec.events)
	y := e.malloc(5*mib, 0)
	if y == x || e.rec.actions(mark) != "segment_alloc,alloc" {
		t.Fatalf("got %#x (expandable block %#x), events %s", y, x, e.rec.actions(mark))
	}
	if segs := e.a.Segments(); len(segs) != 2 || segs[0].Expandable == segs[1].Expandable {
		t.Fatalf("segments %+v", segs)
	}
	checkInvariants(t, e)
}
