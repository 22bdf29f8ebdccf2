package tracer_test

import (
	"math/rand/v2"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/tracer"
)

// The Recorder is the allocator model's observer without either package importing the other.
var _ allocator.Observer = (*tracer.Recorder)(nil)

//go:noinline
func modelForward(a *allocator.Allocator, size uint64) uint64 {
	addr, err := a.Malloc(size, 0)
	if err != nil {
		panic(err)
	}
	return addr
}

func TestRecordingTheAllocatorModel(t *testing.T) {
	sink := newMemSink()
	r := tracer.New(sink, tracer.WithClock(clock()))
	a := allocator.New(allocator.NewSimDevice(0, 16<<30, 0), allocator.DefaultConfig())
	a.SetObserver(r)

	rng := rand.New(rand.NewPCG(1, 2))
	var live []uint64
	for range 2000 {
		if len(live) > 0 && rng.IntN(2) == 0 {
			i := rng.IntN(len(live))
			if err := a.Free(live[i]); err != nil {
				t.Fatal(err)
			}
			live = append(live[:i], live[i+1:]...)
			continue
		}
		live = append(live, modelForward(a, uint64(rng.IntN(8<<20)+1)))
	}
	if err := r.Close(nil); err != nil {
		t.Fatal(err)
	}

	// Allocations and new segments name the code that asked, never the allocator.
	for _, e := range sink.events {
		if e.Stack == 0 {
			continue
		}
		frames := sink.stackOf(e.Stack)
		if !strings.HasSuffix(frames[0].function, "tracer_test.modelForward") {
			t.Fatalf("%v event's innermost frame is %s, want modelForward", e.Action, frames[0].function)
		}
		for _, f := range frames {
			if strings.Contains(f.function, "oomdbg/allocator.") {
				t.Fatalf("allocator frame %s in a stack", f.function)
			}
		}
	}
	// The summary's peaks are the allocator's own memory_stats peaks.
	st := a.Stats()
	s := sink.footer.Summary
	if s.PeakAllocated != st.AllocatedBytes.All().Peak || s.PeakReserved != st.ReservedBytes.All().Peak {
		t.Errorf("summary peaks %d allocated / %d reserved; allocator says %d / %d",
			s.PeakAllocated, s.PeakReserved, st.AllocatedBytes.All().Peak, st.ReservedBytes.All().Peak)
	}
	if got, want := s.ByAction["alloc"], uint64(st.Allocation.All().Allocated); got != want {
		t.Errorf("%d alloc events, allocator counted %d allocations", got, want)
	}
}
