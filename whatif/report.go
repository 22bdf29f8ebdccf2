package whatif

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
)

// The verdicts of a what-if: those of the one headroom rule (internal/headroom), and edge.
const (
	VerdictFits    = headroom.Fits  // no OOM, and peak reserved within the margin of the capacity
	VerdictTight   = headroom.Tight // no OOM, but peak reserved inside the margin
	VerdictOOM     = headroom.OOM
	VerdictEdge    = "edge"           // it fits at one end of the releases the trace does not record, not at the other
	VerdictUnknown = headroom.Unknown // no capacity is known
)

// Side is one replay's result.
type Side struct {
	PeakAllocated int64  `json:"peak_allocated"`
	PeakReserved  int64  `json:"peak_reserved"`
	OOM           bool   `json:"oom"`
	Message       string `json:"message,omitempty"` // PyTorch's message for the OOM
	Settings      string `json:"settings"`
	// Verdict is this replay's by the headroom rule: fits, tight, oom or unknown.
	Verdict string `json:"verdict"`
}

// Report is a fix replayed on a trace, before and after: what oomdbg whatif prints.
type Report struct {
	File         string   `json:"file"`
	Fixes        []string `json:"fixes"`
	Device       int      `json:"device"`
	Capacity     uint64   `json:"capacity"` // 0: unknown (unlimited)
	CapacityFrom string   `json:"capacity_from"`
	Before       Side     `json:"before"`
	After        Side     `json:"after"`
	// AfterHeld is the replay after with the releases the trace does not record held as late as it allows
	// (checkpointing: transform.ApplyEnds); After puts them as early. Absent when no fix places any.
	AfterHeld *Side `json:"after_held,omitempty"`
	// Verdict is "fits" (no OOM, peak reserved within the margin), "tight" (no OOM, but inside the
	// margin), "oom", or "edge" where After and AfterHeld differ; "unknown" without a capacity.
	Verdict string `json:"verdict"`
	// Margin is the share of the capacity a run must leave unreserved to fit, and Limit the most it may
	// reserve (0 without a capacity).
	Margin      float64  `json:"margin"`
	Limit       int64    `json:"limit"`
	Assumptions []string `json:"assumptions"`
	// Unrecorded says what the trace never recorded, when it ends in an out-of-memory error.
	Unrecorded string   `json:"unrecorded,omitempty"`
	Notes      []string `json:"notes,omitempty"`
}

// sideOf reads one replay's outcome, judged on capacity bytes with margin.
func sideOf(o replay.Outcome, capacity uint64, margin float64) Side {
	s := Side{PeakAllocated: o.PeakAllocated, PeakReserved: o.PeakReserved, Settings: o.Settings}
	s.OOM, s.Message = Fails(o)
	s.Verdict = headroom.Judge(s.PeakReserved, s.OOM, int64(capacity), margin).Word
	return s
}

// WriteJSON writes the report as JSON (docs/whatif.md).
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a person.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s: %s\n", r.File, strings.Join(r.Fixes, ", "))
	verdict := func(s Side) string {
		switch {
		case s.OOM:
			return "out of memory"
		case r.Capacity == 0:
			return "unknown"
		case s.Verdict == VerdictTight && r.Unrecorded != "":
			return "tight so far"
		case s.Verdict == VerdictTight:
			return "tight"
		case r.Unrecorded != "":
			return "fits so far"
		}
		return "fits"
	}
	capacity := "unknown"
	if r.Capacity > 0 {
		capacity = units.FormatSize(r.Capacity) + " (" + r.CapacityFrom + ")"
	}
	fmt.Fprintf(&b, "device %d, capacity %s\n\n", r.Device, capacity)
	held := r.AfterHeld
	if held == nil {
		fmt.Fprintf(&b, "  %-16s %14s %14s %10s\n", "", "before", "after", "change")
		row := func(name string, x, y int64) {
			fmt.Fprintf(&b, "  %-16s %14s %14s %10s\n", name, units.FormatSize(x), units.FormatSize(y), units.FormatChange(y-x))
		}
		row("peak allocated", r.Before.PeakAllocated, r.After.PeakAllocated)
		row("peak reserved", r.Before.PeakReserved, r.After.PeakReserved)
		fmt.Fprintf(&b, "  %-16s %14s %14s\n", "verdict", verdict(r.Before), verdict(r.After))
	} else {
		// The after column puts the releases the trace does not record as early as it allows, the held
		// column as late.
		fmt.Fprintf(&b, "  %-16s %14s %14s %14s %10s\n", "", "before", "after", "if held", "change")
		row := func(name string, x, y, z int64) {
			fmt.Fprintf(&b, "  %-16s %14s %14s %14s %10s\n", name, units.FormatSize(x), units.FormatSize(y),
				units.FormatSize(z), units.FormatChange(y-x))
		}
		row("peak allocated", r.Before.PeakAllocated, r.After.PeakAllocated, held.PeakAllocated)
		row("peak reserved", r.Before.PeakReserved, r.After.PeakReserved, held.PeakReserved)
		fmt.Fprintf(&b, "  %-16s %14s %14s %14s\n", "verdict", verdict(r.Before), verdict(r.After), verdict(*held))
		b.WriteString("\nafter: each tensor a checkpointed block saved is released once the first op that read it " +
			"returns; if held: once the function that made it returns. The trace does not record which op reads a " +
			"tensor last, so the run lies between the two.\n")
	}
	if r.Capacity > 0 {
		fmt.Fprintf(&b, "\n%s\n", headroom.Rule(int64(r.Capacity), r.Margin))
	}
	if r.Verdict == VerdictEdge {
		b.WriteString("at the edge: it fits at one end and runs out of memory at the other: leave headroom, or " +
			"record the fix to know.\n")
	}
	if r.After.OOM {
		fmt.Fprintf(&b, "\nafter: %s\n", r.After.Message)
	} else if held != nil && held.OOM {
		fmt.Fprintf(&b, "\nif held: %s\n", held.Message)
	}
	b.WriteString("\nassumes:\n")
	for _, a := range r.Assumptions {
		fmt.Fprintf(&b, "  - %s\n", a)
	}
	if r.Unrecorded != "" {
		fmt.Fprintf(&b, "\n%s\n", r.Unrecorded)
	}
	for _, n := range r.Notes {
		fmt.Fprintf(&b, "note: %s\n", n)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
