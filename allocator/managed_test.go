package allocator

import (
	"errors"
	"testing"
)

// TestManagedMemoryIsEvictedForDeviceAllocations walks unified memory through what a paged optimizer sees:
// state prefetched onto a device with room, a cudaMalloc the remaining room cannot hold evicting the least
// recently prefetched state (and only as much as it needs), a prefetch that finds the device full of
// allocator memory leaving the rest on the host, and no eviction of anything but managed memory.
func TestManagedMemoryIsEvictedForDeviceAllocations(t *testing.T) {
	const mib = 1 << 20
	d := NewSimDevice(0, 1024*mib, 0)
	var events []ManagedEvent
	d.SetManagedObserver(func(e ManagedEvent) { events = append(events, e) })
	a, _ := d.MallocManaged(300 * mib)
	b, _ := d.MallocManaged(300 * mib)
	if st := d.ManagedStats(); st.Allocated != 600*mib || st.Resident != 0 {
		t.Fatalf("before any prefetch: %+v", st)
	}
	if left := d.Prefetch(a); left != 0 {
		t.Fatalf("prefetch of a left %d on host", left)
	}
	d.Prefetch(b)
	if free, _, _ := d.MemGetInfo(); free != 424*mib {
		t.Fatalf("free %d MiB with 600 MiB resident, want 424", free/mib)
	}
	// 500 MiB of segments: 76 MiB must come from a, the least recently prefetched.
	seg, err := d.Malloc(500 * mib)
	if err != nil {
		t.Fatalf("cudaMalloc with managed memory to evict: %v", err)
	}
	st := d.ManagedStats()
	if st.Evicted != 76*mib || st.Resident != 524*mib {
		t.Fatalf("after the segment: %+v, want 76 MiB evicted and 524 resident", st)
	}
	if a := d.managed.ranges[a]; a.resident != 224*mib {
		t.Errorf("a has %d MiB resident, want 224 (it was prefetched first)", a.resident/mib)
	}
	// a prefetched again: the device is full of b and the segment, so b is evicted for it.
	if left := d.Prefetch(a); left != 0 {
		t.Errorf("re-prefetch of a left %d MiB on host, want 0 (b evicted)", left/mib)
	}
	if got := d.managed.ranges[b].resident; got != 224*mib {
		t.Errorf("b has %d MiB resident, want 224", got/mib)
	}
	// Segments fill the device: nothing managed to evict is left for a second prefetch.
	d.Malloc(500 * mib)
	if st := d.ManagedStats(); st.Resident != 24*mib {
		t.Errorf("%d MiB resident with 1000 MiB of segments, want 24", st.Resident/mib)
	}
	if left := d.Prefetch(b); left != 276*mib {
		t.Errorf("prefetch of b onto a full device left %d MiB on host, want 276", left/mib)
	}
	// Managed memory does not make room beyond itself: this still fails.
	if _, err := d.Malloc(100 * mib); !errors.Is(err, ErrOutOfMemory) {
		t.Errorf("cudaMalloc beyond the device: %v, want ErrOutOfMemory", err)
	}
	var evicted uint64
	for _, e := range events {
		evicted += e.Evicted
	}
	if evicted != d.ManagedStats().Evicted || evicted == 0 {
		t.Errorf("events report %d evicted bytes, stats %d", evicted, d.ManagedStats().Evicted)
	}
	d.Free(seg)
	if err := d.FreeManaged(a); err != nil {
		t.Fatal(err)
	}
	if err := d.FreeManaged(b); err != nil {
		t.Fatal(err)
	}
	if st := d.ManagedStats(); st.Allocated != 0 || st.Resident != 0 {
		t.Errorf("after freeing everything: %+v", st)
	}
	if err := d.FreeManaged(a); err == nil {
		t.Error("freeing a range twice is not an error")
	}
}
