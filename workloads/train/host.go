package train

import (
	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
)

// Host memory is recorded as a device of its own (snapshot.HostDeviceIndex): readings of the host allocator's
// allocated and reserved bytes, and of each category's bytes, after every allocation and free. Readings, not
// allocation events: the timeline's allocated and reserved curves, the peak and the OOM are the GPU's, and
// host memory must not add to them.

// hostTracker is the host runtime's tracer: it learns what each host allocation holds from the tag the
// runtime gives just before allocating, and records the host allocator's totals and the changed category's
// bytes as readings.
type hostTracker struct {
	rec    *tracer.Recorder
	next   snapshot.Category
	cats   map[uint64]snapshot.Category // live blocks' categories, by address
	size   map[uint64]uint64
	totals [snapshot.NumCategories]int64
}

func newHostTracker(rec *tracer.Recorder) *hostTracker {
	return &hostTracker{rec: rec, cats: map[uint64]snapshot.Category{}, size: map[uint64]uint64{}}
}

func (h *hostTracker) SetPhase(snapshot.Phase)                    {}
func (h *hostTracker) TagNextAlloc(c snapshot.Category, _ string) { h.next = c }
func (h *hostTracker) PushScope(string)                           {}
func (h *hostTracker) PopScope()                                  {}

// SetCategory moves a live block's bytes to category c.
func (h *hostTracker) SetCategory(_ int, addr uint64, c snapshot.Category, _ string) {
	old, ok := h.cats[addr]
	if !ok || old == c {
		return
	}
	h.totals[old] -= int64(h.size[addr])
	h.totals[c] += int64(h.size[addr])
	h.cats[addr] = c
	h.rec.Sample(snapshot.HostDeviceIndex, snapshot.SampleHostCategory+old.String(), h.totals[old])
	h.rec.Sample(snapshot.HostDeviceIndex, snapshot.SampleHostCategory+c.String(), h.totals[c])
}

// observe is the host allocator's observer.
func (h *hostTracker) observe(e allocator.HostEvent) {
	c := h.next
	if e.Alloc {
		h.cats[e.Addr], h.size[e.Addr] = c, e.Size
		h.totals[c] += int64(e.Size)
	} else {
		c = h.cats[e.Addr]
		h.totals[c] -= int64(e.Size)
		delete(h.cats, e.Addr)
		delete(h.size, e.Addr)
	}
	// The category first: a reader takes the categories as they stand when the allocated bytes are read.
	h.rec.Sample(snapshot.HostDeviceIndex, snapshot.SampleHostCategory+c.String(), h.totals[c])
	h.rec.Sample(snapshot.HostDeviceIndex, snapshot.SampleHostAllocated, int64(e.Stats.Allocated))
	h.rec.Sample(snapshot.HostDeviceIndex, snapshot.SampleHostReserved, int64(e.Stats.Reserved))
}
