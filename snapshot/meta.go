package snapshot

import (
	"encoding/json"
	"fmt"
	"time"
)

// Meta is a snapshot's self-description, stored as JSON in the file header.
type Meta struct {
	Tool        string    `json:"tool"`         // the program that wrote the file, e.g. "oomdbg"
	ToolVersion string    `json:"tool_version"` // its version
	Created     time.Time `json:"created"`
	Host        string    `json:"host,omitempty"`
	// Source is where the events came from: "oomdbg" (a traced workload) or "pytorch" (an imported snapshot).
	Source string `json:"source"`
	// TimeUnit says what Event.Time counts: "ns" (recorded), "us" (imported time_us, scaled to ns) or "index"
	// (imported traces without time: the event index).
	TimeUnit string       `json:"time_unit"`
	Devices  []DeviceInfo `json:"devices"`
	// AllocatorSettings is the caching allocator's configuration in PYTORCH_CUDA_ALLOC_CONF form.
	AllocatorSettings string `json:"allocator_settings"`
	// Workload is the configuration of the traced workload, as its package defines it.
	Workload json.RawMessage `json:"workload,omitempty"`
	// Parameters is the traced workload's parameter count and TrainableParameters how many of them its
	// optimizer trains (fewer under LoRA); both 0 when unknown (an imported snapshot).
	Parameters          int64 `json:"parameters,omitempty"`
	TrainableParameters int64 `json:"trainable_parameters,omitempty"`
	// Iterations says where an importer found the iteration boundaries the events carry, e.g. "from
	// Optimizer.step regions"; empty where the recording marked them itself.
	Iterations string `json:"iterations,omitempty"`
	// Job is an identifier the snapshots of one data-parallel job's ranks share (oomdbg run --ranks writes
	// one), so that the ranks of two jobs are told apart; empty when not known.
	Job string `json:"job,omitempty"`
}

// DeviceInfo describes one device of the recording.
type DeviceInfo struct {
	Index int    `json:"index"`
	Name  string `json:"name"`
	Kind  string `json:"kind"` // "meta", "cpu", "cuda", or "unknown" for imported snapshots
	// Capacity is the device's total memory in bytes; ContextReserve the part the CUDA context and other
	// non-allocator memory take before the allocator gets any.
	Capacity       int64 `json:"capacity"`
	ContextReserve int64 `json:"context_reserve"`
	// CapacityGiven says that Capacity is what the user gave (--gpu-mem), not what the recording says:
	// PyTorch's snapshots do not record the card's memory.
	CapacityGiven bool `json:"capacity_given,omitempty"`
}

// GiveCapacity sets the capacity of the GPUs whose recording does not say theirs (a PyTorch snapshot's) to
// what the user gave, for everything that reads Capacity: the OOM's message, the replays, the what-if, the
// TUI's axis. A device whose recording gives another capacity is an error: a recorded capacity is the
// truth, and a given one that contradicts it would describe another run.
func (m *Meta) GiveCapacity(bytes int64) error {
	gpu := func(d *DeviceInfo) bool { return d.Kind != DeviceKindHost && !d.CapacityGiven }
	for i := range m.Devices {
		if d := &m.Devices[i]; gpu(d) && d.Capacity != 0 && d.Capacity != bytes {
			return &CapacityError{Device: d.Name, Recorded: d.Capacity, Given: bytes}
		}
	}
	for i := range m.Devices {
		if d := &m.Devices[i]; gpu(d) && d.Capacity == 0 {
			d.Capacity, d.CapacityGiven = bytes, true
		}
	}
	return nil
}

// CapacityError says a capacity given for a device contradicts the one its recording gives.
type CapacityError struct {
	Device          string
	Recorded, Given int64
}

func (e *CapacityError) Error() string {
	return fmt.Sprintf("the snapshot records %s's memory, %d bytes, and --gpu-mem gives %d: --gpu-mem is for snapshots "+
		"that do not record it (PyTorch's)", e.Device, e.Recorded, e.Given)
}

// Footer closes a complete snapshot: a summary of the events and the allocator's final state.
type Footer struct {
	Summary  Summary   `json:"summary"`
	Segments []Segment `json:"segments"`
}

// Summary counts what a snapshot holds.
type Summary struct {
	Events   uint64            `json:"events"`
	ByAction map[string]uint64 `json:"by_action"` // event counts keyed by Action.String()
	// PeakAllocated is the highest sum of live block bytes; PeakAllocatedSeq the first event that reached it.
	PeakAllocated    int64  `json:"peak_allocated"`
	PeakAllocatedSeq uint64 `json:"peak_allocated_seq"`
	PeakReserved     int64  `json:"peak_reserved"`
	EndTime          int64  `json:"end_time"`
}

// Segment is one allocator segment (a cudaMalloc, or a mapped range of an expandable segment) and the blocks
// that tile it.
type Segment struct {
	Device     int     `json:"device"`
	Stream     int64   `json:"stream"`
	Addr       uint64  `json:"address"`
	Size       int64   `json:"total_size"`
	Pool       string  `json:"segment_type"` // "small" or "large"
	Expandable bool    `json:"is_expandable"`
	Blocks     []Block `json:"blocks"`
}

// Block is one block of a segment.
type Block struct {
	Addr      uint64 `json:"address"`
	Size      int64  `json:"size"`
	Requested int64  `json:"requested_size"`
	// State is "active_allocated", "active_pending_free" or "inactive", as in PyTorch snapshots.
	State string `json:"state"`
}

// Host memory in a recording (the CPU offload of a data-parallel rank): a device of kind DeviceKindHost at
// index HostDeviceIndex, whose memory is recorded as readings (ActionSample events on that device), not as
// allocations, so that the allocated and reserved curves, the peak and the OOM stay the GPU's.
const (
	DeviceKindHost  = "host"
	HostDeviceIndex = -1 // PyTorch's CPU device has no ordinal
	// SampleHostAllocated reads the bytes of live host blocks (pinned ones at their power-of-two size) and
	// SampleHostReserved adds the pinned blocks the caching host allocator keeps for reuse.
	SampleHostAllocated = "host.allocated"
	SampleHostReserved  = "host.reserved"
	// SampleHostCategory prefixes a category's live host bytes: "host.optimizer_state".
	SampleHostCategory = "host."
)
