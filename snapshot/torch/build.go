package torch

import (
	"encoding/json"
	"fmt"
	"strconv"
	"time"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

// build turns the records into the snapshot.
func (im *importer) build() (*snapshot.Snapshot, error) {
	plans := make([]devicePlan, 0, len(im.devices))
	nsynth := 0
	if err := im.mem.add(8*int64(len(im.segs)), "ordering the segments"); err != nil {
		return nil, err
	}
	order := im.segmentOrder()
	for _, d := range im.devices {
		p, err := im.analyze(d, order)
		if err != nil {
			return nil, err
		}
		nsynth += len(p.segs) + len(p.blocks)
		for i := range p.blocks {
			if p.blocks[i].pending {
				nsynth++
			}
		}
		plans = append(plans, p)
	}
	ntrace := 0
	for _, t := range im.traces {
		ntrace += len(t)
	}
	if nsynth+ntrace+len(im.annots) > im.lim.MaxEvents {
		return nil, limitErr("", "%d events > Limits.MaxEvents (%d)", nsynth+ntrace+len(im.annots), im.lim.MaxEvents)
	}
	im.placeRecorded()
	em := emitter{im: im, iteration: -1}
	// Room for the phase and iteration markers too: growing the events by copying them would need them twice.
	n := nsynth + ntrace + len(im.annots)
	if err := em.reserve(n + n/64 + 16); err != nil {
		return nil, err
	}
	pre := im.tab.str(PreExistingLabel)
	for _, p := range plans {
		for _, s := range p.segs {
			act := snapshot.ActionSegmentAlloc
			if s.expandable {
				act = snapshot.ActionSegmentMap
			}
			em.add(snapshot.Event{Action: act, Device: int16(p.dev), Stream: s.stream, Addr: s.addr, Size: s.size,
				Stack: s.stack, Label: pre, Iteration: -1})
		}
		for _, b := range p.blocks {
			e := snapshot.Event{Action: snapshot.ActionAlloc, Device: int16(p.dev), Stream: b.stream, Addr: b.addr,
				Size: b.requested, BlockSize: b.size, Stack: b.stack, Label: pre, Iteration: -1}
			if res, ok := im.recordedFinal(p.dev, b.addr); ok {
				e.Category = res.category
			}
			em.add(e)
			if b.pending {
				e.Action = snapshot.ActionFreeRequested
				em.add(e)
			}
		}
	}
	// What each stack says of its phase, read once before the trace is written.
	em.stacks = readStacks(&snapshot.Snapshot{Strings: im.tab.strings, Frames: im.tab.frames, Stacks: im.tab.stacks})
	em.trace()
	if em.err != nil {
		return nil, em.err
	}
	if err := checkSizes(em.events, im.segs); err != nil {
		return nil, err
	}
	// The records are events now: let them go before the inference takes their place.
	im.mem.release(int64(ntrace) * int64(unsafe.Sizeof(entry{})))
	im.traces = nil
	collect(int64(ntrace) * int64(unsafe.Sizeof(entry{})))

	meta := snapshot.Meta{Tool: Source, Source: Source, TimeUnit: "index", AllocatorSettings: im.settings}
	if im.timeKnown {
		meta.TimeUnit = "us"
		// time_us counts from the Unix epoch; a clock that says otherwise leaves the start unknown (and a
		// time beyond year 9999 could not be written as JSON).
		if c := time.UnixMicro(em.t0).UTC(); em.t0 > 0 && c.Year() <= 9999 {
			meta.Created = c
		}
	}
	for _, d := range im.devices {
		meta.Devices = append(meta.Devices, snapshot.DeviceInfo{Index: d, Name: "cuda:" + strconv.Itoa(d), Kind: "unknown"})
	}
	s := &snapshot.Snapshot{Meta: meta, Strings: im.tab.strings, Frames: im.tab.frames, Stacks: im.tab.stacks}
	if err := em.infer(s); err != nil {
		return nil, err
	}
	if im.tab.err != nil {
		return nil, im.tab.err
	}
	origin, err := json.Marshal(im.origin)
	if err != nil {
		return nil, &ImportError{Offset: -1, Err: err}
	}
	s.Meta.Workload = origin
	segs := im.segs
	if segs == nil {
		segs = []snapshot.Segment{}
	}
	s.Strings = im.tab.strings
	s.Footer = &snapshot.Footer{Summary: summarize(em.events), Segments: segs}
	if err := em.columns(s); err != nil {
		return nil, err
	}
	return s, nil
}

// checkSizes refuses a snapshot whose sizes no device holds (snapshot.MaxBytes): a pickle may carry any
// integer, and two live blocks of 2^62 bytes would make every total the analysis takes wrap around.
func checkSizes(events []snapshot.Event, segs []snapshot.Segment) error {
	var sz snapshot.Sizes
	for i := range events {
		if err := sz.Add(i, &events[i]); err != nil {
			return &ImportError{Offset: -1, Err: fmt.Errorf("%w: %w", ErrSchema, err)}
		}
	}
	if err := sz.AddFooter(&snapshot.Footer{Segments: segs}); err != nil {
		return &ImportError{Path: "segments", Offset: -1, Err: fmt.Errorf("%w: %w", ErrSchema, err)}
	}
	return nil
}

// columns moves the events, written and inferred as a slice, into s's columns, which share what events
// repeat: the columns are counted in the budget, and the slice released once they hold everything.
func (em *emitter) columns(s *snapshot.Snapshot) error {
	var ev snapshot.Events
	ev.Grow(len(em.events))
	// About a row for each event but the frees, which share their allocation's: room for them all spares
	// the columns their copies as they grow.
	rows := 0
	for i := range em.events {
		if a := em.events[i].Action; a != snapshot.ActionFreeRequested && a != snapshot.ActionFreeCompleted {
			rows++
		}
	}
	ev.GrowRows(rows)
	charged := int64(0)
	for i := range em.events {
		ev.Append(&em.events[i])
		if i%4096 == 4095 || i == len(em.events)-1 {
			b := ev.Bytes()
			if err := em.im.mem.add(b-charged, "building the events"); err != nil {
				return err
			}
			charged = b
		}
	}
	em.im.mem.release(int64(cap(em.events)) * eventBytes)
	em.events = nil
	s.Events = ev.View()
	return nil
}

// summarize counts the events and finds the peaks, as the recorder does: a block counts as allocated from its
// alloc until its free is requested (PyTorch's allocated_bytes), and segments are reserved from segment_alloc
// (or segment_map) to segment_free (or segment_unmap). Sums run over all devices.
func summarize(events []snapshot.Event) snapshot.Summary {
	var counts [snapshot.NumActions]uint64
	var s snapshot.Summary
	var allocated, reserved int64
	for i := range events {
		e := &events[i]
		counts[e.Action]++
		s.EndTime = e.Time
		switch e.Action {
		case snapshot.ActionAlloc:
			allocated += e.BlockSize
			if allocated > s.PeakAllocated {
				s.PeakAllocated, s.PeakAllocatedSeq = allocated, uint64(i)
			}
		case snapshot.ActionFreeRequested:
			allocated -= e.BlockSize
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			reserved += e.Size
			s.PeakReserved = max(s.PeakReserved, reserved)
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			reserved -= e.Size
		}
	}
	s.Events = uint64(len(events))
	s.ByAction = make(map[string]uint64)
	for a, n := range counts {
		if n > 0 {
			s.ByAction[snapshot.Action(a).String()] = n
		}
	}
	return s
}
