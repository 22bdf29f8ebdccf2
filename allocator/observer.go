package allocator

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
	// Alloc: a block was handed out (PyTorch's "alloc"). A segment_alloc or segment_map for new memory,
	// if any, comes just before it.
	Alloc(device int, stream int64, addr, requested, block uint64)
	// FreeRequested: the program freed the block ("free_requested").
	FreeRequested(device int, stream int64, addr, requested, block uint64)
	// FreeCompleted: the block went back to the cache ("free_completed"): right after FreeRequested, or,
	// for a block used on other streams, when their events complete (seen by a later Malloc or
	// ProcessEvents, or waited for by Synchronize or EmptyCache). block is the size before merging with free
	// neighbours.
	FreeCompleted(device int, stream int64, addr, requested, block uint64)
	// SegmentAlloc: a new segment was obtained from the device (cudaMalloc, "segment_alloc").
	SegmentAlloc(device int, stream int64, addr, size uint64)
	// SegmentFree: a cached segment was returned to the device (cudaFree, "segment_free").
	SegmentFree(device int, stream int64, addr, size uint64)
	// SegmentMap: pages were mapped into an expandable segment ("segment_map").
	SegmentMap(device int, stream int64, addr, size uint64)
	// SegmentUnmap: free pages of an expandable segment were unmapped ("segment_unmap").
	SegmentUnmap(device int, stream int64, addr, size uint64)
	// OOM: the allocator gave up on a request ("oom"); Malloc then returns an *OutOfMemoryError.
	OOM(device int, stream int64, requested, allocSize, deviceFree uint64)
}
