package allocator

import "testing"

// The caching host allocator's rules, from CachingHostAllocatorImpl (aten/src/ATen/core/CachingHostAllocator.h):
// a pinned request takes a power-of-two block, a freed block serves the next request of its size class and is
// not given back until empty_cache; pageable memory is taken and given back at the size asked.
func TestHostAllocatorCachesPinnedPowersOfTwo(t *testing.T) {
	t.Parallel()
	h := NewHostAllocator()
	var events []HostEvent
	h.SetObserver(func(e HostEvent) { events = append(events, e) })

	a, _ := h.Malloc(3000, true) // a 4096-byte block
	if st := h.Stats(); st.Allocated != 4096 || st.Reserved != 4096 || st.Pinned != 4096 {
		t.Fatalf("after a pinned 3000 B: %+v, want 4096 allocated and reserved", st)
	}
	p, _ := h.Malloc(3000, false) // pageable: exactly what was asked
	if st := h.Stats(); st.Allocated != 4096+3000 || st.Reserved != 4096+3000 {
		t.Fatalf("after a pageable 3000 B: %+v", st)
	}
	if err := h.Free(p); err != nil {
		t.Fatal(err)
	}
	if err := h.Free(a); err != nil {
		t.Fatal(err)
	}
	if st := h.Stats(); st.Allocated != 0 || st.Reserved != 4096 || st.PeakAllocated != 7096 {
		t.Fatalf("after both frees: %+v, want the pinned block cached", st)
	}
	b, _ := h.Malloc(2049, true) // same size class as 3000: the cached block, no new memory
	if b != a || h.Stats().Reserved != 4096 {
		t.Fatalf("a 2049 B pinned request got %#x (cached %#x), reserved %d", b, a, h.Stats().Reserved)
	}
	c, _ := h.Malloc(2048, true) // another class: a new 2048-byte block
	if c == a || h.Stats().Reserved != 4096+2048 {
		t.Fatalf("a 2048 B pinned request: %#x, reserved %d", c, h.Stats().Reserved)
	}
	h.Free(b)
	h.Free(c)
	h.EmptyCache()
	if st := h.Stats(); st.Reserved != 0 || st.Pinned != 0 {
		t.Fatalf("after EmptyCache: %+v", st)
	}
	if len(events) != 8 || !events[0].Alloc || events[0].Size != 4096 || events[0].Requested != 3000 {
		t.Fatalf("events: %+v", events)
	}
	if err := h.Free(12345); err == nil {
		t.Fatal("freeing an unknown address succeeded")
	}
	if addr, err := h.Malloc(0, true); addr != 0 || err != nil {
		t.Fatalf("Malloc(0) = %#x, %v", addr, err)
	}
}
