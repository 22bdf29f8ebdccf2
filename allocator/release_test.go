package allocator

import (
	"errors"
	"testing"
)

// TestEmptyCacheFreesOnlyUnsplit checks empty_cache returns whole cached segments and keeps segments with
// a block in use, free parts included.
func TestEmptyCacheFreesOnlyUnsplit(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	a := e.malloc(30*mib, 0)  // segment A, 30 MiB
	b := e.malloc(5*mib, 0)   // segment B, 20 MiB, split
	c := e.malloc(1000, 0)    // small segment C
	e.free(a)                 // A cached whole
	e.free(c)                 // C cached whole
	mark := len(e.rec.events) // B keeps 15 MiB cached but split
	if err := e.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	// The large pool is released first, then the small one.
	wantEvents(t, e.rec.since(mark), []traceEvent{
		{Action: "segment_free", Addr: a, Size: 30 * mib},
		{Action: "segment_free", Addr: c, Size: SmallBuffer},
	})
	st := e.a.Stats()
	if st.ReservedBytes.All().Current != LargeBuffer || st.Segment.All().Current != 1 || st.NumSyncAllStreams != 1 ||
		st.NumDeviceFree != 2 || e.dev.Used() != LargeBuffer {
		t.Fatalf("reserved %d segments %d syncs %d frees %d device %d", st.ReservedBytes.All().Current,
			st.Segment.All().Current, st.NumSyncAllStreams, st.NumDeviceFree, e.dev.Used())
	}
	if st.InactiveSplitBytes.All().Current != 15*mib {
		t.Fatalf("inactive_split_bytes %d, want 15 MiB stuck in B", st.InactiveSplitBytes.All().Current)
	}
	_ = b
}

// TestOOMRecoveryOrder walks the recovery chain step by step on a 1 GiB device.
func TestOOMRecoveryOrder(t *testing.T) {
	t.Run("release cached then retry", func(t *testing.T) {
		e := newEnv(t, gib, 0, "")
		x := e.malloc(600*mib, 0)
		e.free(x)
		mark := len(e.rec.events)
		y := e.malloc(700*mib, 0) // 600 MiB cached + 700 MiB > 1 GiB: release, retry
		wantEvents(t, e.rec.since(mark), []traceEvent{
			{Action: "segment_free", Addr: x, Size: 600 * mib},
			{Action: "segment_alloc", Addr: y, Size: 700 * mib},
			{Action: "alloc", Addr: y, Size: 700 * mib},
		})
		st := e.a.Stats()
		if st.NumAllocRetries != 1 || st.NumOOMs != 0 || st.NumSyncAllStreams != 1 {
			t.Fatalf("retries %d ooms %d syncs %d, want 1 0 1", st.NumAllocRetries, st.NumOOMs, st.NumSyncAllStreams)
		}
	})

	t.Run("max_split_size releases oversize blocks largest first", func(t *testing.T) {
		e := newEnv(t, gib, 0, "max_split_size_mb:100")
		x := e.malloc(300*mib, 0)
		y := e.malloc(200*mib, 0)
		s := e.malloc(1000, 0)
		e.free(x)
		e.free(y)
		e.free(s)
		mark := len(e.rec.events)
		// 600 MiB: releasing the oversize blocks (500 MiB) is not enough, so that step fails and the
		// chain goes on to release everything and retry.
		z := e.malloc(600*mib, 0)
		wantEvents(t, e.rec.since(mark), []traceEvent{
			{Action: "segment_free", Addr: x, Size: 300 * mib},
			{Action: "segment_free", Addr: y, Size: 200 * mib},
			{Action: "segment_free", Addr: s, Size: SmallBuffer},
			{Action: "segment_alloc", Addr: z, Size: 600 * mib},
			{Action: "alloc", Addr: z},
		})
		if st := e.a.Stats(); st.NumAllocRetries != 1 || st.NumSyncAllStreams != 1 {
			t.Fatalf("retries %d syncs %d, want 1 1", st.NumAllocRetries, st.NumSyncAllStreams)
		}
	})

	t.Run("max_split_size releases one block when it suffices", func(t *testing.T) {
		e := newEnv(t, gib, 0, "max_split_size_mb:100")
		e.malloc(400*mib, 0) // kept
		x := e.malloc(300*mib, 0)
		y := e.malloc(200*mib, 0)
		e.free(x)
		e.free(y)
		mark := len(e.rec.events)
		// 250 MiB: the cached 300 MiB block is beyond the 20 MiB slack, the device has 124 MiB free.
		// Releasing the smallest oversize block >= 250 MiB (x) is enough: no sync, no retry.
		z := e.malloc(250*mib, 0)
		wantEvents(t, e.rec.since(mark), []traceEvent{
			{Action: "segment_free", Addr: x, Size: 300 * mib},
			{Action: "segment_alloc", Addr: z, Size: 250 * mib},
			{Action: "alloc", Addr: z},
		})
		if st := e.a.Stats(); st.NumAllocRetries != 0 || st.NumSyncAllStreams != 0 || st.Segment.All().Current != 3 {
			t.Fatalf("retries %d syncs %d segments %d", st.NumAllocRetries, st.NumSyncAllStreams, st.Segment.All().Current)
		}
	})

	t.Run("max_split_size stops releasing once enough is freed", func(t *testing.T) {
		e := newEnv(t, gib, 0, "max_split_size_mb:100")
		x := e.malloc(300*mib, 0)
		y := e.malloc(200*mib, 0)
		z := e.malloc(150*mib, 0)
		e.malloc(300*mib, 0) // kept: 974 MiB reserved, 50 MiB free
		e.free(x)
		e.free(y)
		e.free(z)
		mark := len(e.rec.events)
		w := e.malloc(450*mib, 0) // 300 + 200 >= 450: z stays cached
		wantEvents(t, e.rec.since(mark), []traceEvent{
			{Action: "segment_free", Addr: x, Size: 300 * mib},
			{Action: "segment_free", Addr: y, Size: 200 * mib},
			{Action: "segment_alloc", Addr: w, Size: 450 * mib},
			{Action: "alloc", Addr: w},
		})
		if st := e.a.Stats(); st.NumAllocRetries != 0 || st.ReservedBytes.All().Current != 900*mib {
			t.Fatalf("retries %d reserved %d MiB", st.NumAllocRetries, st.ReservedBytes.All().Current>>20)
		}
	})

	t.Run("gives up: retry counted, then oom", func(t *testing.T) {
		e := newEnv(t, gib, 0, "")
		e.malloc(600*mib, 0)
		mark := len(e.rec.events)
		_, err := e.a.Malloc(600*mib, 0)
		var oom *OutOfMemoryError
		if !errors.As(err, &oom) {
			t.Fatalf("Malloc: %v", err)
		}
		if e.rec.actions(mark) != "oom" {
			t.Fatalf("events %s, want oom only", e.rec.actions(mark))
		}
		st := e.a.Stats()
		if st.NumAllocRetries != 1 || st.NumOOMs != 1 || st.NumSyncAllStreams != 1 {
			t.Fatalf("retries %d ooms %d syncs %d, want 1 1 1", st.NumAllocRetries, st.NumOOMs, st.NumSyncAllStreams)
		}
		// The failed request left the allocator usable.
		e.malloc(100*mib, 0)
		checkInvariants(t, e)
	})
}

// TestMemoryFraction checks the limit applies to reserved bytes plus the new segment.
func TestMemoryFraction(t *testing.T) {
	e := newEnv(t, 4*gib, 0, "")
	if err := e.a.SetMemoryFraction(0.25); err != nil { // 1 GiB allowed
		t.Fatal(err)
	}
	x := e.malloc(512*mib, 0)
	e.malloc(256*mib, 0)
	e.free(x) // 768 MiB reserved, 256 MiB allocated
	// 400 MiB: the cached 512 MiB block serves it, the limit does not matter.
	y := e.malloc(400*mib, 0)
	if y != x {
		t.Fatalf("cached block not reused")
	}
	// 300 MiB more: 768 + 300 > 1024, although only 656 MiB are allocated: release, retry, OOM.
	_, err := e.a.Malloc(300*mib, 0)
	var oom *OutOfMemoryError
	if !errors.As(err, &oom) || !oom.Limited || oom.AllowedMaximum != gib {
		t.Fatalf("Malloc: %v", err)
	}
	if e.a.MemoryFraction() != 0.25 {
		t.Fatalf("MemoryFraction() = %v", e.a.MemoryFraction())
	}
	// 256 MiB fits exactly: 768 + 256 = 1024.
	e.malloc(256*mib, 0)
	if err := e.a.SetMemoryFraction(1); err != nil || e.a.MemoryFraction() != 1 {
		t.Fatalf("SetMemoryFraction(1): %v", err)
	}
	e.malloc(300*mib, 0)
	for _, bad := range []float64{-0.1, 1.5} {
		if err := e.a.SetMemoryFraction(bad); err == nil {
			t.Errorf("SetMemoryFraction(%v) accepted", bad)
		}
	}
	if err := e.a.SetMemoryFraction(1.5); err == nil || err.Error() != "invalid fraction:1.5. Please set within [0, 1]." {
		t.Errorf("error %v", err)
	}
	// per_process_memory_fraction in the settings acts the same.
	e2 := newEnv(t, 4*gib, 0, "per_process_memory_fraction:0.25")
	if e2.a.MemoryFraction() != 0.25 {
		t.Fatalf("per_process_memory_fraction: fraction %v", e2.a.MemoryFraction())
	}
}

// TestGarbageCollection checks garbage_collection_threshold frees the large pool's oldest unsplit cached
// segments, above-average age first, and only with a memory fraction.
func TestGarbageCollection(t *testing.T) {
	run := func(t *testing.T, conf string, fraction float64, sameAge bool) (*env, uint64, uint64, int) {
		e := newEnv(t, 4*gib, 0, conf)
		if fraction > 0 {
			if err := e.a.SetMemoryFraction(fraction); err != nil {
				t.Fatal(err)
			}
		}
		a := e.malloc(400*mib, 0) // large-pool searches: 1
		b := e.malloc(400*mib, 0) // 2
		e.malloc(100*mib, 0)      // 3; 900 MiB reserved
		e.free(a)                 // cached at count 3
		if sameAge {
			e.free(b) // cached at count 3 too
		}
		e.malloc(10*mib, 1) // 4; a miss on stream 1: 910 MiB <= 1 GiB threshold, no collection
		if !sameAge {
			e.free(b) // cached at count 4
		}
		e.malloc(200*mib, 1) // 5; 1110 MiB reserved
		mark := len(e.rec.events)
		e.malloc(50*mib, 1) // 6; miss, 1110 > 1024: collect. Ages a=3, b=2, average 2.5: only a goes
		return e, a, b, mark
	}
	t.Run("collects the oldest", func(t *testing.T) {
		e, a, _, mark := run(t, "garbage_collection_threshold:0.5", 0.5, false) // 2 GiB allowed, collect above 1 GiB
		got := e.rec.since(mark)
		if len(got) != 3 || got[0] != (traceEvent{Action: "segment_free", Addr: a, Size: 400 * mib}) || got[1].Action != "segment_alloc" {
			t.Fatalf("events %v, want a freed, then the new segment", got)
		}
		if st := e.a.Stats(); st.ReservedBytes.All().Current != 760*mib || st.NumSyncAllStreams != 0 {
			t.Fatalf("reserved %d MiB syncs %d", st.ReservedBytes.All().Current>>20, st.NumSyncAllStreams)
		}
	})
	t.Run("equal ages all go, past the target", func(t *testing.T) {
		e, a, b, mark := run(t, "garbage_collection_threshold:0.5", 0.5, true) // both aged 3, the average
		got := e.rec.since(mark)
		if len(got) != 4 || got[0].Action != "segment_free" || got[1].Action != "segment_free" ||
			got[0].Addr+got[1].Addr != a+b || got[2].Action != "segment_alloc" {
			t.Fatalf("events %v, want a and b freed, then the new segment", got)
		}
	})
	t.Run("needs a memory fraction", func(t *testing.T) {
		e, _, _, mark := run(t, "garbage_collection_threshold:0.5", 0, false)
		if e.rec.actions(mark) != "segment_alloc,alloc" {
			t.Fatalf("events %s: collected without a memory fraction", e.rec.actions(mark))
		}
	})
	t.Run("needs a threshold", func(t *testing.T) {
		e, _, _, mark := run(t, "", 0.5, false)
		if e.rec.actions(mark) != "segment_alloc,alloc" {
			t.Fatalf("events %s: collected without a threshold", e.rec.actions(mark))
		}
	})
}

// TestMaxSplitLoweredMidRun checks that lowering max_split_size while split blocks bigger than the new
// limit are cached does not hand the device an address inside a segment.
func TestMaxSplitLoweredMidRun(t *testing.T) {
	e := newEnv(t, gib, 0, "")
	e.malloc(100*mib, 0)
	big := e.malloc(300*mib, 0)
	e.free(big)
	part := e.malloc(50*mib, 0) // splits the 300 MiB segment: 250 MiB cached, split
	if part != big {
		t.Fatalf("expected the cached segment to be split")
	}
	e.a.SetConfig(Config{MaxSplitSize: 20 * mib})
	if _, err := e.a.Malloc(700*mib, 0); err == nil {
		t.Fatal("700 MiB fit on a 1 GiB device holding 400 MiB")
	} else if _, ok := err.(*OutOfMemoryError); !ok {
		t.Fatalf("Malloc: %v, want an OOM", err)
	}
	checkInvariants(t, e)
}
