package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// Report is what a replay found, for printing (WriteText) or as JSON (WriteJSON).
type Report struct {
	File     string     `json:"file"`
	Source   string     `json:"source"` // what the file is, e.g. "PyTorch snapshot (schema G1, pickle protocol 4)"
	Entries  int        `json:"trace_entries"`
	Recorded Settings   `json:"recorded_settings"`
	Fidelity []Fidelity `json:"fidelity"`
	// Tried is the settings of the what-if replay, and Comparisons its results; both empty without one.
	Tried       *Settings    `json:"tried_settings,omitempty"`
	Comparisons []Comparison `json:"what_if,omitempty"`
}

// Run replays a snapshot: the fidelity check under the recorded settings, and, when tried is not nil, the
// comparison with those settings on a device of capacity bytes (0: see CompareSettings).
func Run(file string, s *snapshot.Snapshot, tried *allocator.Config, capacity uint64) (*Report, error) {
	r := &Report{File: file, Source: describe(s)}
	var err error
	if r.Fidelity, r.Recorded, err = CheckFidelity(s); err != nil {
		return nil, err
	}
	if o, ok := torch.OriginOf(s); ok {
		r.Entries = o.TraceEntries
	} else {
		for _, e := range s.Events.All() {
			if e.Action.Valid() && e.Action <= snapshot.ActionOOM {
				r.Entries++
			}
		}
	}
	if tried != nil {
		if r.Comparisons, _, err = CompareSettings(s, *tried, capacity); err != nil {
			return nil, err
		}
		r.Tried = &Settings{Conf: tried.String()}
	}
	return r, nil
}

// describe says what kind of file a snapshot came from.
func describe(s *snapshot.Snapshot) string {
	o, ok := torch.OriginOf(s)
	if !ok {
		return "oomdbg snapshot (" + s.Meta.Source + ")"
	}
	what := "PyTorch snapshot"
	if o.Form == "segments" {
		what = "PyTorch memory_snapshot() segments"
	}
	var parts []string
	if o.Generation != "" {
		parts = append(parts, "schema "+o.Generation)
	}
	if o.Format == "pickle" {
		parts = append(parts, fmt.Sprintf("pickle protocol %d", o.Protocol))
	} else {
		parts = append(parts, o.Format)
	}
	return what + " (" + strings.Join(parts, ", ") + ")"
}

// WriteJSON writes the report as one indented JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// settingsName says which settings a string stands for.
func settingsName(conf string) string {
	if conf == "" {
		return "PyTorch's defaults"
	}
	return conf
}

// plural writes a count with its noun: "1 segment", "131 segments".
func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

func pct(c Count) string {
	return fmt.Sprintf("%d of %d (%.1f%%)", c.Matched, c.Total, c.Percent())
}

// WriteText writes the report for a person: per device, how faithful the replay is, then the what-if
// comparison when there is one.
func (r *Report) WriteText(w io.Writer) error {
	b := &strings.Builder{}
	fmt.Fprintf(b, "replay of %s: %s, %d trace entries\n", r.File, r.Source, r.Entries)
	if r.Recorded.Note != "" {
		fmt.Fprintf(b, "recorded settings: %s\n", r.Recorded.Note)
	} else {
		fmt.Fprintf(b, "recorded settings: %s\n", settingsName(r.Recorded.Conf))
	}
	for _, f := range r.Fidelity {
		fmt.Fprintf(b, "\ndevice %d: the trace replayed under the recorded settings\n", f.Device)
		tw := tabwriter.NewWriter(b, 0, 0, 2, ' ', 0)
		fmt.Fprintf(tw, "  state before the trace\t%s, %s in use; %d rebuilt\n",
			plural(f.PreExistingSegments, "segment"), plural(f.PreExistingBlocks, "block"), f.Rebuilt)
		for _, why := range slices.Sorted(maps.Keys(f.NotRebuilt)) {
			fmt.Fprintf(tw, "\t%d not rebuilt: %s\n", f.NotRebuilt[why], why)
		}
		if in := f.Inferred; in.Total() > 0 {
			fmt.Fprintf(tw, "\t%s the trace frees sized by inference: %d from where its next allocation landed, "+
				"%d by the split rule (the rounded request)\n", plural(in.Total(), "block"), in.FromTrace, in.SplitRule)
		}
		fmt.Fprintf(tw, "  new segments\t%s sizes match\n", pct(f.NewSegments))
		if f.ExtraSegments > 0 {
			fmt.Fprintf(tw, "\t%d segments the recording did not need\n", f.ExtraSegments)
		}
		fmt.Fprintf(tw, "  reused blocks\t%s addresses match in segments made during the trace\n", pct(f.ReusedInTrace))
		fmt.Fprintf(tw, "\t%s in segments from before the trace\n", pct(f.ReusedPreExisting))
		fmt.Fprintf(tw, "  releases\t%s segment frees match\n", pct(f.Releases))
		if f.ExtraReleases > 0 {
			fmt.Fprintf(tw, "\t%d segments released that the recording kept\n", f.ExtraReleases)
		}
		fmt.Fprintf(tw, "  block sizes\t%s as the snapshot gives them\n", pct(f.BlockSizes))
		fmt.Fprintf(tw, "  final state\t%s segments identical to the snapshot's\n", pct(f.FinalState))
		fmt.Fprintf(tw, "  not replayed\t%d allocations in segments not rebuilt, %d in memory not followed\n", f.Unknown, f.Untracked)
		if f.OOMs > 0 {
			fmt.Fprintf(tw, "  recorded OOMs\t%d (the replay device never runs out; see --alloc-conf and --gpu-mem)\n", f.OOMs)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		if len(f.Mismatches) > 0 {
			b.WriteString("  first differences:\n")
			for _, m := range f.Mismatches {
				fmt.Fprintf(b, "    event %d: %s\n", m.Seq, m.What)
			}
		}
	}
	for _, wi := range r.Comparisons {
		if err := r.writeComparison(b, wi); err != nil {
			return err
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func (r *Report) writeComparison(b *strings.Builder, wi Comparison) error {
	fmt.Fprintf(b, "\ndevice %d: what if %s\n", wi.Device, settingsName(wi.Candidate.Settings))
	switch wi.CapacityFrom {
	case "given":
		fmt.Fprintf(b, "  capacity %s, as given\n", units.FormatSize(int64(wi.Capacity)))
	case "recorded device":
		fmt.Fprintf(b, "  capacity %s: the recorded device's memory less the CUDA context\n", units.FormatSize(int64(wi.Capacity)))
	case "recorded oom":
		fmt.Fprintf(b, "  capacity %s: reserved at the recorded OOM plus the free memory it reported\n",
			units.FormatSize(int64(wi.Capacity)))
	default:
		b.WriteString("  capacity unlimited\n")
	}
	size := func(n int64) string { return units.FormatSize(n) }
	recorded := "none"
	if wi.RecordedOOMs > 0 {
		recorded = fmt.Sprintf("%d", wi.RecordedOOMs)
	}
	writeTable(b, [][]string{
		{"", "recording", settingsName(wi.Baseline.Settings), settingsName(wi.Candidate.Settings)},
		{"peak reserved", size(wi.RecordedPeakReserved), size(wi.Baseline.PeakReserved), size(wi.Candidate.PeakReserved)},
		{"peak allocated", size(wi.RecordedPeakAllocated), size(wi.Baseline.PeakAllocated), size(wi.Candidate.PeakAllocated)},
		{"unallocated at peak reserved", "-", size(wi.Baseline.UnallocatedAtPeak), size(wi.Candidate.UnallocatedAtPeak)},
		{"most unallocated", "-", size(wi.Baseline.MaxUnallocated), size(wi.Candidate.MaxUnallocated)},
		{"inactive split (peak)", "-", size(wi.Baseline.InactiveSplitPeak), size(wi.Candidate.InactiveSplitPeak)},
		{"out of memory", recorded, oomCell(wi.Baseline), oomCell(wi.Candidate)},
	})
	for _, o := range []Outcome{wi.Baseline, wi.Candidate} {
		if o.OOM != nil {
			fmt.Fprintf(b, "  with %s, event %d fails (the replay stops there; its peaks are up to it):\n    %s\n",
				settingsName(o.Settings), o.OOM.Seq, o.OOM.Message)
		}
	}
	for _, n := range wi.Notes {
		fmt.Fprintf(b, "  note: %s\n", n)
	}
	return nil
}

// writeTable writes rows as columns two spaces apart, indented by two: the first column (the labels) aligned
// left, the others (numbers) right.
func writeTable(b *strings.Builder, rows [][]string) {
	var widths []int
	for _, row := range rows {
		for i, c := range row {
			if i >= len(widths) {
				widths = append(widths, 0)
			}
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range rows {
		b.WriteString("  ")
		for i, c := range row {
			pad := strings.Repeat(" ", widths[i]-len(c))
			if i == 0 {
				b.WriteString(c + pad)
			} else {
				b.WriteString("  " + pad + c)
			}
		}
		b.WriteString("\n")
	}
}

// oomCell sums up an outcome's out-of-memory errors: a new one, and the recorded ones that still happen.
func oomCell(o Outcome) string {
	var parts []string
	if o.OOM != nil {
		parts = append(parts, fmt.Sprintf("at event %d", o.OOM.Seq))
	}
	if n := len(o.RecordedOOMs); n > 0 {
		still := 0
		for _, r := range o.RecordedOOMs {
			if r.StillHappens {
				still++
			}
		}
		parts = append(parts, fmt.Sprintf("%d of %d recorded", still, n))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
