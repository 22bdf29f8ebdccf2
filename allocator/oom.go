package allocator

import "github.com/oomdbg/oomdbg/internal/torchrules"

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

// Error is PyTorch's message (torchrules.OOM).
func (e *OutOfMemoryError) Error() string {
	if e.TooLarge {
		return torchrules.TooLargeMessage
	}
	return e.message().Message()
}

func (e *OutOfMemoryError) message() torchrules.OOM {
	return torchrules.OOM{Device: e.Device, AllocSize: e.AllocSize, DeviceTotal: e.DeviceTotal, DeviceFree: e.DeviceFree,
		Processes: e.Processes, AllowedMaximum: e.AllowedMaximum, Limited: e.Limited, Allocated: e.Allocated,
		Reserved: e.Reserved}
}
