package replay

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
)

// unlimited is the device memory of a replay that has no capacity to respect: more than any GPU has, small
// enough that expandable segments (which reserve 9/8 of it in address space per stream and pool) fit the
// simulated address space many times over.
const unlimited = 256 << 30

// traceDevice is the fidelity replay's device. Its cudaMalloc hands out the address the recording got for
// the segment being replayed (the hint) when that range is free, else an address above every recorded one;
// everything else (expandable segments' address reservations and pages) is a SimDevice's. It never runs out
// of memory: the recording's own releases drive the replay's.
type traceDevice struct {
	*allocator.SimDevice
	hint    uint64  // the address for the next Malloc, 0 for none
	segs    spanSet // segments handed out
	next    uint64  // where addresses above the recorded ones begin
	mallocs int
}

type span struct{ addr, size uint64 }

func (s span) end() uint64 { return s.addr + s.size }

func newTraceDevice(index int, above uint64) *traceDevice {
	const align = 2 << 20
	return &traceDevice{SimDevice: allocator.NewSimDevice(index, unlimited, 0), next: (above/align + 1) * align,
		segs: newSpanSet(0)}
}

// Malloc implements allocator.Device.
func (d *traceDevice) Malloc(size uint64) (uint64, error) {
	if size == 0 {
		return 0, fmt.Errorf("replay device: cudaMalloc of 0 bytes")
	}
	addr := d.hint
	d.hint = 0
	if addr == 0 || addr+size < addr || d.segs.overlaps(addr, size) {
		addr = d.next
		d.next += (size + (2<<20 - 1)) &^ (2<<20 - 1)
	}
	d.segs.add(span{addr, size})
	d.mallocs++
	return addr, nil
}

// Free implements allocator.Device.
func (d *traceDevice) Free(addr uint64) error {
	if !d.segs.remove(addr) {
		return fmt.Errorf("replay device: cudaFree of unknown address %#x", addr)
	}
	return nil
}

// MemGetInfo implements allocator.Device: the replay device is never full.
func (d *traceDevice) MemGetInfo() (free, total uint64, err error) { return unlimited, unlimited, nil }
