package triage

import (
	"cmp"
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
)

// memoryManagementURL ends PyTorch's OOM message (PyTorch 2.8 and later).
const memoryManagementURL = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"

// torchSize is PyTorch's format_size: bytes up to 1024, then KiB, MiB and GiB with two decimals, each bound
// inclusive (1 MiB prints as "1024.00 KiB").
func torchSize(n int64) string {
	size := uint64(max(n, 0))
	switch {
	case size <= 1024:
		return strconv.FormatUint(size, 10) + " bytes"
	case size <= 1<<20:
		return strconv.FormatFloat(float64(size)/1024, 'f', 2, 64) + " KiB"
	case size <= 1<<30:
		return strconv.FormatFloat(float64(size)/(1<<20), 'f', 2, 64) + " MiB"
	}
	return strconv.FormatFloat(float64(size)/(1<<30), 'f', 2, 64) + " GiB"
}

// oomMessage rebuilds PyTorch's OutOfMemoryError message for oom event e from what the snapshot recorded:
// the size the allocator tried to get, the device's capacity and free memory, and allocated and reserved
// bytes after the recovery chain. exact is false when the snapshot lacks the device's capacity (imported
// traces): the message then says what is known.
func oomMessage(m snapshot.Meta, e *snapshot.Event, allocSize, allocated, reserved int64) (msg string, exact bool) {
	dev, known := device(m, int(e.Device))
	var b strings.Builder
	b.WriteString("CUDA out of memory. Tried to allocate ")
	b.WriteString(torchSize(allocSize))
	b.WriteString(". GPU ")
	b.WriteString(strconv.Itoa(int(e.Device)))
	if !known || dev.Capacity <= 0 {
		b.WriteString(" had ")
		b.WriteString(torchSize(e.DeviceFree))
		b.WriteString(" free. Of the allocated memory ")
		b.WriteString(torchSize(allocated))
		b.WriteString(" was allocated by PyTorch, and ")
		b.WriteString(torchSize(max(0, reserved-allocated)))
		b.WriteString(" was reserved by PyTorch but unallocated.")
		return b.String(), false
	}
	b.WriteString(" has a total capacity of ")
	b.WriteString(torchSize(dev.Capacity))
	b.WriteString(" of which ")
	b.WriteString(torchSize(e.DeviceFree))
	b.WriteString(" is free. ")
	// The simulated devices report this process, alone on the device, to the message as NVML would; a real
	// CUDA device's recording does not list processes.
	if m.Source == "oomdbg" && (dev.Kind == "meta" || dev.Kind == "cpu") {
		b.WriteString("Including non-PyTorch memory, this process has ")
		b.WriteString(torchSize(dev.Capacity - e.DeviceFree))
		b.WriteString(" memory in use. ")
	}
	b.WriteString("Of the allocated memory ")
	b.WriteString(torchSize(allocated))
	b.WriteString(" is allocated by PyTorch, and ")
	b.WriteString(torchSize(max(0, reserved-allocated)))
	b.WriteString(" is reserved by PyTorch but unallocated.")
	b.WriteString(" If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (")
	b.WriteString(memoryManagementURL)
	b.WriteString(")")
	return b.String(), true
}

// sortLargest orders blocks largest first, then by allocation.
func sortLargest(bs []snapshot.Allocation) {
	slices.SortFunc(bs, func(a, b snapshot.Allocation) int {
		if c := cmp.Compare(b.Size, a.Size); c != 0 {
			return c
		}
		return cmp.Compare(a.Alloc, b.Alloc)
	})
}
