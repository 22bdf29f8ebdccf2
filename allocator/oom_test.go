package allocator

import (
	"errors"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchrules"
)

const oomTail = " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"

// TestOOMMessage builds OOM scenarios on a 4 GiB device with a 512 MiB CUDA context and compares PyTorch's
// message with one computed by hand from the rules of docs/allocator.md.
func TestOOMMessage(t *testing.T) {
	t.Run("fragmented", func(t *testing.T) {
		e := newEnv(t, 4*gib, 512*mib, "")
		e.malloc(3*gib, 0) // a 3 GiB segment
		e.malloc(5*mib, 0) // a 20 MiB segment, split: 5 MiB used, 15 MiB cached and stuck
		_, err := e.a.Malloc(600*mib, 0)
		// Free: 4096 - 512 - 3072 - 20 = 492 MiB. This process: 512 + 3072 + 20 = 3604 MiB = 3.52 GiB.
		// Allocated: 3072 + 5 MiB = 3.00 GiB; reserved but unallocated: 15 MiB.
		want := "CUDA out of memory. Tried to allocate 600.00 MiB. GPU 0 has a total capacity of 4.00 GiB of which 492.00 MiB is free. " +
			"Including non-PyTorch memory, this process has 3.52 GiB memory in use. " +
			"Of the allocated memory 3.00 GiB is allocated by PyTorch, and 15.00 MiB is reserved by PyTorch but unallocated." + oomTail
		var oom *OutOfMemoryError
		if !errors.As(err, &oom) {
			t.Fatalf("Malloc: %v, want *OutOfMemoryError", err)
		}
		if err.Error() != want {
			t.Fatalf("message\n %s\nwant\n %s", err, want)
		}
		if oom.Requested != 600*mib || oom.Rounded != 600*mib || oom.AllocSize != 600*mib || oom.DeviceFree != 492*mib ||
			oom.DeviceTotal != 4*gib || oom.Allocated != 3*gib+5*mib || oom.Reserved != 3*gib+20*mib || oom.Limited {
			t.Fatalf("fields %+v", oom)
		}
		st := e.a.Stats()
		if st.NumOOMs != 1 || st.NumAllocRetries != 1 || st.NumSyncAllStreams != 1 {
			t.Fatalf("num_ooms %d num_alloc_retries %d num_sync_all_streams %d, want 1 1 1", st.NumOOMs, st.NumAllocRetries, st.NumSyncAllStreams)
		}
		last := e.rec.events[len(e.rec.events)-1]
		if last != (traceEvent{Action: "oom", Size: 600 * mib, Block: 600 * mib, Free: 492 * mib}) {
			t.Fatalf("last event %v", last)
		}
	})

	t.Run("memory fraction and another process", func(t *testing.T) {
		e := newEnv(t, 4*gib, 512*mib, "")
		e.dev.SetOtherProcesses([]ProcessMemory{{PID: 4242, Used: 256 * mib}})
		if err := e.a.SetMemoryFraction(0.5); err != nil {
			t.Fatal(err)
		}
		e.malloc(gib, 0)
		_, err := e.a.Malloc(1536*mib, 0)
		// 1 GiB reserved + 1.5 GiB > 2 GiB allowed. Free: 4096 - 512 - 256 - 1024 = 2304 MiB. Exactly
		// 1 GiB allocated prints as 1024.00 MiB: format_size's bounds are inclusive.
		want := "CUDA out of memory. Tried to allocate 1.50 GiB. GPU 0 has a total capacity of 4.00 GiB of which 2.25 GiB is free. " +
			"Including non-PyTorch memory, this process has 1.50 GiB memory in use. Process 4242 has 256.00 MiB memory in use. " +
			"2.00 GiB allowed; Of the allocated memory 1024.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated." + oomTail
		if err == nil || err.Error() != want {
			t.Fatalf("message\n %v\nwant\n %s", err, want)
		}
	})

	t.Run("small request reports the segment", func(t *testing.T) {
		// A 300 KB request reports "Tried to allocate 2.00 MiB"; a 5 MB one "20.00 MiB".
		for size, want := range map[uint64]string{300_000: "2.00 MiB", 5_000_000: "20.00 MiB", 100_300_000: "96.00 MiB"} {
			e := newEnv(t, 64*mib, 63*mib, "")
			_, err := e.a.Malloc(size, 0)
			var oom *OutOfMemoryError
			if !errors.As(err, &oom) || torchrules.FormatSize(oom.AllocSize) != want {
				t.Fatalf("Malloc(%d): %v, want Tried to allocate %s", size, err, want)
			}
		}
	})

	t.Run("no process information", func(t *testing.T) {
		e := &OutOfMemoryError{AllocSize: 2 * mib, DeviceTotal: 8 * gib, DeviceFree: mib, Allocated: 7 * gib, Reserved: 7*gib + 512*mib}
		want := "CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 1024.00 KiB is free. " +
			"Of the allocated memory 7.00 GiB is allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but unallocated." + oomTail
		if e.Error() != want {
			t.Fatalf("message\n %s\nwant\n %s", e, want)
		}
	})

	t.Run("more than 1EB", func(t *testing.T) {
		e := newEnv(t, 4*gib, 0, "")
		_, err := e.a.Malloc(1<<60, 0)
		var oom *OutOfMemoryError
		if !errors.As(err, &oom) || !oom.TooLarge || err.Error() != "CUDA out of memory. Tried to allocate more than 1EB memory." {
			t.Fatalf("Malloc(1 EB): %v", err)
		}
		if _, err := e.a.Malloc(1<<60-1, 0); err == nil || err.Error() == "CUDA out of memory. Tried to allocate more than 1EB memory." {
			t.Fatalf("Malloc(1 EB - 1): %v, want an ordinary OOM", err)
		}
		if st := e.a.Stats(); st.NumOOMs != 1 {
			t.Fatalf("num_ooms %d, want 1 (the guard does not count)", st.NumOOMs)
		}
	})
}

// TestParseConfigRefusesUnmodelled checks the settings whose behaviour this package does not model are
// refused with a message that says so, by ParseConfig and by CheckConfig.
func TestParseConfigRefusesUnmodelled(t *testing.T) {
	for _, in := range []string{"backend:cudaMallocAsync", "throw_on_cudamalloc_oom:True"} {
		_, err := ParseConfig(in)
		ce, ok := err.(*ConfigError)
		if !ok || ce.Key == "" || !strings.Contains(ce.Msg, "not modelled") {
			t.Errorf("ParseConfig(%q) = %v, want a ConfigError saying it is not modelled", in, err)
		}
		cfg, err := torchrules.ParseConfig(in)
		if err != nil {
			t.Fatalf("PyTorch accepts %q: %v", in, err)
		}
		if err := CheckConfig(cfg); err == nil || !strings.Contains(err.Error(), "not modelled") {
			t.Errorf("CheckConfig(%q) = %v, want it refused as not modelled", in, err)
		}
	}
	if _, err := ParseConfig("throw_on_cudamalloc_oom:False,backend:native"); err != nil {
		t.Errorf("the defaults spelled out: %v", err)
	}
}
