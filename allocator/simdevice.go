package allocator

import (
	"fmt"
	"os"
	"sort"
	"sync"
)

// Where the simulated device places memory. cudaMalloc addresses on Linux typically sit just below
// 0x800000000000 (the top of user space); VMM reservations are placed lower so the two never collide.
const (
	simMallocBase   = 0x7f0000000000
	simMallocSpan   = 0x010000000000 // 1 TiB of cudaMalloc address space
	simReserveBase  = 0x600000000000
	simReserveSpan  = 0x1f0000000000 // ~31 TiB for expandable-segment reservations
	simAddressAlign = 2 << 20        // cudaMalloc and cuMemAddressReserve hand out 2 MiB-aligned addresses
)

// SimDevice is a deterministic in-memory GPU: it hands out well-aligned addresses and accounts every byte
// the allocator holds against its capacity minus the CUDA-context reserve, so OOMs happen where they would
// on a real card of that size. It is safe for concurrent use.
type SimDevice struct {
	mu             sync.Mutex
	index          int
	capacity       uint64
	contextReserve uint64
	nonAllocator   uint64
	others         []ProcessMemory

	used     uint64            // bytes held through Malloc and CreatePhysical
	segments map[uint64]uint64 // Malloc'd segments: address -> size

	reservations map[uint64]uint64         // reserved ranges: address -> size
	handles      map[PhysicalHandle]uint64 // live physical allocations: handle -> size
	mappings     map[uint64]simMapping     // mapped ranges: address -> mapping
	nextHandle   PhysicalHandle

	mallocSpace  addressSpace
	reserveSpace addressSpace

	managed managedState // unified memory (managed.go)
}

type simMapping struct {
	size   uint64
	handle PhysicalHandle
}

// NewSimDevice returns a simulated device with the given ordinal and capacity in bytes. contextReserve is
// what the CUDA context, cuBLAS workspaces and the like take before the allocator gets anything (typically
// 300-600 MiB); it counts as this process's memory in the OOM message.
func NewSimDevice(index int, capacity, contextReserve uint64) *SimDevice {
	if contextReserve > capacity {
		contextReserve = capacity
	}
	return &SimDevice{
		index:          index,
		capacity:       capacity,
		contextReserve: contextReserve,
		segments:       make(map[uint64]uint64),
		reservations:   make(map[uint64]uint64),
		handles:        make(map[PhysicalHandle]uint64),
		mappings:       make(map[uint64]simMapping),
		nextHandle:     1,
		mallocSpace:    newAddressSpace(simMallocBase, simMallocSpan),
		reserveSpace:   newAddressSpace(simReserveBase, simReserveSpan),
	}
}

// SetNonAllocatorMemory sets how much device memory this process holds outside the caching allocator
// (NCCL buffers, a second allocator...). It reduces free memory and shows in the OOM message.
func (d *SimDevice) SetNonAllocatorMemory(bytes uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.nonAllocator = bytes
}

// SetOtherProcesses sets the other processes sharing the device; their memory is not available to this one.
func (d *SimDevice) SetOtherProcesses(procs []ProcessMemory) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.others = d.others[:0]
	for _, p := range procs {
		p.Self = false
		d.others = append(d.others, p)
	}
}

// Used returns the bytes the allocator holds on the device: Malloc'd segments plus physical memory created
// for expandable segments. It equals the allocator's reserved_bytes.
func (d *SimDevice) Used() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.used
}

// Index implements Device.
func (d *SimDevice) Index() int { return d.index }

// TotalMemory implements Device: the full capacity, as totalGlobalMem includes the context's share.
func (d *SimDevice) TotalMemory() uint64 { return d.capacity }

// MemGetInfo implements Device.
func (d *SimDevice) MemGetInfo() (free, total uint64, err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.freeLocked(), d.capacity, nil
}

func (d *SimDevice) freeLocked() uint64 {
	taken := d.contextReserve + d.nonAllocator + d.used + d.managed.stats.Resident
	for _, p := range d.others {
		taken += p.Used
	}
	if taken >= d.capacity {
		return 0
	}
	return d.capacity - taken
}

// Processes implements Device: this process (context, non-allocator memory and allocator memory) first,
// then the others.
func (d *SimDevice) Processes() []ProcessMemory {
	d.mu.Lock()
	defer d.mu.Unlock()
	procs := make([]ProcessMemory, 0, 1+len(d.others))
	procs = append(procs, ProcessMemory{PID: os.Getpid(), Used: d.contextReserve + d.nonAllocator + d.used + d.managed.stats.Resident, Self: true})
	return append(procs, d.others...)
}

// Malloc implements Device.
func (d *SimDevice) Malloc(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 {
		return 0, fmt.Errorf("sim device %d: cudaMalloc of 0 bytes", d.index)
	}
	d.makeRoomLocked(size)
	if size > d.freeLocked() {
		return 0, ErrOutOfMemory
	}
	addr, ok := d.mallocSpace.take(size)
	if !ok {
		return 0, ErrOutOfMemory
	}
	d.segments[addr] = size
	d.used += size
	return addr, nil
}

// Free implements Device.
func (d *SimDevice) Free(addr uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	size, ok := d.segments[addr]
	if !ok {
		return fmt.Errorf("sim device %d: cudaFree of unknown address %#x", d.index, addr)
	}
	delete(d.segments, addr)
	d.mallocSpace.give(addr, size)
	d.used -= size
	return nil
}

// ReserveAddressRange implements Device.
func (d *SimDevice) ReserveAddressRange(size uint64) (uint64, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 {
		return 0, fmt.Errorf("sim device %d: cuMemAddressReserve of 0 bytes", d.index)
	}
	addr, ok := d.reserveSpace.take(size)
	if !ok {
		return 0, fmt.Errorf("sim device %d: cuMemAddressReserve of %d bytes: virtual address space exhausted", d.index, size)
	}
	d.reservations[addr] = size
	return addr, nil
}

// FreeAddressRange implements Device.
func (d *SimDevice) FreeAddressRange(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if got, ok := d.reservations[addr]; !ok || got != size {
		return fmt.Errorf("sim device %d: cuMemAddressFree of unknown range %#x+%d", d.index, addr, size)
	}
	for m, mp := range d.mappings {
		if m >= addr && m < addr+size {
			return fmt.Errorf("sim device %d: cuMemAddressFree of %#x with %#x+%d still mapped", d.index, addr, m, mp.size)
		}
	}
	delete(d.reservations, addr)
	d.reserveSpace.give(addr, size)
	return nil
}

// CreatePhysical implements Device.
func (d *SimDevice) CreatePhysical(size uint64) (PhysicalHandle, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if size == 0 {
		return 0, fmt.Errorf("sim device %d: cuMemCreate of 0 bytes", d.index)
	}
	d.makeRoomLocked(size)
	if size > d.freeLocked() {
		return 0, ErrOutOfMemory
	}
	h := d.nextHandle
	d.nextHandle++
	d.handles[h] = size
	d.used += size
	return h, nil
}

// ReleasePhysical implements Device.
func (d *SimDevice) ReleasePhysical(h PhysicalHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	size, ok := d.handles[h]
	if !ok {
		return fmt.Errorf("sim device %d: cuMemRelease of unknown handle %d", d.index, h)
	}
	for _, mp := range d.mappings {
		if mp.handle == h {
			return fmt.Errorf("sim device %d: cuMemRelease of handle %d while mapped", d.index, h)
		}
	}
	delete(d.handles, h)
	d.used -= size
	return nil
}

// Map implements Device.
func (d *SimDevice) Map(addr, size uint64, h PhysicalHandle) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	hsize, ok := d.handles[h]
	if !ok || hsize != size {
		return fmt.Errorf("sim device %d: cuMemMap of %#x+%d with bad handle %d", d.index, addr, size, h)
	}
	inside := false
	for r, rsize := range d.reservations {
		if addr >= r && addr+size <= r+rsize {
			inside = true
			break
		}
	}
	if !inside {
		return fmt.Errorf("sim device %d: cuMemMap of %#x+%d outside any reservation", d.index, addr, size)
	}
	for m, mp := range d.mappings {
		if addr < m+mp.size && m < addr+size {
			return fmt.Errorf("sim device %d: cuMemMap of %#x+%d overlaps mapping %#x+%d", d.index, addr, size, m, mp.size)
		}
	}
	d.mappings[addr] = simMapping{size: size, handle: h}
	return nil
}

// Unmap implements Device.
func (d *SimDevice) Unmap(addr, size uint64) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	mp, ok := d.mappings[addr]
	if !ok || mp.size != size {
		return fmt.Errorf("sim device %d: cuMemUnmap of unmapped range %#x+%d", d.index, addr, size)
	}
	delete(d.mappings, addr)
	return nil
}

// MappedBytes returns the bytes currently mapped into reservations.
func (d *SimDevice) MappedBytes() uint64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var n uint64
	for _, mp := range d.mappings {
		n += mp.size
	}
	return n
}

// addressSpace hands out aligned ranges first-fit from a span, so freed addresses are reused lowest
// first, as the driver tends to do. Segment counts are in the thousands at most, so a sorted slice of free
// ranges is plenty.
type addressSpace struct {
	free []addrRange // sorted by start, coalesced
}

type addrRange struct{ start, end uint64 }

func newAddressSpace(base, span uint64) addressSpace {
	return addressSpace{free: []addrRange{{base, base + span}}}
}

func alignUp(x, a uint64) uint64 { return (x + a - 1) / a * a }

func (s *addressSpace) take(size uint64) (uint64, bool) {
	need := alignUp(size, simAddressAlign)
	if need < size {
		return 0, false
	}
	for i, r := range s.free {
		start := alignUp(r.start, simAddressAlign)
		if start < r.end && r.end-start >= need {
			switch {
			case start == r.start && start+need == r.end:
				s.free = append(s.free[:i], s.free[i+1:]...)
			case start == r.start:
				s.free[i].start = start + need
			case start+need == r.end:
				s.free[i].end = start
			default:
				s.free = append(s.free, addrRange{})
				copy(s.free[i+2:], s.free[i+1:])
				s.free[i].end = start
				s.free[i+1] = addrRange{start + need, r.end}
			}
			return start, true
		}
	}
	return 0, false
}

func (s *addressSpace) give(addr, size uint64) {
	r := addrRange{addr, addr + alignUp(size, simAddressAlign)}
	i := sort.Search(len(s.free), func(i int) bool { return s.free[i].start > addr })
	s.free = append(s.free, addrRange{})
	copy(s.free[i+1:], s.free[i:])
	s.free[i] = r
	// Coalesce with the neighbours.
	if i+1 < len(s.free) && s.free[i].end == s.free[i+1].start {
		s.free[i].end = s.free[i+1].end
		s.free = append(s.free[:i+1], s.free[i+2:]...)
	}
	if i > 0 && s.free[i-1].end == s.free[i].start {
		s.free[i-1].end = s.free[i].end
		s.free = append(s.free[:i], s.free[i+1:]...)
	}
}
