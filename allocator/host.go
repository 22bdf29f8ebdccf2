package allocator

import (
	"fmt"
	"sync"

	"github.com/oomdbg/oomdbg/internal/torchrules"
)

// HostAllocator is a training process's host memory as CPU offload uses it, in two kinds:
//
//   - Page-locked (pinned) blocks, from PyTorch's caching host allocator (tensor.pin_memory(), FSDP's CPU
//     gradient buffers, DeepSpeed's buffers with pin_memory): each request is rounded up to a power of two
//     (torchrules.HostBlockSize), a freed block goes to the free list of its size and serves the next request
//     of that size, and nothing is given back to the system until EmptyCache. Blocks are never split.
//   - Pageable memory (ordinary CPU tensors: the optimizer's state, DeepSpeed's buffers without pin_memory),
//     which the system allocator hands out at the size asked and takes back on free.
//
// Allocated counts the bytes of live blocks (pinned blocks at their rounded size); Reserved adds the pinned
// blocks cached on the free lists. There is no capacity: host memory is what it is, and the figures say how
// much a rank needs. It is safe for concurrent use.
type HostAllocator struct {
	mu       sync.Mutex
	next     uint64
	live     map[uint64]hostBlock
	free     map[uint64][]uint64 // pinned free lists: block size -> addresses
	stats    HostStats
	observer func(HostEvent)
}

type hostBlock struct {
	requested, size uint64
	pinned          bool
}

// HostStats are the host allocator's totals.
type HostStats struct {
	Allocated, PeakAllocated uint64 // bytes of live blocks
	Reserved, PeakReserved   uint64 // live blocks plus cached pinned ones
	Pinned                   uint64 // pinned bytes held from the system (live or cached)
}

// HostEvent is one allocation or free of host memory.
type HostEvent struct {
	Alloc     bool   // an allocation; false for a free
	Addr      uint64 // the block's address
	Requested uint64 // bytes asked for
	Size      uint64 // the block's bytes: Requested, or its power-of-two block when pinned
	Pinned    bool
	Stats     HostStats // the totals after the event
}

// hostBase is where host addresses start: far from any simulated device's, so a block names its memory.
const hostBase = 0x7f00_0000_0000

// NewHostAllocator returns an empty host allocator.
func NewHostAllocator() *HostAllocator {
	return &HostAllocator{next: hostBase, live: map[uint64]hostBlock{}, free: map[uint64][]uint64{}}
}

// SetObserver sets f to be told about every allocation and free (nil: nobody).
func (h *HostAllocator) SetObserver(f func(HostEvent)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.observer = f
}

// Malloc allocates size bytes of host memory, page-locked when pinned. A request of 0 bytes returns address
// 0 and allocates nothing, as both allocators do.
func (h *HostAllocator) Malloc(size uint64, pinned bool) (uint64, error) {
	if size == 0 {
		return 0, nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	block := size
	if pinned {
		block = torchrules.HostBlockSize(size)
	}
	if block > 1<<62 {
		return 0, fmt.Errorf("host allocation of %d bytes: %w", size, ErrOutOfMemory)
	}
	var addr uint64
	if list := h.free[block]; pinned && len(list) > 0 { // get_free_block: the most recently freed of the size
		addr = list[len(list)-1]
		h.free[block] = list[:len(list)-1]
	} else {
		addr = h.next
		h.next += (block + 4095) &^ 4095 // page-aligned, so that addresses never overlap
		h.stats.Reserved += block
		if pinned {
			h.stats.Pinned += block
		}
	}
	h.live[addr] = hostBlock{requested: size, size: block, pinned: pinned}
	h.stats.Allocated += block
	h.stats.PeakAllocated = max(h.stats.PeakAllocated, h.stats.Allocated)
	h.stats.PeakReserved = max(h.stats.PeakReserved, h.stats.Reserved)
	h.notify(HostEvent{Alloc: true, Addr: addr, Requested: size, Size: block, Pinned: pinned})
	return addr, nil
}

// Free gives a block back: a pinned one to its free list, a pageable one to the system.
func (h *HostAllocator) Free(addr uint64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	b, ok := h.live[addr]
	if !ok {
		return fmt.Errorf("host free of %#x, which is not allocated", addr)
	}
	delete(h.live, addr)
	h.stats.Allocated -= b.size
	if b.pinned {
		h.free[b.size] = append(h.free[b.size], addr)
	} else {
		h.stats.Reserved -= b.size
	}
	h.notify(HostEvent{Addr: addr, Requested: b.requested, Size: b.size, Pinned: b.pinned})
	return nil
}

// EmptyCache gives the cached pinned blocks back to the system (torch._C._host_emptyCache).
func (h *HostAllocator) EmptyCache() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for size, list := range h.free {
		h.stats.Reserved -= size * uint64(len(list))
		h.stats.Pinned -= size * uint64(len(list))
	}
	clear(h.free)
}

// Stats returns the totals.
func (h *HostAllocator) Stats() HostStats {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.stats
}

func (h *HostAllocator) notify(e HostEvent) {
	if h.observer != nil {
		e.Stats = h.stats
		h.observer(e)
	}
}
