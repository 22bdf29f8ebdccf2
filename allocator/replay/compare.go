package replay

import (
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Outcome is what replaying one device's trace under some settings gave.
type Outcome struct {
	Settings      string `json:"settings"`
	PeakReserved  int64  `json:"peak_reserved"`
	PeakAllocated int64  `json:"peak_allocated"`
	// UnallocatedAtPeak is reserved minus allocated bytes when reserved memory peaked: what fragmentation and
	// caching cost at the worst moment. MaxUnallocated is the most it ever was.
	UnallocatedAtPeak int64 `json:"unallocated_at_peak"`
	MaxUnallocated    int64 `json:"max_unallocated"`
	// InactiveSplitPeak is the peak of PyTorch's inactive_split_bytes: free memory inside segments that
	// also hold blocks in use, which empty_cache cannot give back.
	InactiveSplitPeak int64 `json:"inactive_split_peak"`
	// DeviceMallocs counts segments obtained from the device (cudaMalloc, or page maps of expandable segments).
	DeviceMallocs int64 `json:"device_mallocs"`
	// OOM is the first allocation the model could not serve that the recording served: the program would have
	// failed there. The replay stops at it.
	OOM *OOM `json:"oom,omitempty"`
	// RecordedOOMs says, for each out-of-memory error of the recording, whether these settings fail it too.
	RecordedOOMs []RecordedOOM `json:"recorded_ooms,omitempty"`
}

// OOM is an allocation the model could not serve.
type OOM struct {
	Seq       uint64 `json:"seq"`       // the recorded alloc (0 when it was one from before the trace)
	Requested uint64 `json:"requested"` // bytes asked for
	Message   string `json:"message"`   // PyTorch's message
}

// RecordedOOM is one of the recording's out-of-memory errors replayed.
type RecordedOOM struct {
	Seq          uint64 `json:"seq"`
	Rounded      int64  `json:"rounded"`     // the rounded request
	DeviceFree   int64  `json:"device_free"` // what the device had free, by the recording
	StillHappens bool   `json:"still_happens"`
	// Message is PyTorch's message for the model's refusal, when it still happens.
	Message string `json:"message,omitempty"`
}

// Comparison compares, for one device, the recording with replays under its own settings and under others.
type Comparison struct {
	Device int `json:"device"`
	// Capacity is the memory the replays let the allocator have (0: unlimited); CapacityFrom says where it
	// came from: "given", "recorded device" (the device's memory less the CUDA context, in oomdbg's own
	// snapshots), "recorded oom" (reserved bytes at the recorded OOM plus the free bytes it reported) or
	// "none".
	Capacity     uint64 `json:"capacity"`
	CapacityFrom string `json:"capacity_from"`
	// RecordedPeakReserved and RecordedPeakAllocated are the recording's own peaks (blocks from before the
	// trace included); RecordedOOMs its out-of-memory errors.
	RecordedPeakReserved  int64 `json:"recorded_peak_reserved"`
	RecordedPeakAllocated int64 `json:"recorded_peak_allocated"`
	RecordedOOMs          int   `json:"recorded_ooms"`
	// Baseline is the replay under the recorded settings, Candidate under the settings tried; both start
	// from the same state.
	Baseline  Outcome  `json:"baseline"`
	Candidate Outcome  `json:"candidate"`
	Notes     []string `json:"notes,omitempty"`
}

// CompareSettings replays every device's trace under the recorded settings and under cfg, with capacity bytes
// for the allocator (0: the device's memory when the snapshot records it, else the reserved bytes at a
// recorded OOM plus the free bytes it reported, else unlimited).
func CompareSettings(s *snapshot.Snapshot, cfg allocator.Config, capacity uint64) ([]Comparison, Settings, error) {
	if err := allocator.CheckConfig(cfg); err != nil {
		return nil, Settings{}, err
	}
	recorded, st := RecordedSettings(s)
	var out []Comparison
	for _, d := range replayable(s, capacity) {
		t := d.trace
		w := Comparison{Device: t.dev, Capacity: d.capacity, CapacityFrom: d.capacityFrom, RecordedPeakReserved: d.peakReserved,
			RecordedPeakAllocated: d.peakAllocated, RecordedOOMs: d.ooms}
		var err error
		if w.Baseline, err = t.simulate(recorded, w.Capacity); err != nil {
			return nil, st, err
		}
		if w.Candidate, err = t.simulate(cfg, w.Capacity); err != nil {
			return nil, st, err
		}
		w.Baseline.Settings, w.Candidate.Settings = recorded.String(), cfg.String()
		if cfg.GarbageCollectionThreshold > 0 && (cfg.PerProcessMemoryFraction == 0 || cfg.PerProcessMemoryFraction == 1) {
			w.Notes = append(w.Notes, "garbage_collection_threshold acts only with a memory fraction "+
				"(per_process_memory_fraction, or torch.cuda.set_per_process_memory_fraction): here it changes nothing")
		}
		if w.Capacity == 0 && w.RecordedOOMs == 0 {
			w.Notes = append(w.Notes, "no device capacity is known (the recording has no OOM): "+
				"give one to see whether an OOM would happen")
		}
		if n := len(t.preBlocks); n > 0 {
			w.Notes = append(w.Notes, fmt.Sprintf("%d blocks in use before the trace began are allocated first, in address order, "+
				"in both replays; memory cached before the trace is not replayed", n))
		}
		out = append(out, w)
	}
	if len(out) == 0 {
		return nil, st, ErrNoTrace
	}
	return out, st, nil
}

// Replayed is one device's trace replayed once (Simulate).
type Replayed struct {
	Device int
	// Capacity and CapacityFrom are as in Comparison.
	Capacity     uint64
	CapacityFrom string
	RecordedOOMs int // the recording's out-of-memory errors
	Outcome      Outcome
}

// Simulate replays every device's trace once under cfg, with capacity picked as CompareSettings picks it:
// what a what-if needs of each side, without CompareSettings' second replay.
func Simulate(s *snapshot.Snapshot, cfg allocator.Config, capacity uint64) ([]Replayed, error) {
	if err := allocator.CheckConfig(cfg); err != nil {
		return nil, err
	}
	var out []Replayed
	for _, d := range replayable(s, capacity) {
		r := Replayed{Device: d.trace.dev, Capacity: d.capacity, CapacityFrom: d.capacityFrom, RecordedOOMs: d.ooms}
		var err error
		if r.Outcome, err = d.trace.simulate(cfg, r.Capacity); err != nil {
			return nil, err
		}
		r.Outcome.Settings = cfg.String()
		out = append(out, r)
	}
	if len(out) == 0 {
		return nil, ErrNoTrace
	}
	return out, nil
}

// deviceReplay is a device whose trace a replay runs: what the recording says of it, and the capacity the
// replay gives the allocator.
type deviceReplay struct {
	trace                       *deviceTrace
	peakReserved, peakAllocated int64
	ooms                        int
	capacity                    uint64
	capacityFrom                string
}

// replayable returns the devices of s whose trace holds events, each with its recorded peaks and OOMs and
// the capacity for its replays: capacity, or as capacityFor picks it when that is 0.
func replayable(s *snapshot.Snapshot, capacity uint64) []deviceReplay {
	var out []deviceReplay
	for _, t := range splitDevices(s) {
		if len(t.seqs) == 0 {
			continue
		}
		d := deviceReplay{trace: t}
		var oomReserved int64
		d.peakReserved, d.peakAllocated, d.ooms, oomReserved = t.recordedPeaks()
		d.capacity, d.capacityFrom = t.capacityFor(capacity, oomReserved)
		out = append(out, d)
	}
	return out
}

// recordedPeaks walks the recording's events of the device: the peaks of reserved and allocated bytes, the
// number of OOMs, and the reserved bytes at the first OOM (-1 without one).
func (t *deviceTrace) recordedPeaks() (peakReserved, peakAllocated int64, ooms int, oomReserved int64) {
	var reserved, allocated int64
	for _, s := range t.preSegs {
		reserved += int64(s.size)
	}
	for _, b := range t.preBlocks {
		allocated += int64(b.size)
	}
	peakReserved, peakAllocated, oomReserved = reserved, allocated, -1
	for _, e := range t.requests() {
		switch e.Action {
		case snapshot.ActionAlloc:
			allocated += e.BlockSize
		case snapshot.ActionFreeRequested:
			allocated -= e.BlockSize
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			reserved += e.Size
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			reserved -= e.Size
		case snapshot.ActionOOM:
			if ooms == 0 {
				oomReserved = reserved
			}
			ooms++
		}
		peakReserved, peakAllocated = max(peakReserved, reserved), max(peakAllocated, allocated)
	}
	return peakReserved, peakAllocated, ooms, oomReserved
}

func (t *deviceTrace) firstOOM() snapshot.Event {
	for _, e := range t.events() {
		if e.Action == snapshot.ActionOOM {
			return e
		}
	}
	return snapshot.Event{}
}

// simulate replays the device's trace under cfg on a simulated device of the given capacity (0: unlimited).
func (t *deviceTrace) simulate(cfg allocator.Config, capacity uint64) (Outcome, error) {
	if capacity == 0 {
		capacity = unlimited
	}
	a := allocator.New(allocator.NewSimDevice(t.dev, capacity, 0), cfg)
	obs := &tracker{}
	a.SetObserver(obs)
	var o Outcome
	live := map[uint64]uint64{}
	fail := func(seq, size uint64, err error) error {
		var oom *allocator.OutOfMemoryError
		if !errors.As(err, &oom) {
			return fmt.Errorf("replay: event %d: %w", seq, err)
		}
		o.OOM = &OOM{Seq: seq, Requested: size, Message: oom.Error()}
		return nil
	}
	// The blocks in use before the trace, allocated under these settings.
	for _, b := range t.preBlocks {
		size := b.requested
		if size == 0 {
			size = b.size
		}
		addr, err := a.Malloc(size, b.stream)
		if err != nil {
			return o, o.finish(a, obs, fail(0, size, err))
		}
		live[b.addr] = addr
		obs.step()
	}
	inRelease := false
	deferred := newDeferredFrees(a)
	for seq, req := range t.requests() {
		e := &req
		if err := deferred.next(a, e.Action, e.Addr, live); err != nil {
			return o, fmt.Errorf("replay: event %d: %w", seq, err)
		}
		if e.Action != snapshot.ActionSegmentFree {
			inRelease = false
		}
		switch e.Action {
		case snapshot.ActionAlloc:
			addr, err := a.Malloc(uint64(max(e.Size, 0)), e.Stream)
			if err != nil {
				return o, o.finish(a, obs, fail(uint64(seq), uint64(max(e.Size, 0)), err))
			}
			live[e.Addr] = addr
		case snapshot.ActionFreeCompleted:
			if deferred.completed(a, e.Addr) {
				break
			}
			if addr, ok := live[e.Addr]; ok {
				delete(live, e.Addr)
				if err := a.Free(addr); err != nil {
					return o, fmt.Errorf("replay: event %d: %w", seq, err)
				}
			}
		case snapshot.ActionSegmentFree:
			if !inRelease {
				inRelease = true
				if err := a.EmptyCache(); err != nil {
					return o, fmt.Errorf("replay: event %d: %w", seq, err)
				}
			}
		case snapshot.ActionOOM:
			// The program asked for this much and was refused: would these settings refuse it too? If not,
			// the block is handed back at once, since the recording never had it.
			r := RecordedOOM{Seq: uint64(seq), Rounded: e.Size, DeviceFree: t.evs.At(seq).DeviceFree}
			addr, err := a.Malloc(uint64(max(e.Size, 0)), e.Stream)
			var oom *allocator.OutOfMemoryError
			switch {
			case err == nil:
				if err := a.Free(addr); err != nil {
					return o, err
				}
			case errors.As(err, &oom):
				r.StillHappens, r.Message = true, oom.Error()
			default:
				return o, fmt.Errorf("replay: event %d: %w", seq, err)
			}
			o.RecordedOOMs = append(o.RecordedOOMs, r)
		}
		obs.step()
	}
	if err := deferred.end(a, live); err != nil {
		return o, fmt.Errorf("replay: %w", err)
	}
	return o, o.finish(a, obs, nil)
}

// finish fills in the outcome from the tracker and the allocator's statistics.
func (o *Outcome) finish(a *allocator.Allocator, obs *tracker, err error) error {
	obs.step()
	st := a.Stats()
	o.PeakReserved, o.PeakAllocated = obs.peakReserved, obs.peakAllocated
	o.UnallocatedAtPeak, o.MaxUnallocated = obs.unallocatedAtPeak, obs.maxUnallocated
	o.InactiveSplitPeak = st.InactiveSplitBytes.All().Peak
	o.DeviceMallocs = st.NumDeviceAlloc
	return err
}

// tracker follows reserved and allocated bytes through a replay. Peaks are taken between allocator calls
// (step), so that a new segment and the block it is made for count together.
type tracker struct {
	reserved, allocated int64
	peakReserved        int64
	peakAllocated       int64
	unallocatedAtPeak   int64
	maxUnallocated      int64
}

func (t *tracker) step() {
	if t.reserved > t.peakReserved {
		t.peakReserved, t.unallocatedAtPeak = t.reserved, t.reserved-t.allocated
	}
	t.peakAllocated = max(t.peakAllocated, t.allocated)
	t.maxUnallocated = max(t.maxUnallocated, t.reserved-t.allocated)
}

func (t *tracker) Alloc(device int, stream int64, addr, requested, block uint64) {
	t.allocated += int64(block)
}
func (t *tracker) FreeRequested(device int, stream int64, addr, requested, block uint64) {
	t.allocated -= int64(block)
}
func (t *tracker) FreeCompleted(int, int64, uint64, uint64, uint64) {}
func (t *tracker) SegmentAlloc(device int, stream int64, addr, size uint64) {
	t.reserved += int64(size)
}
func (t *tracker) SegmentFree(device int, stream int64, addr, size uint64) {
	t.reserved -= int64(size)
}
func (t *tracker) SegmentMap(device int, stream int64, addr, size uint64) {
	t.reserved += int64(size)
}
func (t *tracker) SegmentUnmap(device int, stream int64, addr, size uint64) {
	t.reserved -= int64(size)
}
func (t *tracker) OOM(int, int64, uint64, uint64, uint64) {}

// capacityFor returns the memory a replay of t lets the allocator have, and where it comes from: the capacity
// given (when not 0), else the recorded device's, else what was reserved and free at the recorded OOM (whose
// reserved bytes are oomReserved, -1 without one), else none (unlimited).
func (t *deviceTrace) capacityFor(given uint64, oomReserved int64) (uint64, string) {
	switch {
	case given > 0:
		return given, "given"
	case t.capacity > 0 && t.given && oomReserved >= 0:
		// The card's memory as the user gave it (--gpu-mem on view and report): at the recorded OOM the
		// allocator had what it reserved and what the device still had free; the rest was the CUDA
		// context's and other processes'.
		return min(t.capacity, uint64(oomReserved+t.firstOOM().DeviceFree)), "given"
	case t.capacity > 0 && t.given:
		return t.capacity, "given"
	case t.capacity > 0:
		return t.capacity, "recorded device"
	case oomReserved >= 0:
		return uint64(oomReserved + t.firstOOM().DeviceFree), "recorded oom"
	}
	return 0, "none"
}
