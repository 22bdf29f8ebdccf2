package tui

import (
	"fmt"
	"strings"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/tracer/nvml"
)

// DeviceReader reads the GPUs for the device pane: nvml.ReadReport in the command line, a fake in tests.
type DeviceReader func() nvml.Report

// deviceMsg is a reading of the GPUs.
type deviceMsg struct{ report nvml.Report }

// devicePane shows what the NVIDIA driver reports: each GPU's memory and utilization, and the processes
// holding memory, refreshed every two seconds. Without a driver it says so.
type devicePane struct {
	read   DeviceReader
	report *nvml.Report

	// From the snapshot, at the cursor: the driver's last reading of used memory (sample events recorded on
	// the cuda device) against the allocator's reserved bytes.
	sampled            bool
	driverUsed, reserv int64
}

// setData finds the last device reading at or before event at.
func (p *devicePane) setData(ix *index, at int) {
	p.sampled = false
	if s, ok := ix.lastSample(at, "nvml.used"); ok {
		p.sampled, p.driverUsed, p.reserv = true, s.bytes, ix.reserved(at)
	}
}

// samplesView compares the driver's reading with the allocator's reserved bytes.
func (p *devicePane) samplesView(s Styles, w int) []string {
	if !p.sampled {
		return []string{s.Muted.Render(ansi.Truncate("this snapshot has no driver readings (they are recorded on the cuda device)", w, "…"))}
	}
	return []string{ansi.Truncate(fmt.Sprintf("recorded: the driver saw %s used; the allocator reserved %s; the rest, %s, is the CUDA context and memory outside the allocator",
		units.FormatSize(p.driverUsed), units.FormatSize(p.reserv), units.FormatSize(p.driverUsed-p.reserv)), w, "…")}
}

func newDevicePane(r DeviceReader) devicePane { return devicePane{read: r} }

// refresh reads the devices now.
func (p *devicePane) refresh() tea.Cmd {
	if p.read == nil {
		return nil
	}
	read := p.read
	return func() tea.Msg { return deviceMsg{read()} }
}

// tick reads the devices again in two seconds, while a driver answers.
func (p *devicePane) tick() tea.Cmd {
	if p.read == nil || p.report == nil || !p.report.Driver {
		return nil
	}
	read := p.read
	return tea.Tick(2*time.Second, func(time.Time) tea.Msg { return deviceMsg{read()} })
}

func (p *devicePane) onReading(m deviceMsg) { p.report = &m.report }

func (p *devicePane) view(s Styles, w, h int) string {
	lines := p.samplesView(s, w)
	switch {
	case p.read == nil:
		return strings.Join(append(lines, s.Muted.Render("live device readings are off")), "\n")
	case p.report == nil:
		return strings.Join(append(lines, s.Muted.Render("reading the devices…")), "\n")
	case !p.report.Driver:
		msg := "no NVIDIA driver found: GPU readings are unavailable"
		if p.report.Err != nil {
			msg = p.report.Err.Error()
		}
		return strings.Join(append(lines, s.Muted.Render(ansi.Truncate("live: "+msg, w, "…"))), "\n")
	}
	lines = append(lines, s.Muted.Render(fmt.Sprintf("live: NVIDIA driver %s, %d GPUs", p.report.DriverVersion, len(p.report.Devices))))
	for _, d := range p.report.Devices {
		if len(lines) >= h {
			break
		}
		if d.Err != nil {
			lines = append(lines, ansi.Truncate(fmt.Sprintf("GPU %d: %v", d.Index, d.Err), w, "…"))
			continue
		}
		util := ""
		if d.Utilization != nil {
			util = fmt.Sprintf(", GPU %d%%", d.Utilization.GPU)
		}
		lines = append(lines, ansi.Truncate(fmt.Sprintf("GPU %d %s: %s used of %s%s, %d processes", d.Index, d.Name,
			units.FormatSize(int64(d.Memory.Used)), units.FormatSize(int64(d.Memory.Total)), util, len(d.Processes)), w, "…"))
	}
	return strings.Join(lines, "\n")
}
