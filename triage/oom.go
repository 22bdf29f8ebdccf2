package triage

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// oomMessage rebuilds PyTorch's OutOfMemoryError message for oom event e from what the snapshot recorded:
// the size the allocator tried to get, the device's capacity and free memory, and allocated and reserved
// bytes after the recovery chain. exact is false when the snapshot lacks the device's capacity (imported
// traces): the message then says what is known.
func oomMessage(m snapshot.Meta, e *snapshot.Event, allocSize, allocated, reserved int64) (msg string, exact bool) {
	bytes := func(n int64) uint64 { return uint64(max(n, 0)) }
	oom := torchrules.OOM{Device: int(e.Device), AllocSize: bytes(allocSize), DeviceFree: bytes(e.DeviceFree),
		Allocated: bytes(allocated), Reserved: bytes(reserved)}
	dev, known := device(m, int(e.Device))
	if !known || dev.Capacity <= 0 {
		return oom.Message(), false
	}
	oom.DeviceTotal = bytes(dev.Capacity)
	// The simulated devices report this process, alone on the device, to the message as NVML would; a real
	// CUDA device's recording does not list processes.
	if m.Source == "oomdbg" && (dev.Kind == "meta" || dev.Kind == "cpu") {
		oom.Processes = []torchrules.ProcessMemory{{Self: true, Used: bytes(dev.Capacity - e.DeviceFree)}}
	}
	return oom.Message(), true
}

// sortLargest orders blocks largest first, then by allocation.
func sortLargest(bs []timeline.Allocation) {
	slices.SortFunc(bs, func(a, b timeline.Allocation) int {
		if c := cmp.Compare(b.Size, a.Size); c != 0 {
			return c
		}
		return cmp.Compare(a.Alloc, b.Alloc)
	})
}

// ExplainOOM returns the first out-of-memory error of the snapshot tl indexes as the report explains it:
// the request, PyTorch's message, allocated and reserved memory then, the fragmentation diagnosis and what
// was alive, top of each kind listed. Nil when the snapshot has no OOM. The TUI's OOM panel shows it, so
// that the message is written in one place.
func ExplainOOM(tl *timeline.Timeline, top int) *OOM {
	if top <= 0 {
		top = 10
	}
	return oom(tl, top)
}
