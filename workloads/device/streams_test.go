package device

import (
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
)

// TestDefaultStreamRunsWhenTheHostWaits checks the model's pacing: the default stream's work has run only
// as far as the host waited for it; a side stream's runs as soon as what it waits for has run.
func TestDefaultStreamRunsWhenTheHostWaits(t *testing.T) {
	s := NewStreams()
	comm := s.NewStream("comm")
	idle := s.RecordEvent(DefaultStream)
	if !s.EventDone(idle) {
		t.Fatal("an event on the default stream with nothing queued before it has not run")
	}
	s.Launch(DefaultStream) // a kernel computing a gradient
	grad := s.RecordEvent(DefaultStream)
	if s.EventDone(grad) {
		t.Fatal("the default stream's work ran without the host waiting for it")
	}
	s.WaitStream(comm, DefaultStream) // the reduction waits for the gradient
	s.Launch(comm)
	reduced := s.RecordEvent(comm)
	if s.EventDone(reduced) {
		t.Fatal("the reduction ran before the gradient it waits for")
	}
	s.Launch(DefaultStream) // the next layer's backward
	next := s.RecordEvent(DefaultStream)
	s.SynchronizeEvent(grad) // the host waits for the gradient (e.g. a rate limiter)
	if !s.EventDone(grad) || !s.EventDone(reduced) {
		t.Fatalf("after the host waited for the gradient: gradient %v, reduction %v; want both run",
			s.EventDone(grad), s.EventDone(reduced))
	}
	if s.EventDone(next) {
		t.Fatal("work queued after the event the host waited for has run")
	}
	s.SynchronizeStream(DefaultStream) // loss.item()
	if !s.EventDone(next) {
		t.Fatal("a stream synchronize left work queued")
	}
}

// TestWaitingOnASideStreamRunsWhatItWaited checks that the host waiting for a side stream's event makes the
// default-stream work that event waited for run too.
func TestWaitingOnASideStreamRunsWhatItWaited(t *testing.T) {
	s := NewStreams()
	comm := s.NewStream("comm")
	s.Launch(DefaultStream)
	before := s.RecordEvent(DefaultStream)
	s.WaitStream(comm, DefaultStream)
	s.Launch(comm)
	after := s.RecordEvent(comm)
	s.SynchronizeEvent(after)
	if !s.EventDone(before) {
		t.Fatal("the default-stream work the side stream waited for has not run")
	}
}

// TestStreamsHoldPendingFrees drives the caching allocator with the model: a block gathered on a side stream
// and freed after record_stream on the default stream is not reused by the next gather until the host
// waits past the free, as FSDP's rate limiter makes it.
func TestStreamsHoldPendingFrees(t *testing.T) {
	s := NewStreams()
	unshard := s.NewStream("unshard")
	a := allocator.New(allocator.NewSimDevice(0, 1<<30, 0), allocator.Config{})
	a.SetStreams(s)
	const unit = 40 << 20
	gather := func() uint64 {
		addr, err := a.Malloc(unit, unshard)
		if err != nil {
			t.Fatal(err)
		}
		s.Launch(unshard)
		s.WaitStream(DefaultStream, unshard)
		s.Launch(DefaultStream) // the unit's forward
		return addr
	}
	reshard := func(addr uint64) allocator.Event {
		if err := a.RecordStream(addr, DefaultStream); err != nil {
			t.Fatal(err)
		}
		if err := a.Free(addr); err != nil {
			t.Fatal(err)
		}
		return s.RecordEvent(DefaultStream) // the free event the limiter queues
	}
	u0 := gather()
	f0 := reshard(u0)
	u1 := gather()
	if u1 == u0 {
		t.Fatal("unit 1 reused unit 0's buffer while the default stream may still read it")
	}
	reshard(u1)
	s.SynchronizeEvent(f0) // the rate limiter, before the third all-gather
	u2 := gather()
	if u2 != u0 {
		t.Fatalf("unit 2 at %#x, want unit 0's buffer %#x once the host waited past its free", u2, u0)
	}
	if r := a.Stats().ReservedBytes.All().Current; r != 2*unit {
		t.Fatalf("reserved %d, want two units' buffers", r)
	}
}
