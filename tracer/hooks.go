package tracer

import "github.com/oomdbg/oomdbg/snapshot"

// The allocator's hooks. Their signatures match allocator.Observer, which a Recorder satisfies.
// Allocations, new segments and OOMs carry the stack of the code that asked for memory; frees do not, since
// the block's allocation already names its owner.

// Alloc records a block handed out: requested is the caller's size, block the size of the block.
// It takes the category and label the runtime gave with TagNextAlloc.
func (r *Recorder) Alloc(device int, stream int64, addr, requested, block uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(snapshot.ActionAlloc, device, stream)
	e.Addr, e.Size, e.BlockSize = addr, int64(requested), int64(block)
	e.Category, e.Label = r.next.category, r.next.label
	r.next = nextAlloc{}
	e.Stack = r.stack()
	r.emit(e)
}

// FreeRequested records the program letting go of a block.
func (r *Recorder) FreeRequested(device int, stream int64, addr, requested, block uint64) {
	r.block(snapshot.ActionFreeRequested, device, stream, addr, requested, block)
}

// FreeCompleted records a block going back to the allocator's cache.
func (r *Recorder) FreeCompleted(device int, stream int64, addr, requested, block uint64) {
	r.block(snapshot.ActionFreeCompleted, device, stream, addr, requested, block)
}

func (r *Recorder) block(a snapshot.Action, device int, stream int64, addr, requested, block uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(a, device, stream)
	e.Addr, e.Size, e.BlockSize = addr, int64(requested), int64(block)
	r.emit(e)
}

// SegmentAlloc records a new segment (cudaMalloc), with the stack of the allocation that needed it.
func (r *Recorder) SegmentAlloc(device int, stream int64, addr, size uint64) {
	r.segment(snapshot.ActionSegmentAlloc, device, stream, addr, size, true)
}

// SegmentFree records a segment given back to the device (cudaFree).
func (r *Recorder) SegmentFree(device int, stream int64, addr, size uint64) {
	r.segment(snapshot.ActionSegmentFree, device, stream, addr, size, false)
}

// SegmentMap records pages of an expandable segment mapped, with the stack of the allocation that needed them.
func (r *Recorder) SegmentMap(device int, stream int64, addr, size uint64) {
	r.segment(snapshot.ActionSegmentMap, device, stream, addr, size, true)
}

// SegmentUnmap records pages of an expandable segment unmapped.
func (r *Recorder) SegmentUnmap(device int, stream int64, addr, size uint64) {
	r.segment(snapshot.ActionSegmentUnmap, device, stream, addr, size, false)
}

func (r *Recorder) segment(a snapshot.Action, device int, stream int64, addr, size uint64, withStack bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(a, device, stream)
	e.Addr, e.Size = addr, int64(size)
	if withStack {
		e.Stack = r.stack()
	}
	r.emit(e)
}

// OOM records the allocator giving up: requested is the rounded request, allocSize what it tried to get from
// the device, deviceFree what the device had free.
func (r *Recorder) OOM(device int, stream int64, requested, allocSize, deviceFree uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := r.begin(snapshot.ActionOOM, device, stream)
	e.Size, e.BlockSize, e.DeviceFree = int64(requested), int64(allocSize), int64(deviceFree)
	e.Category, e.Label = r.next.category, r.next.label
	r.next = nextAlloc{}
	e.Stack = r.stack()
	r.emit(e)
}
