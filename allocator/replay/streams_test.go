package replay

import (
	"path/filepath"
	"reflect"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// testdata/multistream.json is a trace of two streams written entry by entry from what PyTorch's caching allocator
// records (c10/cuda/CUDACachingAllocator.cpp, pytorch/pytorch@001074d2): stream 0 computes, stream U
// (94742130589440, a cudaStream_t) gathers, as FSDP's unshard stream does. Sizes are MiB (1048576 bytes).
//
//  1. U asks for 40: a new 40 segment S1 (segment_alloc right before its alloc, at its base).
//  2. 0 asks for 4: a new 20 segment S2 (get_allocation_size of a request between 1 and 10 MiB).
//  3. S1 is freed after record_stream on 0: free() records an event on stream 0 (insert_events) and writes
//     free_requested only; the block is in no pool.
//  4. U asks for 40: the event has not completed, so S1 cannot serve it: a new segment S3.
//  5. 0 asks for 40: blocks of U are never used for 0: a new segment S4.
//  6. 0 asks for 2: process_events first finds stream 0's event complete and frees S1 (free_completed, on
//     S1's own stream U), then best fit on stream 0 splits S2's 16 free after its first 4.
//  7. 0 frees both blocks of S2 (no record_stream: free_requested, free_completed), which merge whole.
//  8. U asks for 40: S1, cached on U, serves it.
//  9. S3 is freed after record_stream on 0 and on a third stream V that the trace never names.
//  10. empty_cache: synchronize_and_free_events waits on both events (one free_completed for S3), then
//     release_blocks frees the large pool's unsplit cached blocks, stream 0's (S2) before U's (S3).
//  11. S4 is freed after record_stream on U: it is still active_pending_free when the snapshot is taken.
func multiStreamTrace(t *testing.T) *snapshot.Snapshot {
	t.Helper()
	s, err := torch.ImportFile(filepath.Join("testdata", "multistream.json"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestMultiStreamTraceReplaysExactly replays the two-stream trace: every new segment, every reuse, both
// releases and the final state, whose last block is still waiting on another stream, are PyTorch's.
func TestMultiStreamTraceReplaysExactly(t *testing.T) {
	s := multiStreamTrace(t)
	got, _, err := CheckFidelity(s)
	if err != nil {
		t.Fatal(err)
	}
	want := []Fidelity{{
		Device:        0,
		NewSegments:   Count{4, 4},
		ReusedInTrace: Count{2, 2},
		Releases:      Count{2, 2},
		BlockSizes:    Count{6, 6},
		FinalState:    Count{2, 2},
	}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("fidelity\n got %+v\nwant %+v", got, want)
	}
}

// TestMultiStreamTraceAllocatedPeak checks the what-if replay counts a deferred free's bytes as PyTorch's
// allocated_bytes does: they stop counting at free_requested, though the memory is not reusable until
// free_completed. The recording's peak, by the trace's block sizes in MiB: 40, 44, 4 (S1 freed), 44, 84, 86,
// 84, 80, 120 (S1 again), 80, 40: 120 MiB, reached with S1 reused while S3 and S4 are in use.
func TestMultiStreamTraceAllocatedPeak(t *testing.T) {
	s := multiStreamTrace(t)
	cfg, _ := RecordedSettings(s)
	w, _, err := CompareSettings(s, cfg, 0)
	if err != nil {
		t.Fatal(err)
	}
	const mib = 1 << 20
	if w[0].RecordedPeakAllocated != 120*mib {
		t.Fatalf("recorded peak allocated %d, want 120 MiB", w[0].RecordedPeakAllocated)
	}
	if c := w[0].Candidate; c.PeakAllocated != 120*mib || c.PeakReserved != 140*mib {
		t.Errorf("replayed peaks: allocated %d, reserved %d; want 120 and 140 MiB (S1, S2, S3, S4)",
			c.PeakAllocated, c.PeakReserved)
	}
}

// TestDeferredFreeWaitsForItsCompletion drives the replay's allocator directly: a block whose free the
// trace defers is pending (not reusable on its own stream) until its free_completed.
func TestDeferredFreeWaitsForItsCompletion(t *testing.T) {
	a := allocator.New(allocator.NewSimDevice(0, 1<<30, 0), allocator.Config{})
	d := newDeferredFrees(a)
	x, err := a.Malloc(40<<20, 7)
	if err != nil {
		t.Fatal(err)
	}
	live := map[uint64]uint64{1000: x}
	for _, e := range []struct {
		action snapshot.Action
		addr   uint64
	}{{snapshot.ActionFreeRequested, 1000}, {snapshot.ActionAlloc, 2000}} {
		if err := d.next(a, e.action, e.addr, live); err != nil {
			t.Fatal(err)
		}
	}
	if a.PendingFrees() != 1 || len(live) != 0 {
		t.Fatalf("pending %d, live %v: the free was deferred", a.PendingFrees(), live)
	}
	y, err := a.Malloc(40<<20, 7)
	if err != nil || y == x {
		t.Fatalf("Malloc = %#x, %v: the pending block must not serve its own stream", y, err)
	}
	if !d.completed(a, 1000) || a.PendingFrees() != 0 {
		t.Fatal("free_completed did not complete the deferred free")
	}
	if z, err := a.Malloc(40<<20, 7); err != nil || z != x {
		t.Fatalf("Malloc = %#x, %v: want the completed block %#x", z, err, x)
	}
}
