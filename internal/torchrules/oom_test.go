package torchrules

import "testing"

// oomTail is the end of PyTorch's message (c10/cuda/CUDACachingAllocator.cpp, 2.8 and later), with its two
// double spaces.
const oomTail = " If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)"

// TestOOMMessage holds Message to PyTorch's template, filled in by hand: the sizes through format_size, the
// process sentences in NVML's order, the memory fraction's "allowed; " before the allocated part.
func TestOOMMessage(t *testing.T) {
	tests := map[string]struct {
		oom  OOM
		want string
	}{
		"no process information": {
			OOM{AllocSize: 2 * mib, DeviceTotal: 8 * gib, DeviceFree: mib, Allocated: 7 * gib, Reserved: 7*gib + 512*mib},
			"CUDA out of memory. Tried to allocate 2.00 MiB. GPU 0 has a total capacity of 8.00 GiB of which 1024.00 KiB is free. " +
				"Of the allocated memory 7.00 GiB is allocated by PyTorch, and 512.00 MiB is reserved by PyTorch but unallocated." + oomTail,
		},
		"processes and a memory fraction": {
			OOM{Device: 1, AllocSize: 1536 * mib, DeviceTotal: 4 * gib, DeviceFree: 2304 * mib,
				Processes: []ProcessMemory{{Self: true, Used: 1536 * mib}, {PID: 4242, Used: 256 * mib}},
				Limited:   true, AllowedMaximum: 2 * gib, Allocated: gib, Reserved: gib},
			"CUDA out of memory. Tried to allocate 1.50 GiB. GPU 1 has a total capacity of 4.00 GiB of which 2.25 GiB is free. " +
				"Including non-PyTorch memory, this process has 1.50 GiB memory in use. Process 4242 has 256.00 MiB memory in use. " +
				"2.00 GiB allowed; Of the allocated memory 1024.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated." + oomTail,
		},
		"capacity unknown": {
			OOM{AllocSize: 40 * mib, DeviceFree: 12 * mib, Allocated: 3 * gib, Reserved: 3*gib + 20*mib},
			"CUDA out of memory. Tried to allocate 40.00 MiB. GPU 0 had 12.00 MiB free. Of the allocated memory 3.00 GiB was allocated by PyTorch, and 20.00 MiB was reserved by PyTorch but unallocated.",
		},
		"reserved below allocated": {
			OOM{AllocSize: 512, DeviceTotal: gib, Allocated: 2 * mib, Reserved: mib},
			"CUDA out of memory. Tried to allocate 512 bytes. GPU 0 has a total capacity of 1024.00 MiB of which 0 bytes is free. " +
				"Of the allocated memory 2.00 MiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated." + oomTail,
		},
	}
	for name, tc := range tests {
		if got := tc.oom.Message(); got != tc.want {
			t.Errorf("%s:\n got %s\nwant %s", name, got, tc.want)
		}
	}
}
