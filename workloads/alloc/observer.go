package alloc

// Observer receives the allocator's trace as it happens, in the order PyTorch's record_trace would record it.
// Sizes follow PyTorch's trace: requested is the caller's unrounded size, block the size of the block handed
// out (rounded, or larger when the remainder was not split off), size a segment's or mapped range's bytes.
// For an OOM, requested is the rounded request (the trace entry's size), allocSize what the allocator tried to
// get from the device (the size the OOM message prints), deviceFree what the device reported free.
//
// Calls are made synchronously with the allocator's lock held, so an Observer must not call back into the
// allocator. The parameter types are basic so that an observer outside this package (tracer.Recorder)
// satisfies the interface without importing it.
type Observer interface {
	Alloc(device int, stream int64, addr, requested, block uint64)
	FreeRequested(device int, stream int64, addr, requested, block uint64)
	FreeCompleted(device int, stream int64, addr, requested, block uint64)
	SegmentAlloc(device int, stream int64, addr, size uint64)
	SegmentFree(device int, stream int64, addr, size uint64)
	SegmentMap(device int, stream int64, addr, size uint64)
	SegmentUnmap(device int, stream int64, addr, size uint64)
	OOM(device int, stream int64, requested, allocSize, deviceFree uint64)
}
