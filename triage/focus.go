package triage

import (
	"maps"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Memory on two devices is never one pool: a peak summed over cuda:0 and cuda:1 is no device's peak, and an
// OOM on cuda:1 happened with cuda:1's memory, not with what the three cards of a DataParallel job held
// together. The report explains one device, its focus: the one that ran out of memory, else the one whose
// allocated memory peaks highest. Its peak, gaps, OOM and phases are read from that device's own timeline
// (snapshot.DeviceView), and each device's own figures are listed apart (Device).

// onDevice is one device's timeline, with the way back to the events of the snapshot it was cut from.
type onDevice struct {
	index int
	tl    *timeline.Timeline
	// seqs is, for each event of tl, its seq in the whole snapshot; nil when tl is the whole snapshot's
	// (it holds no other device's events).
	seqs []int
}

// whole returns the whole snapshot's seq of the device's event seq (-1 stays -1).
func (d *onDevice) whole(seq int) int {
	if d.seqs == nil || seq < 0 || seq >= len(d.seqs) {
		return seq
	}
	return d.seqs[seq]
}

// local returns the device's seq of the whole snapshot's event seq, -1 when the event is another device's.
func (d *onDevice) local(seq int) int {
	if d.seqs == nil {
		return seq
	}
	i, ok := slices.BinarySearch(d.seqs, seq)
	if !ok {
		return -1
	}
	return i
}

// deviceOf returns device index's own timeline in the snapshot tl indexes: tl itself when the snapshot holds
// no other device's events.
func deviceOf(tl *timeline.Timeline, index int) (*onDevice, error) {
	view, seqs, err := tl.Snapshot().DeviceView(index)
	if err != nil {
		return nil, err
	}
	if seqs == nil {
		return &onDevice{index: index, tl: tl}, nil
	}
	return &onDevice{index: index, tl: timeline.New(view), seqs: seqs}, nil
}

// focusDevice chooses the device a report explains: the one of the first OOM, else the one whose allocated
// memory peaks highest among devs (each device's own timeline, by index). It returns the whole snapshot's
// timeline as the focus of a snapshot where one device, or none, holds memory (a rank's host memory is
// readings, not allocations: the GPU is still the only one).
func focusDevice(tl *timeline.Timeline, devs map[int]*onDevice) *onDevice {
	if withMemory := tl.Snapshot().DevicesWithMemory(); len(withMemory) <= 1 {
		index := firstDevice(tl.Snapshot())
		if len(withMemory) == 1 {
			index = withMemory[0]
		}
		return &onDevice{index: index, tl: tl}
	}
	if ooms := tl.OOMs(); len(ooms) > 0 {
		if d, ok := devs[int(tl.Snapshot().Events.At(ooms[0]).Device)]; ok {
			return d
		}
	}
	var best *onDevice
	var peak int64 = -1
	for _, idx := range slices.Sorted(maps.Keys(devs)) {
		d := devs[idx]
		if d.tl.Len() == 0 {
			continue
		}
		if p := d.tl.Peak(timeline.Allocated).Bytes; p > peak {
			best, peak = d, p
		}
	}
	if best == nil {
		return &onDevice{index: firstDevice(tl.Snapshot()), tl: tl}
	}
	return best
}

func firstDevice(s *snapshot.Snapshot) int {
	if len(s.Meta.Devices) > 0 {
		return s.Meta.Devices[0].Index
	}
	return 0
}

// FocusDevice returns the device a report of the snapshot tl indexes explains when several devices hold
// memory: the one that ran out of memory first, else the one whose allocated memory peaks highest. ok is
// false when fewer than two devices hold memory: the snapshot is one device's. The TUI opens on it.
func FocusDevice(tl *timeline.Timeline) (index int, ok bool) {
	withMemory := tl.Snapshot().DevicesWithMemory()
	if len(withMemory) < 2 {
		return 0, false
	}
	if ooms := tl.OOMs(); len(ooms) > 0 {
		return int(tl.Snapshot().Events.At(ooms[0]).Device), true
	}
	views := map[int]*onDevice{}
	for _, dev := range withMemory {
		if d, err := deviceOf(tl, dev); err == nil {
			views[dev] = d
		}
	}
	return focusDevice(tl, views).index, true
}
