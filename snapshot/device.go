package snapshot

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// PreExistingLabel is the Label of the events an importer adds for memory that was allocated before a trace
// began: a trace that is a ring buffer of the newest entries (PyTorch's) shows such blocks only as frees
// without an alloc, or as blocks of its final state. Analysis that must tell a trace's own events from
// reconstructed state compares Event.Label with it.
const PreExistingLabel = "pre-existing (allocated before the trace)"

// Reconstructed reports whether e is one of the events an importer added for memory allocated before the
// trace began (PreExistingLabel), not an event the trace recorded.
func (s *Snapshot) Reconstructed(e *Event) bool {
	return e.Label != 0 && s.String(e.Label) == PreExistingLabel
}

// DeviceView returns the events of one device, with the markers that belong to every device (phase,
// iteration, annotation, heap dump), renumbered from 0, and the original seq of each. It returns s itself and
// nil seqs when s holds no other device's events. The view shares s's tables; its footer keeps the device's
// segments. A device s does not know is an error that lists those it has.
func (s *Snapshot) DeviceView(device int) (*Snapshot, []int, error) {
	found, others := false, false
	for _, d := range s.Meta.Devices {
		found = found || d.Index == device
	}
	for _, e := range s.Events.All() {
		if !sharedMarker(e.Action) {
			found = found || int(e.Device) == device
			others = others || int(e.Device) != device
		}
	}
	if !found {
		var have []string
		for _, d := range s.Meta.Devices {
			have = append(have, strconv.Itoa(d.Index))
		}
		if len(have) == 0 {
			have = []string{"none"}
		}
		return nil, nil, fmt.Errorf("the snapshot has no device %d (it has %s)", device, strings.Join(have, ", "))
	}
	if !others {
		return s, nil, nil
	}
	view := &Snapshot{Meta: s.Meta, Strings: s.Strings, Frames: s.Frames, Stacks: s.Stacks, Warning: s.Warning}
	view.Meta.Devices = nil
	for _, d := range s.Meta.Devices {
		if d.Index == device {
			view.Meta.Devices = append(view.Meta.Devices, d)
		}
	}
	var seqs []int
	for i, e := range s.Events.All() {
		if sharedMarker(e.Action) || int(e.Device) == device {
			view.Events.Append(&e)
			seqs = append(seqs, i)
		}
	}
	view.Events.releasePacker()
	if f := s.Footer; f != nil {
		vf := &Footer{Summary: Summary{Events: uint64(view.Events.Len()), EndTime: f.Summary.EndTime}}
		for _, sg := range f.Segments {
			if sg.Device == device {
				vf.Segments = append(vf.Segments, sg)
			}
		}
		view.Footer = vf
	}
	return view, seqs, nil
}

// sharedMarker reports whether events of action a are markers of the whole run (phase, iteration,
// annotation, heap dump) that a one-device view keeps whatever their Device.
func sharedMarker(a Action) bool {
	switch a {
	case ActionPhase, ActionIteration, ActionAnnotation, ActionHeapDump:
		return true
	}
	return false
}

// DevicesWithMemory returns the devices of s, in Meta.Devices order, that hold memory at some point: the
// devices of its allocator events and of its final segments. A recording of one device returns it.
func (s *Snapshot) DevicesWithMemory() []int {
	seen := map[int]bool{}
	for _, e := range s.Events.All() {
		if !sharedMarker(e.Action) {
			switch e.Action {
			case ActionAlloc, ActionSegmentAlloc, ActionSegmentMap:
				seen[int(e.Device)] = true
			}
		}
	}
	if f := s.Footer; f != nil {
		for _, sg := range f.Segments {
			seen[sg.Device] = true
		}
	}
	var out []int
	for _, d := range s.Meta.Devices {
		if seen[d.Index] {
			out = append(out, d.Index)
			delete(seen, d.Index)
		}
	}
	rest := make([]int, 0, len(seen)) // devices Meta does not list, in order
	for d := range seen {
		rest = append(rest, d)
	}
	slices.Sort(rest)
	return append(out, rest...)
}
