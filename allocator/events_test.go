package allocator

import "testing"

// TestRecordStream checks a block used on other streams stays active_pending_free after Free until the
// next Malloc completes its events: free_requested at Free, free_completed just before that Malloc's events.
func TestRecordStream(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	x := e.malloc(4*mib, 0)
	for _, s := range []int64{0, 9, 9, 5} { // own stream ignored, duplicates once
		if err := e.a.RecordStream(x, s); err != nil {
			t.Fatal(err)
		}
	}
	mark := len(e.rec.events)
	e.free(x)
	wantEvents(t, e.rec.since(mark), []traceEvent{{Action: "free_requested", Addr: x, Size: 4 * mib, Block: 4 * mib}})
	st := e.a.Stats()
	if st.Allocation.All().Current != 0 || st.AllocatedBytes.All().Current != 0 || st.Active.All().Current != 1 ||
		st.ActiveBytes.All().Current != 4*mib || st.RequestedBytes.All().Current != 4*mib {
		t.Fatalf("pending free: allocation %d allocated %d active %d active bytes %d requested %d",
			st.Allocation.All().Current, st.AllocatedBytes.All().Current, st.Active.All().Current,
			st.ActiveBytes.All().Current, st.RequestedBytes.All().Current)
	}
	if segs := e.a.Segments(); segs[0].Blocks[0].State != StateActivePendingFree {
		t.Fatalf("state %s, want %s", segs[0].Blocks[0].State, StateActivePendingFree)
	}
	checkInvariants(t, e)
	// The next request first completes the events (model: the other streams' work is done by now), so
	// the block is cached again and reused.
	mark = len(e.rec.events)
	y := e.malloc(4*mib, 0)
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "free_completed", Addr: x, Size: 4 * mib, Block: 4 * mib},
		{Action: "alloc", Addr: x, Size: 4 * mib},
	})
	if y != x {
		t.Fatalf("after the events completed the block should be reused: got %#x want %#x", y, x)
	}
	if st := e.a.Stats(); st.NumSyncAllStreams != 0 || st.Active.All().Current != 1 {
		t.Fatalf("syncs %d active %d", st.NumSyncAllStreams, st.Active.All().Current)
	}
	checkInvariants(t, e)

	// Uses on the block's own stream need no event: the free completes at once.
	z := e.malloc(1000, 4)
	if err := e.a.RecordStream(z, 4); err != nil {
		t.Fatal(err)
	}
	mark = len(e.rec.events)
	e.free(z)
	if got := e.rec.actions(mark); got != "free_requested,free_completed" {
		t.Fatalf("free after record_stream on the own stream: %s", got)
	}
}

// TestSynchronizeCompletesEvents checks Synchronize and EmptyCache complete pending frees at once.
func TestSynchronizeCompletesEvents(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	x := e.malloc(1000, 0)
	if err := e.a.RecordStream(x, 2); err != nil {
		t.Fatal(err)
	}
	e.free(x)
	mark := len(e.rec.events)
	e.a.Synchronize()
	wantEvents(t, e.rec.since(mark), []traceEvent{{Action: "free_completed", Addr: x, Size: 1000}})
	if st := e.a.Stats(); st.NumSyncAllStreams != 1 || st.Active.All().Current != 0 {
		t.Fatalf("syncs %d active %d", st.NumSyncAllStreams, st.Active.All().Current)
	}

	// EmptyCache: the block completes, merges, and its now whole segment is released.
	y := e.malloc(1000, 0)
	if err := e.a.RecordStream(y, 2); err != nil {
		t.Fatal(err)
	}
	e.free(y)
	mark = len(e.rec.events)
	if err := e.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if got := e.rec.actions(mark); got != "free_completed,segment_free" {
		t.Fatalf("EmptyCache events %s", got)
	}
}

// TestPendingBlockDoesNotMerge checks a neighbour freed while a block waits on events does not merge with
// it, and that both merge once the events complete.
func TestPendingBlockDoesNotMerge(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	a := e.malloc(4096, 0)
	b := e.malloc(4096, 0)
	e.malloc(4096, 0)
	if err := e.a.RecordStream(a, 3); err != nil {
		t.Fatal(err)
	}
	e.free(a) // pending
	e.free(b) // free, but its neighbour a is pending
	segs := e.a.Segments()
	if n := len(segs[0].Blocks); n != 4 {
		t.Fatalf("%d blocks, want 4 (a pending, b free, c, tail)", n)
	}
	checkInvariants(t, e)
	e.a.Synchronize()
	segs = e.a.Segments()
	if len(segs[0].Blocks) != 3 || segs[0].Blocks[0].Size != 8192 || segs[0].Blocks[0].State != StateInactive {
		t.Fatalf("after sync: %+v", segs[0].Blocks)
	}
	checkInvariants(t, e)
}

// TestPendingBlockOnTwoStreams checks the block is freed only when its last event completes, once.
func TestPendingBlockOnTwoStreams(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	x := e.malloc(1000, 0)
	for _, s := range []int64{7, 3} {
		if err := e.a.RecordStream(x, s); err != nil {
			t.Fatal(err)
		}
	}
	e.free(x)
	if b := e.a.live[x]; b != nil {
		t.Fatal("pending block still live")
	}
	mark := len(e.rec.events)
	e.a.Synchronize()
	if got := e.rec.actions(mark); got != "free_completed" {
		t.Fatalf("events %s, want one free_completed", got)
	}
	checkInvariants(t, e)
}

// TestEventOrder pins the order in which pending frees complete: by stream, ascending, each stream's events
// oldest first.
func TestEventOrder(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	x := e.malloc(1000, 0)
	y := e.malloc(1000, 0)
	z := e.malloc(1000, 0)
	for addr, s := range map[uint64]int64{x: 7, y: 3, z: 7} {
		if err := e.a.RecordStream(addr, s); err != nil {
			t.Fatal(err)
		}
	}
	e.free(x)
	e.free(z)
	e.free(y)
	mark := len(e.rec.events)
	e.a.Synchronize()
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "free_completed", Addr: y},
		{Action: "free_completed", Addr: x},
		{Action: "free_completed", Addr: z},
	})
}
