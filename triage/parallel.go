package triage

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// ModelStates is what the ZeRO paper calls a rank's model states: its parameters, gradients and optimizer
// state (fp32 master weights included), between phases, where they sum highest: at the start of a phase
// other than backward (whose recomputations split it, mid-backward, into several spans) or after the last
// event. So it holds what lasts from one phase to the next, not an optimizer step's temporaries nor a
// reduction half done.
type ModelStates struct {
	Bytes          int64  `json:"bytes"`
	Parameters     int64  `json:"parameters"`
	Gradients      int64  `json:"gradients"`
	OptimizerState int64  `json:"optimizer_state"`
	Phase          string `json:"phase"` // the phase at whose start (or, for the last, end) they were highest
	Iteration      int32  `json:"iteration"`
	// End says they were highest after the last event, at the end of Phase.
	End bool `json:"end"`
}

// modelStates finds the phase boundary where parameters, gradients and optimizer state sum highest.
func modelStates(tl *timeline.Timeline) ModelStates {
	best := ModelStates{Phase: snapshot.PhaseNone.String(), Iteration: -1}
	consider := func(b [snapshot.NumCategories]int64, ph timeline.PhaseSpan, end bool) {
		p, g, o := b[snapshot.CategoryParameter], b[snapshot.CategoryGradient], b[snapshot.CategoryOptimizerState]
		if p+g+o > best.Bytes {
			best = ModelStates{Bytes: p + g + o, Parameters: p, Gradients: g, OptimizerState: o,
				Phase: ph.Phase.String(), Iteration: ph.Iteration, End: end}
		}
	}
	spans := tl.Phases()
	for _, ph := range spans {
		if ph.Phase != snapshot.PhaseBackward && ph.Phase != snapshot.PhaseRecompute {
			consider(ph.Before, ph, false)
		}
	}
	if n := len(spans); n > 0 {
		consider(spans[n-1].After, spans[n-1], true)
	}
	return best
}

// Host is a recording's host memory (a rank's CPU offload), read from its host device's samples.
type Host struct {
	// PeakAllocated is the highest reading of live host blocks (pinned ones at their power-of-two size);
	// PeakReserved adds the pinned blocks cached for reuse.
	PeakAllocated int64 `json:"peak_allocated"`
	PeakReserved  int64 `json:"peak_reserved"`
	// ByCategory is host memory by category when PeakAllocated was read (every category, zeros included).
	ByCategory map[string]int64 `json:"by_category"`
}

// host reads the host device's samples, or returns nil for a recording without one.
func host(s *snapshot.Snapshot) *Host {
	hasHost := false
	for _, d := range s.Meta.Devices {
		hasHost = hasHost || d.Kind == snapshot.DeviceKindHost
	}
	if !hasHost {
		return nil
	}
	h := &Host{ByCategory: map[string]int64{}}
	var cur [snapshot.NumCategories]int64
	for c := range snapshot.NumCategories {
		h.ByCategory[snapshot.Category(c).String()] = 0
	}
	for _, ep := range s.Events.All() {
		e := &ep
		if e.Action != snapshot.ActionSample || e.Device != snapshot.HostDeviceIndex {
			continue
		}
		switch text := s.String(e.Text); text {
		case snapshot.SampleHostAllocated:
			if e.Size > h.PeakAllocated {
				h.PeakAllocated = e.Size
				for c, v := range cur {
					h.ByCategory[snapshot.Category(c).String()] = v
				}
			}
		case snapshot.SampleHostReserved:
			h.PeakReserved = max(h.PeakReserved, e.Size)
		default:
			if name, ok := strings.CutPrefix(text, snapshot.SampleHostCategory); ok {
				if c, ok := snapshot.ParseCategory(name); ok {
					cur[c] = e.Size
				}
			}
		}
	}
	return h
}

// rankLine says, for a rank of a data-parallel job, which rank of which job it is and its model states; ""
// for anything else.
func (r *Report) rankLine() string {
	jr, ok := rankOf(r.Source.Workload)
	if !ok {
		return ""
	}
	m := r.ModelStates
	at := "start"
	if m.End {
		at = "end"
	}

	line := fmt.Sprintf("rank %d of %d, %s", jr.Rank, max(jr.GPUs, 1), jr.Strategy)
	if p := jr.place(false); p != "" {
		line = fmt.Sprintf("rank %d of %d (%s), %s", jr.Rank, max(jr.GPUs, 1), p, jr.Strategy)
	}
	if jr.Offload != "" && jr.Offload != "none" {
		line += ", offload " + jr.Offload
	}
	return line + fmt.Sprintf("; model states %s (parameters %s, gradients %s, optimizer state %s) at the %s of %s",
		units.FormatSize(m.Bytes), units.FormatSize(m.Parameters), units.FormatSize(m.Gradients), units.FormatSize(m.OptimizerState),
		at, where(m.Iteration, m.Phase))
}

// hostLine says what a rank's host memory held at its peak.
func (r *Report) hostLine() string {
	h := r.Host
	var parts []string
	for c := range snapshot.NumCategories {
		name := snapshot.Category(c).String()
		if b := h.ByCategory[name]; b > 0 {
			parts = append(parts, fmt.Sprintf("%s %s", name, units.FormatSize(b)))
		}
	}
	line := fmt.Sprintf("peak %s allocated, %s reserved (pinned blocks cached)", units.FormatSize(h.PeakAllocated), units.FormatSize(h.PeakReserved))
	if len(parts) > 0 {
		line += ": " + strings.Join(parts, ", ")
	}
	return line
}
