package alloc

import (
	"strconv"
	"strings"
)

// MemoryManagementURL is the documentation link at the end of PyTorch's OOM message (PyTorch >= 2.8).
const MemoryManagementURL = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"

// FormatSize is PyTorch's format_size: bytes up to 1024, then KiB, MiB and GiB with two decimals. Each
// bound is inclusive, so 1 MiB prints as "1024.00 KiB" and 1 GiB as "1024.00 MiB".
func FormatSize(size uint64) string {
	switch {
	case size <= 1024:
		return strconv.FormatUint(size, 10) + " bytes"
	case size <= 1048576:
		return strconv.FormatFloat(float64(size)/1024.0, 'f', 2, 64) + " KiB"
	case size <= 1073741824:
		return strconv.FormatFloat(float64(size)/1048576.0, 'f', 2, 64) + " MiB"
	default:
		return strconv.FormatFloat(float64(size)/1073741824.0, 'f', 2, 64) + " GiB"
	}
}

// OutOfMemoryError is torch.OutOfMemoryError: the allocator could not serve a request even after releasing
// every cached segment it could. Error returns PyTorch's message, byte for byte.
type OutOfMemoryError struct {
	Device    int
	Stream    int64
	Requested uint64 // the caller's size
	// TooLarge is set when the request was refused outright for being at least 1 EB; the other fields
	// but Device and Requested are then zero.
	TooLarge bool
	// Rounded is the request rounded by round_size (the size of the oom trace entry).
	Rounded uint64
	// AllocSize is what the allocator tried to get from the device, get_allocation_size(Rounded): the
	// size the message says it "tried to allocate".
	AllocSize uint64
	// DeviceFree and DeviceTotal are cudaMemGetInfo after the recovery chain.
	DeviceFree, DeviceTotal uint64
	// Processes is what NVML reported about the processes on the device; nil when unknown.
	Processes []ProcessMemory
	// AllowedMaximum is the memory-fraction limit when Limited.
	AllowedMaximum uint64
	Limited        bool
	// Allocated and Reserved are allocated_bytes and reserved_bytes (all pools) after the recovery chain.
	Allocated, Reserved uint64
}

func (e *OutOfMemoryError) Error() string {
	if e.TooLarge {
		return "CUDA out of memory. Tried to allocate more than 1EB memory."
	}
	var b strings.Builder
	b.WriteString("CUDA out of memory. Tried to allocate ")
	b.WriteString(FormatSize(e.AllocSize))
	b.WriteString(". GPU ")
	b.WriteString(strconv.Itoa(e.Device))
	b.WriteString(" has a total capacity of ")
	b.WriteString(FormatSize(e.DeviceTotal))
	b.WriteString(" of which ")
	b.WriteString(FormatSize(e.DeviceFree))
	b.WriteString(" is free. ")
	b.WriteString(e.ProcessInfo())
	if e.Limited {
		b.WriteString(FormatSize(e.AllowedMaximum))
		b.WriteString(" allowed; ")
	}
	b.WriteString("Of the allocated memory ")
	b.WriteString(FormatSize(e.Allocated))
	b.WriteString(" is allocated by PyTorch, and ")
	var unallocated uint64
	if e.Reserved > e.Allocated {
		unallocated = e.Reserved - e.Allocated
	}
	b.WriteString(FormatSize(unallocated))
	b.WriteString(" is reserved by PyTorch but unallocated.")
	b.WriteString(" If reserved but unallocated memory is large try setting")
	b.WriteString(" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid")
	b.WriteString(" fragmentation.  See documentation for Memory Management ")
	b.WriteString(" (" + MemoryManagementURL + ")")
	return b.String()
}

// ProcessInfo is the message's proc_info part: one sentence per process on the device, "Including
// non-PyTorch memory, this process has X memory in use. " for this one and "Process <pid> has X memory in
// use. " for the others; "" when the processes are unknown.
func (e *OutOfMemoryError) ProcessInfo() string {
	var b strings.Builder
	for _, p := range e.Processes {
		if p.Self {
			b.WriteString("Including non-PyTorch memory, this process")
		} else {
			b.WriteString("Process ")
			b.WriteString(strconv.Itoa(p.PID))
		}
		b.WriteString(" has ")
		b.WriteString(FormatSize(p.Used))
		b.WriteString(" memory in use. ")
	}
	return b.String()
}
