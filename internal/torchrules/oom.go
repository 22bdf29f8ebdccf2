package torchrules

import (
	"strconv"
	"strings"
)

// MemoryManagementURL is the documentation link at the end of PyTorch's OOM message (PyTorch >= 2.8).
const MemoryManagementURL = "https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf"

// TooLargeMessage is the message of a request of at least OneExaByte, refused before the allocator tries.
const TooLargeMessage = "CUDA out of memory. Tried to allocate more than 1EB memory."

// OOM holds what PyTorch's OutOfMemoryError message reports; Message renders it.
type OOM struct {
	Device int
	// AllocSize is what the allocator tried to get from the device, get_allocation_size(round_size(request)):
	// the size the message says it "tried to allocate", not the request.
	AllocSize uint64
	// DeviceTotal and DeviceFree are cudaMemGetInfo after the recovery chain. A DeviceTotal of 0 means the
	// capacity is unknown (an imported trace records only the free bytes).
	DeviceTotal, DeviceFree uint64
	// Processes is what NVML reports of the processes on the device; nil when unknown.
	Processes []ProcessMemory
	// AllowedMaximum is the memory-fraction limit when Limited.
	AllowedMaximum uint64
	Limited        bool
	// Allocated and Reserved are allocated_bytes and reserved_bytes (all pools) after the recovery chain.
	Allocated, Reserved uint64
}

// ProcessMemory is one process's use of a device as NVML reports it.
type ProcessMemory struct {
	PID  int
	Used uint64 // bytes of device memory the process holds, including its CUDA context
	Self bool   // the process that owns the allocator
}

// Message is PyTorch's message, byte for byte. Where DeviceTotal is 0 the capacity is unknown, and the
// message, no longer PyTorch's, says in PyTorch's words what is known: the free bytes at the time, what was
// allocated and what was reserved.
func (m OOM) Message() string {
	var b strings.Builder
	b.WriteString("CUDA out of memory. Tried to allocate ")
	b.WriteString(FormatSize(m.AllocSize))
	b.WriteString(". GPU ")
	b.WriteString(strconv.Itoa(m.Device))
	if m.DeviceTotal == 0 {
		b.WriteString(" had ")
		b.WriteString(FormatSize(m.DeviceFree))
		b.WriteString(" free. Of the allocated memory ")
		b.WriteString(FormatSize(m.Allocated))
		b.WriteString(" was allocated by PyTorch, and ")
		b.WriteString(FormatSize(m.unallocated()))
		b.WriteString(" was reserved by PyTorch but unallocated.")
		return b.String()
	}
	b.WriteString(" has a total capacity of ")
	b.WriteString(FormatSize(m.DeviceTotal))
	b.WriteString(" of which ")
	b.WriteString(FormatSize(m.DeviceFree))
	b.WriteString(" is free. ")
	b.WriteString(m.ProcessInfo())
	if m.Limited {
		b.WriteString(FormatSize(m.AllowedMaximum))
		b.WriteString(" allowed; ")
	}
	b.WriteString("Of the allocated memory ")
	b.WriteString(FormatSize(m.Allocated))
	b.WriteString(" is allocated by PyTorch, and ")
	b.WriteString(FormatSize(m.unallocated()))
	b.WriteString(" is reserved by PyTorch but unallocated.")
	// Two spaces after "fragmentation." and before "(": PyTorch's text.
	b.WriteString(" If reserved but unallocated memory is large try setting")
	b.WriteString(" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid")
	b.WriteString(" fragmentation.  See documentation for Memory Management ")
	b.WriteString(" (" + MemoryManagementURL + ")")
	return b.String()
}

func (m OOM) unallocated() uint64 {
	if m.Reserved > m.Allocated {
		return m.Reserved - m.Allocated
	}
	return 0
}

// ProcessInfo is the message's proc_info part: one sentence per process on the device, "Including
// non-PyTorch memory, this process has X memory in use. " for this one and "Process <pid> has X memory in
// use. " for the others; "" when the processes are unknown.
func (m OOM) ProcessInfo() string {
	var b strings.Builder
	for _, p := range m.Processes {
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
