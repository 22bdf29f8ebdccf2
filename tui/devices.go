package tui

import (
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
)

// deviceView is which of a snapshot's devices the TUI shows: all of them, or one (d steps through them).
// A PyTorch snapshot of a multi-GPU run holds each device's trace; their sum is no device's memory.
type deviceView struct {
	full    *snapshot.Snapshot // the snapshot as loaded
	devices []int              // its devices that hold memory
	shown   int                // index in devices of the one shown, -1 for all
}

// name says which device is shown: "cuda:1", "all 2 devices", "" when none holds memory.
func (d *deviceView) name() string {
	switch {
	case len(d.devices) == 0 || len(d.full.Meta.Devices) < 2:
		return "" // one device: nothing to tell apart
	case len(d.devices) == 1:
		return d.deviceName(d.devices[0]) // the others hold no memory
	case d.shown < 0: // their memory is no one pool: the curve and the figures sum devices
		return fmt.Sprintf("all %d devices summed, not one pool (d: one device)", len(d.devices))
	}
	return fmt.Sprintf("%s (%d of %d; d: next)", d.deviceName(d.devices[d.shown]), d.shown+1, len(d.devices))
}

// deviceName is the device's name as the snapshot records it ("cuda:1").
func (d *deviceView) deviceName(index int) string {
	for _, dev := range d.full.Meta.Devices {
		if dev.Index == index && dev.Name != "" {
			return dev.Name
		}
	}
	return fmt.Sprintf("device %d", index)
}

// nextDevice shows the next device: all, then each in turn. It reports whether the device shown changed.
func (m *Model) nextDevice() bool {
	d := &m.devices
	switch {
	case !m.load.done || len(d.devices) < 2:
		m.setStatus("only one device holds memory in this snapshot", false)
		return false
	case m.ix.ov != nil: // a device's view is made of the whole run's events, which a paged run does not hold
		m.setStatus("this run is paged: its devices are shown together", false)
		return false
	}
	next := d.shown + 1
	if next >= len(d.devices) {
		next = -1
	}
	if !m.showDevice(next) {
		return false
	}
	m.setStatus("showing "+d.name(), false)
	return true
}

// showDevice shows devices[i] alone, or all of them (i < 0), and lands on its OOM or peak. It reports
// whether it could.
func (m *Model) showDevice(i int) bool {
	d := &m.devices
	view := d.full
	if i >= 0 {
		v, _, err := d.full.DeviceView(d.devices[i])
		if err != nil {
			m.setStatus(err.Error(), true)
			return false
		}
		view = v
	}
	d.shown = i
	m.cursor, m.prev = 0, 0 // the view has its own events: the cursor lands again below
	m.setSnapshot(view)
	m.landedOnTarget = false
	m.landOnTarget()
	return true
}

// openOnFocusDevice shows, on a snapshot whose memory is on several devices, the device the report
// explains (triage.FocusDevice: the one that ran out of memory, else the highest peak) rather than their
// sum: memory on two cards is never one pool. d shows the others, and all of them summed.
func (m *Model) openOnFocusDevice() {
	d := &m.devices
	if len(d.devices) < 2 || m.ix == nil || m.ix.ov != nil || m.ix.tl == nil {
		return
	}
	dev, ok := triage.FocusDevice(m.ix.tl)
	if i := slices.Index(d.devices, dev); ok && i >= 0 {
		m.showDevice(i)
	}
}
