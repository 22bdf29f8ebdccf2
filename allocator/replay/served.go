package replay

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Served is whether the allocator model, replaying a trace under some settings, serves the request of the
// recording's first out-of-memory error.
type Served struct {
	Settings string `json:"settings"`
	// Served is true when the replay reaches the recorded OOM and the model serves its request; false when
	// the model refuses it too, or fails an earlier allocation the recording served (FailedEarlier).
	Served        bool `json:"served"`
	FailedEarlier bool `json:"failed_earlier"`
	// PeakReserved is the model's peak of reserved memory up to the OOM (or the earlier failure).
	PeakReserved int64 `json:"peak_reserved"`
	// DeviceAllocs counts what the model obtained from the device: cudaMalloc calls, or map operations of
	// expandable segments (PyTorch's num_device_alloc).
	DeviceAllocs int64 `json:"device_allocs"`
}

// ServeOOM replays the trace of the device of the recording's first OOM under each of cfgs, on a device of
// capacity bytes (0: as capacityFor picks it: the recording's device less its CUDA context when the snapshot
// says, else the reserved bytes at the OOM plus what the device had free), and says whether each serves that OOM's request; it
// returns the capacity it used. It replays as CompareSettings does: the trace's allocations and frees in
// order, every run of segment frees as an empty_cache, the blocks in use before the trace first. A snapshot
// without an OOM returns nil.
func ServeOOM(s *snapshot.Snapshot, cfgs []allocator.Config, capacity uint64) ([]Served, uint64, error) {
	var t *deviceTrace
	for _, d := range splitDevices(s) {
		for _, e := range d.events() {
			if e.Action == snapshot.ActionOOM && (t == nil || e.Seq < t.firstOOM().Seq) {
				t = d
			}
		}
	}
	if t == nil {
		return nil, 0, nil
	}
	if capacity == 0 {
		_, _, _, oomReserved := t.recordedPeaks()
		capacity, _ = t.capacityFor(0, oomReserved)
	}
	out := make([]Served, 0, len(cfgs))
	for _, cfg := range cfgs {
		if err := allocator.CheckConfig(cfg); err != nil {
			return nil, 0, err
		}
		o, err := t.simulate(cfg, capacity)
		if err != nil {
			return nil, 0, fmt.Errorf("replaying under %s: %w", cfg.String(), err)
		}
		sv := Served{Settings: cfg.String(), PeakReserved: o.PeakReserved, DeviceAllocs: o.DeviceMallocs, FailedEarlier: o.OOM != nil}
		sv.Served = o.OOM == nil && len(o.RecordedOOMs) > 0 && !o.RecordedOOMs[0].StillHappens
		out = append(out, sv)
	}
	return out, capacity, nil
}
