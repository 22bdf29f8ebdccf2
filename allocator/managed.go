package allocator

import (
	"fmt"
	"sort"
)

// CUDA unified memory (cudaMallocManaged), which bitsandbytes' paged optimizers keep their state in
// (functional.py get_paged: the buffers live outside PyTorch's caching allocator). Its pages move between
// host and device on demand: they come to the device when a kernel touches them, or when prefetched
// (cudaMemPrefetchAsync, F.prefetch_tensor before each optimizer update), and the driver evicts them to
// host when the device runs out of room for other allocations. The model here is at the granularity of a
// whole allocation's bytes: a range is resident up to the room the device has, and a cudaMalloc or
// cuMemCreate that does not fit evicts the least recently prefetched ranges first, instead of failing.

// ManagedMemory is a device's unified memory.
type ManagedMemory interface {
	// MallocManaged reserves size bytes of unified memory; none is resident on the device until prefetched.
	MallocManaged(size uint64) (addr uint64, err error)
	// FreeManaged releases a range MallocManaged returned.
	FreeManaged(addr uint64) error
	// Prefetch brings as much of the range to the device as the device has room for, evicting other
	// managed ranges (least recently prefetched first) but never memory allocated otherwise; it returns the
	// range's bytes left on the host (touched over the bus, no OOM).
	Prefetch(addr uint64) (onHost uint64)
	// ManagedStats returns what unified memory holds and has moved.
	ManagedStats() ManagedStats
	// SetManagedObserver sets a function told of every eviction and prefetch, with the allocator's lock
	// possibly held (it must not call back into the allocator).
	SetManagedObserver(f func(ManagedEvent))
}

// ManagedStats counts unified memory.
type ManagedStats struct {
	Allocated    uint64 // bytes of live managed ranges
	Resident     uint64 // of those, bytes on the device
	Evicted      uint64 // bytes evicted to host over the device's life
	PrefetchedIn uint64 // bytes brought (back) to the device over the device's life
}

// ManagedEvent is one movement of unified memory.
type ManagedEvent struct {
	Evicted  uint64 // bytes moved to host, to make room for Cause bytes of device memory
	Cause    uint64
	Prefetch uint64 // bytes moved to the device by a prefetch
	Stats    ManagedStats
}

// managedRange is one cudaMallocManaged allocation.
type managedRange struct {
	addr           uint64
	size, resident uint64
	touched        uint64 // when it was last prefetched, for least-recently-used eviction
}

// managedState is the unified memory of a SimDevice.
type managedState struct {
	ranges   map[uint64]*managedRange
	next     uint64 // address of the next range
	clock    uint64
	stats    ManagedStats
	observer func(ManagedEvent)
}

// managedBase is where the simulated device places unified memory, apart from cudaMalloc and reservations.
const managedBase = 0x500000000000

// MallocManaged implements ManagedMemory.
func (d *SimDevice) MallocManaged(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 {
		return 0, fmt.Errorf("sim device %d: cudaMallocManaged of 0 bytes", d.index)
	}
	m := &d.managed
	if m.ranges == nil {
		m.ranges, m.next = map[uint64]*managedRange{}, managedBase
	}
	addr := m.next
	m.next += alignUp(size, simAddressAlign)
	m.ranges[addr] = &managedRange{addr: addr, size: size}
	m.stats.Allocated += size
	return addr, nil
}

// FreeManaged implements ManagedMemory.
func (d *SimDevice) FreeManaged(addr uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := &d.managed
	r, ok := m.ranges[addr]
	if !ok {
		return fmt.Errorf("sim device %d: cudaFree of unknown managed address %#x", d.index, addr)
	}
	delete(m.ranges, addr)
	m.stats.Allocated -= r.size
	m.stats.Resident -= r.resident
	return nil
}

// Prefetch implements ManagedMemory.
func (d *SimDevice) Prefetch(addr uint64) uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	m := &d.managed
	r, ok := m.ranges[addr]
	if !ok {
		return 0
	}
	m.clock++
	r.touched = m.clock
	want := r.size - r.resident
	if want == 0 {
		return 0
	}
	free := d.freeLocked()
	if free < want { // other managed ranges make room; memory allocated otherwise never does
		evicted := d.evictLocked(want-free, r)
		free += evicted
		if evicted > 0 && m.observer != nil {
			m.observer(ManagedEvent{Evicted: evicted, Cause: want, Stats: m.stats})
		}
	}
	in := min(want, free)
	r.resident += in
	m.stats.Resident += in
	m.stats.PrefetchedIn += in
	if in > 0 && m.observer != nil {
		m.observer(ManagedEvent{Prefetch: in, Stats: m.stats})
	}
	return r.size - r.resident
}

// ManagedStats implements ManagedMemory.
func (d *SimDevice) ManagedStats() ManagedStats {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.managed.stats
}

// SetManagedObserver implements ManagedMemory.
func (d *SimDevice) SetManagedObserver(f func(ManagedEvent)) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.managed.observer = f
}

// makeRoomLocked evicts managed ranges until size bytes are free, if they can be; the caller then tries
// its allocation against freeLocked as before. It is what lets a cudaMalloc succeed where resident paged
// optimizer state fills the device.
func (d *SimDevice) makeRoomLocked(size uint64) {
	free := d.freeLocked()
	if size <= free || d.managed.stats.Resident == 0 {
		return
	}
	evicted := d.evictLocked(size-free, nil)
	if evicted > 0 && d.managed.observer != nil {
		d.managed.observer(ManagedEvent{Evicted: evicted, Cause: size, Stats: d.managed.stats})
	}
}

// evictLocked moves at least need bytes of resident managed memory to host, least recently prefetched
// ranges first, sparing keep; it returns the bytes moved (less than need when there is not enough).
func (d *SimDevice) evictLocked(need uint64, keep *managedRange) uint64 {
	m := &d.managed
	var victims []*managedRange
	for _, r := range m.ranges {
		if r.resident > 0 && r != keep {
			victims = append(victims, r)
		}
	}
	sort.Slice(victims, func(i, j int) bool {
		a, b := victims[i], victims[j]
		return a.touched < b.touched || a.touched == b.touched && a.addr < b.addr
	})
	var moved uint64
	for _, r := range victims {
		if moved >= need {
			break
		}
		n := min(r.resident, need-moved)
		r.resident -= n
		moved += n
	}
	m.stats.Resident -= moved
	m.stats.Evicted += moved
	return moved
}
