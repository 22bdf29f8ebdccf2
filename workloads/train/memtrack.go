package train

import "github.com/oomdbg/oomdbg/allocator"

// memTracker follows reserved and allocated bytes through the allocator's trace, for the run's
// fragmentation figure, and passes every call on to the recorder, if any. Reserved bytes grow only at a new
// segment or mapping, and the allocator hands out the block it was made for next: the peak is taken at
// that alloc, so that the two count together.
type memTracker struct {
	next allocator.Observer // nil: nothing is recorded

	reserved, allocated int64
	peakReserved        int64
	maxReserved         int64 // the most reserved, at once (peakReserved waits for the next alloc)
	unallocatedAtPeak   int64
}

func (m *memTracker) Alloc(device int, stream int64, addr, requested, block uint64) {
	m.allocated += int64(block)
	if m.reserved > m.peakReserved {
		m.peakReserved, m.unallocatedAtPeak = m.reserved, m.reserved-m.allocated
	}
	if m.next != nil {
		m.next.Alloc(device, stream, addr, requested, block)
	}
}

func (m *memTracker) FreeRequested(device int, stream int64, addr, requested, block uint64) {
	m.allocated -= int64(block)
	if m.next != nil {
		m.next.FreeRequested(device, stream, addr, requested, block)
	}
}

func (m *memTracker) FreeCompleted(device int, stream int64, addr, requested, block uint64) {
	if m.next != nil {
		m.next.FreeCompleted(device, stream, addr, requested, block)
	}
}

func (m *memTracker) SegmentAlloc(device int, stream int64, addr, size uint64) {
	m.reserved += int64(size)
	m.maxReserved = max(m.maxReserved, m.reserved)
	if m.next != nil {
		m.next.SegmentAlloc(device, stream, addr, size)
	}
}

func (m *memTracker) SegmentFree(device int, stream int64, addr, size uint64) {
	m.reserved -= int64(size)
	if m.next != nil {
		m.next.SegmentFree(device, stream, addr, size)
	}
}

func (m *memTracker) SegmentMap(device int, stream int64, addr, size uint64) {
	m.reserved += int64(size)
	m.maxReserved = max(m.maxReserved, m.reserved)
	if m.next != nil {
		m.next.SegmentMap(device, stream, addr, size)
	}
}

func (m *memTracker) SegmentUnmap(device int, stream int64, addr, size uint64) {
	m.reserved -= int64(size)
	if m.next != nil {
		m.next.SegmentUnmap(device, stream, addr, size)
	}
}

func (m *memTracker) OOM(device int, stream int64, requested, allocSize, deviceFree uint64) {
	if m.next != nil {
		m.next.OOM(device, stream, requested, allocSize, deviceFree)
	}
}
