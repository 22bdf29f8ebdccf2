package allocator

import (
	"fmt"
	"slices"
	"testing"
)

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

// testStreams is a Streams whose events complete when the test says: it records every call, so that a test
// can check when the allocator records, queries and waits on events.
type testStreams struct {
	next  uint64
	done  map[Event]bool
	calls []string
}

func newTestStreams() *testStreams { return &testStreams{done: map[Event]bool{}} }

func (s *testStreams) RecordEvent(stream int64) Event {
	s.next++
	e := Event{Stream: stream, Seq: s.next}
	s.calls = append(s.calls, fmt.Sprintf("record s%d #%d", stream, e.Seq))
	return e
}

func (s *testStreams) EventDone(e Event) bool {
	s.calls = append(s.calls, fmt.Sprintf("query #%d", e.Seq))
	return s.done[e]
}

func (s *testStreams) SynchronizeEvent(e Event) {
	s.calls = append(s.calls, fmt.Sprintf("wait #%d", e.Seq))
	s.done[e] = true
}

// complete marks the n-th event recorded (from 1) as completed.
func (s *testStreams) complete(stream int64, n uint64) { s.done[Event{Stream: stream, Seq: n}] = true }

// TestEventsPerStreamQueues holds process_events to PyTorch's (c10/cuda/CUDACachingAllocator.cpp,
// pytorch/pytorch@001074d2, DeviceCachingAllocator::process_events): each stream's events are queried
// oldest first and the walk of a stream stops at its first event that has not completed, while other
// streams go on ("a separate list of events per stream to avoid head-of-line delays").
func TestEventsPerStreamQueues(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	st := newTestStreams()
	e.a.SetStreams(st)
	x := e.malloc(1000, 0)
	y := e.malloc(1000, 0)
	z := e.malloc(1000, 0)
	for addr, s := range map[uint64]int64{x: 7, y: 3, z: 7} {
		if err := e.a.RecordStream(addr, s); err != nil {
			t.Fatal(err)
		}
	}
	e.free(x) // event #1 on stream 7
	e.free(z) // event #2 on stream 7
	e.free(y) // event #3 on stream 3
	if want := []string{"record s7 #1", "record s7 #2", "record s3 #3"}; !slices.Equal(st.calls, want) {
		t.Fatalf("events recorded %v, want %v: insert_events records at the free, one per stream used", st.calls, want)
	}
	if n := e.a.PendingFrees(); n != 3 {
		t.Fatalf("%d pending frees, want 3", n)
	}
	// z's event completed, but x's, ahead of it on stream 7, has not; y's on stream 3 has.
	st.complete(7, 2)
	st.complete(3, 3)
	st.calls = nil
	mark := len(e.rec.events)
	e.a.ProcessEvents()
	wantEvents(t, e.rec.since(mark), []traceEvent{{Action: "free_completed", Addr: y}})
	if want := []string{"query #3", "query #1"}; !slices.Equal(st.calls, want) {
		t.Fatalf("queries %v, want %v: stream 3 first (ascending), stream 7 stops at its first", st.calls, want)
	}
	checkInvariants(t, e)
	// Once x's event completes, the next request caches x and then z, in queue order, before it looks for a
	// block: the request of the same size is served from x.
	st.complete(7, 1)
	mark = len(e.rec.events)
	got := e.malloc(1000, 0)
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "free_completed", Addr: x},
		{Action: "free_completed", Addr: z},
		{Action: "alloc", Addr: x},
	})
	if got != x {
		t.Fatalf("request served at %#x, want x %#x", got, x)
	}
	if e.a.PendingFrees() != 0 || len(e.a.events) != 0 {
		t.Fatalf("%d pending, %d queues left", e.a.PendingFrees(), len(e.a.events))
	}
	checkInvariants(t, e)
}

// TestPendingBlockIsNotReused checks that a request on the block's own stream cannot take a block whose
// events are outstanding: the allocator gets a new segment instead (reserved memory rises), and reuses the
// block once the consumer stream's work has completed.
func TestPendingBlockIsNotReused(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	st := newTestStreams()
	e.a.SetStreams(st)
	x := e.malloc(40*mib, 1) // a segment of its own (>= 10 MiB: rounded to 2 MiB)
	if err := e.a.RecordStream(x, 0); err != nil {
		t.Fatal(err)
	}
	e.free(x)
	y := e.malloc(40*mib, 1)
	if y == x {
		t.Fatal("a block waiting on stream 0's work was handed out again")
	}
	if r := e.a.Stats().ReservedBytes.All().Current; r != 80*mib {
		t.Fatalf("reserved %d, want two 40 MiB segments", r)
	}
	e.free(y)
	st.complete(0, 1)
	z := e.malloc(40*mib, 1)
	if z != x && z != y {
		t.Fatalf("served at %#x, neither cached block", z)
	}
	if r := e.a.Stats().ReservedBytes.All().Current; r != 80*mib {
		t.Fatalf("reserved %d after the event completed, want no new segment", r)
	}
	checkInvariants(t, e)
}

// TestSynchronizeWaitsOnEachEvent checks synchronize_and_free_events: it waits on every outstanding event
// (cudaEventSynchronize), stream by stream and oldest first, and caches every waiting block, even those
// whose events would not have completed yet.
func TestSynchronizeWaitsOnEachEvent(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	st := newTestStreams()
	e.a.SetStreams(st)
	x := e.malloc(1000, 0)
	y := e.malloc(1000, 0)
	for _, u := range []struct {
		addr   uint64
		stream int64
	}{{x, 5}, {x, 2}, {y, 5}} {
		if err := e.a.RecordStream(u.addr, u.stream); err != nil {
			t.Fatal(err)
		}
	}
	e.free(x) // #1 on stream 2, #2 on stream 5 (streams in ascending order)
	e.free(y) // #3 on stream 5
	st.calls = nil
	mark := len(e.rec.events)
	if err := e.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	if want := []string{"wait #1", "wait #2", "wait #3"}; !slices.Equal(st.calls, want) {
		t.Fatalf("calls %v, want %v", st.calls, want)
	}
	if got := e.rec.actions(mark); got != "free_completed,free_completed,segment_free" {
		t.Fatalf("EmptyCache: %s", got)
	}
	if s := e.a.Stats(); s.NumSyncAllStreams != 1 || s.ReservedBytes.All().Current != 0 {
		t.Fatalf("syncs %d, reserved %d", s.NumSyncAllStreams, s.ReservedBytes.All().Current)
	}
}
