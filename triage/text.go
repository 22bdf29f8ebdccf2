package triage

import (
	"cmp"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// WriteText writes the report for a terminal: sections of aligned text, the phases of the first, last, peak
// and OOM iterations (JSON has every one), sizes in binary units.
func (r *Report) WriteText(w io.Writer) error {
	ew := &errWriter{w: w}
	r.writeText(ew)
	return ew.err
}

// errWriter keeps the first write error, so that rendering code need not check each line.
type errWriter struct {
	w   io.Writer
	err error
}

// Write writes p unless an earlier write failed.
func (e *errWriter) Write(p []byte) (int, error) {
	if e.err != nil {
		return len(p), nil
	}
	_, e.err = e.w.Write(p)
	return len(p), nil
}

func (r *Report) writeText(w io.Writer) {
	name := r.Source.File
	if name == "" {
		name = "snapshot"
	}
	fmt.Fprintf(w, "oomdbg report: %s\n", name)
	if r.Source.WorkloadSummary != "" {
		fmt.Fprintf(w, "workload   %s\n", r.Source.WorkloadSummary)
	}
	for _, d := range r.Devices {
		fmt.Fprintf(w, "device     %s\n", deviceLine(d))
		if len(r.Devices) > 1 { // the sections below are one device's: each one's own memory here
			fmt.Fprintf(w, "           %s\n", deviceMemoryLine(d))
		}
	}
	fmt.Fprintf(w, "snapshot   %s\n", sourceLine(r.Source))
	fmt.Fprintf(w, "iterations %s\n", r.Source.Iterations)
	if line := r.focusLine(); line != "" {
		fmt.Fprintf(w, "focus      %s\n", line)
	}

	fmt.Fprintf(w, "\nPEAK%s  %s allocated at event %d (%s); reserved peaked at %s\n", r.onDevice(),
		units.FormatSize(r.Peak.Allocated), r.Peak.Event, where(r.Peak.Iteration, r.Peak.Phase), units.FormatSize(r.Peak.Reserved))
	writeAliveText(w, r.Peak.Alive, r.Peak.Allocated)
	if line := r.rankLine(); line != "" {
		fmt.Fprintf(w, "\nRANK  %s\n", line)
		if r.Host != nil {
			fmt.Fprintf(w, "  host: %s\n", r.hostLine())
		}
	}

	if o := r.OOM; o != nil {
		fmt.Fprintf(w, "\nOUT OF MEMORY%s at event %d (%s)", r.onDevice(), o.Event, where(o.Iteration, o.Phase))
		if o.Label != "" {
			fmt.Fprintf(w, ", allocating %s", o.Label)
		}
		if o.Scope != "" {
			fmt.Fprintf(w, " in %s", o.Scope)
		}
		fmt.Fprintf(w, "\n  %s\n", o.Message)
		if !o.Exact {
			fmt.Fprintf(w, "  (the snapshot does not record the device's capacity: the message is rebuilt from what it does record)\n")
		}
		fmt.Fprintf(w, "  %s.\n  %s\n", sentence(o.Diagnosis), servedText(o))
		if len(o.Stack) > 0 {
			fmt.Fprintf(w, "  at %s\n", strings.Join(o.Stack, "\n     "))
		}
		fmt.Fprintf(w, "  alive: %s allocated, %s reserved\n", units.FormatSize(o.Allocated), units.FormatSize(o.Reserved))
		writeAliveText(w, o.Alive, o.Allocated)
	}

	fmt.Fprintf(w, "\nPHASES%s (peak inside each phase, allocated at its end, change by category)\n", r.onDevice())
	shown, hidden := r.shownIterations()
	tw := newTable("  ", "iteration", "phase", ">peak", ">at end", "change")
	for _, i := range shown {
		it := r.Iterations[i]
		for _, p := range it.Phases {
			tw.row(phaseRowName(it.Iteration, p.Name), p.Name, units.FormatSize(p.PeakAllocated), units.FormatSize(p.EndAllocated), changes(p.DeltaByCategory, 2))
		}
	}
	tw.write(w)
	if hidden != "" {
		fmt.Fprintf(w, "  (%s not shown; --format json lists every phase of every iteration)\n", hidden)
	}

	fmt.Fprintf(w, "\nGAPS%s (device memory no tensor uses)\n", r.onDevice())
	g := r.Gaps
	gt := newTable("  ", "", ">")
	gt.row("CUDA context (not available to the allocator)", units.FormatSize(g.ContextReserve))
	gt.row("reserved but unallocated at the peak", units.FormatSize(g.ReservedUnallocatedAtPeak))
	gt.row("reserved but unallocated after the last event", units.FormatSize(g.ReservedUnallocatedAtEnd))
	if g.ReservedUnallocatedAtOOM != nil {
		gt.row("reserved but unallocated at the OOM", units.FormatSize(*g.ReservedUnallocatedAtOOM))
	}
	gt.writeRows(w)

	fmt.Fprintf(w, "\nLEAKS\n  %s\n", r.Leaks.Reason)
	writeLeaksText(w, r.Leaks, "  ")

	fmt.Fprintf(w, "\nFIXES (%s)\n", r.AdviceNote)
	if len(r.Advice) == 0 {
		fmt.Fprintf(w, "  none applies to what was alive at the peak\n")
		return
	}
	ft := newTable("  ", ">saves", "fix", ">needs", "fits", "how")
	for _, a := range r.Advice {
		ft.row(savingText(a), a.Fix, peakAfterText(a), fitsText(a), howText(a))
	}
	ft.write(w)
	if measuredAny(r.Advice) {
		fmt.Fprintf(w, "  (%s)\n", r.FitsRule)
	}
	for _, a := range r.Advice {
		if a.Why != "" {
			fmt.Fprintf(w, "  - %s: %s\n", a.Fix, a.Why)
		}
	}
	if rc := r.FragmentationRule; rc != nil {
		fmt.Fprintf(w, "  The %.0f%% rule (call empty_cache when more than %.0f%% of reserved memory is unallocated): %s.\n",
			100*rc.Threshold, 100*rc.Threshold, rc.Verdict)
	}
}

// deviceName names device index as the report lists it.
func (r *Report) deviceName(index int) string {
	for _, d := range r.Devices {
		if d.Index == index && d.Name != "" {
			return d.Name
		}
	}
	return "device " + itoa(int64(index))
}

// onDevice is the sections' word on which device they are of, " ON CUDA:1", when several hold memory.
func (r *Report) onDevice() string {
	if r.Peak.Devices < 2 {
		return ""
	}
	return " ON " + strings.ToUpper(r.deviceName(r.Peak.Device))
}

// focusLine says, when several devices hold memory, which one the sections are of and why: their memory is
// never one pool, so no figure sums them.
func (r *Report) focusLine() string {
	if r.Peak.Devices < 2 {
		return ""
	}
	why := "the one whose allocated memory peaks highest"
	if r.OOM != nil && r.OOM.Device == r.Peak.Device {
		why = "the one that ran out of memory"
	}
	return fmt.Sprintf("%s, %s: %d devices hold memory, each its own (above); no figure below sums them",
		r.deviceName(r.Peak.Device), why, r.Peak.Devices)
}

// sentence starts s with a capital letter.
func sentence(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// labelOrSite names a block by its label, or where it was allocated when it has none (imported traces).
func labelOrSite(b Allocation) string {
	switch {
	case b.Label != "":
		return b.Label
	case len(b.Stack) > 0:
		return "at " + b.Stack[0]
	}
	return "(no label)"
}

func deviceLine(d Device) string {
	s := d.Name
	if s == "" {
		s = "device " + itoa(int64(d.Index))
	}
	if d.Capacity > 0 {
		s += ": " + units.FormatSize(d.Capacity)
		if d.CapacityGiven {
			s += " (given with --gpu-mem, not recorded)"
		}
		if d.ContextReserve > 0 {
			s += ", " + units.FormatSize(d.ContextReserve) + " of it taken by the CUDA context"
		}
	} else {
		s += ": capacity not recorded"
	}
	return s
}

// deviceMemoryLine gives one device's own peak and final memory.
func deviceMemoryLine(d Device) string {
	return fmt.Sprintf("peak %s allocated at event %d, %s reserved; after the last event %s allocated, %s reserved",
		units.FormatSize(d.PeakAllocated), d.PeakEvent, units.FormatSize(d.PeakReserved), units.FormatSize(d.EndAllocated),
		units.FormatSize(d.EndReserved))
}

func sourceLine(src Source) string {
	type count struct {
		name string
		n    int
	}
	var counts []count
	for a, n := range src.EventsByAction {
		counts = append(counts, count{a, n})
	}
	slices.SortFunc(counts, func(a, b count) int {
		if c := cmp.Compare(b.n, a.n); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	var parts []string
	for _, c := range counts {
		parts = append(parts, fmt.Sprintf("%s %d", c.name, c.n))
	}
	s := fmt.Sprintf("%d events", src.Events)
	rebuilt := 0
	for _, n := range src.ReconstructedByAction {
		rebuilt += n
	}
	if rebuilt > 0 {
		parts = append(parts, fmt.Sprintf("and %d rebuilt from the state before the trace", rebuilt))
	}
	if len(parts) > 0 {
		s += " (" + strings.Join(parts, ", ") + ")"
	}
	by := strings.TrimSpace(src.Tool + " " + src.ToolVersion)
	if src.Origin == "pytorch" {
		by = "imported from PyTorch"
	} else if by != "" {
		by = "recorded by " + by
	}
	s = joinComma([]string{s, by})
	switch {
	case src.Warning != "":
		s += "; cut short: " + src.Warning
	case !src.Complete:
		s += "; incomplete (no footer)"
	default:
		s += ", complete"
	}
	if src.UnmatchedFrees > 0 {
		s += fmt.Sprintf("; %d frees of blocks allocated before the trace began", src.UnmatchedFrees)
	}
	return s
}

// Where names the place of an event in a run, as every report and view says it: "iteration 3, backward";
// "setup" before the first iteration; "forward, outside any iteration" for an event no iteration holds (a
// trace of forward passes only, or before the first boundary an importer found); "iteration 3" where
// nothing names the phase, and "no phase markers" where nothing names either.
func Where(iteration int32, phase snapshot.Phase) string {
	switch {
	case phase == snapshot.PhaseNone && iteration < 0:
		return "no phase markers"
	case phase == snapshot.PhaseNone:
		return fmt.Sprintf("iteration %d", iteration)
	case iteration < 0 && (phase == snapshot.PhaseSetup || phase == snapshot.PhaseLoad):
		return phase.String()
	case iteration < 0:
		return phase.String() + ", outside any iteration"
	}
	return fmt.Sprintf("iteration %d, %s", iteration, phase)
}

// where is Where of a phase as the report names it.
func where(iteration int32, phase string) string {
	p, ok := snapshot.ParsePhase(phase)
	if !ok {
		return fmt.Sprintf("iteration %d, %s", iteration, phase)
	}
	return Where(iteration, p)
}

func iterationName(it int32) string {
	if it < 0 {
		return "setup"
	}
	return itoa(int64(it))
}

// phaseRowName names an iteration in a phase table: "-" when the trace has no phase markers.
func phaseRowName(it int32, phase string) string {
	if phase == "none" && it < 0 {
		return "-"
	}
	return iterationName(it)
}

// writeAliveText writes what was alive: bytes by category, by scope, the largest allocations and stacks.
func writeAliveText(w io.Writer, a Alive, total int64) {
	fmt.Fprintf(w, "  by category    %s\n", categoryLine(a.ByCategory, total))
	if len(a.ByScope) > 0 {
		var parts []string
		for _, s := range head(a.ByScope, 5) {
			parts = append(parts, fmt.Sprintf("%s %s (%d %s)", s.Name, units.FormatSize(s.Bytes), s.Count, plural(s.Count, "block")))
		}
		fmt.Fprintf(w, "  by scope       %s\n", strings.Join(parts, ", "))
	}
	if len(a.Top) > 0 {
		fmt.Fprintf(w, "  largest allocations\n")
		t := newTable("    ", ">", "", "", "", "")
		for _, b := range a.Top {
			t.row(units.FormatSize(b.Bytes), b.Category, b.Scope, labelOrSite(b), where(b.Iteration, b.Phase))
		}
		t.writeRows(w)
	}
	if len(a.ByStack) > 0 {
		fmt.Fprintf(w, "  by stack\n")
		t := newTable("    ", ">", ">", "")
		for _, s := range head(a.ByStack, 5) {
			t.row(units.FormatSize(s.Bytes), fmt.Sprintf("%d %s", s.Count, plural(s.Count, "block")), stackLine(s.Frames, 3))
		}
		t.writeRows(w)
	}
}

// categoryLine lists the categories that hold bytes, largest first, with their share of total.
func categoryLine(by map[string]int64, total int64) string {
	cats := largestFirst(by)
	if len(cats) == 0 {
		return "nothing allocated"
	}
	var parts []string
	for _, c := range cats {
		p := fmt.Sprintf("%s %s", c.name, units.FormatSize(c.n))
		if total > 0 {
			p += fmt.Sprintf(" (%d%%)", (c.n*100+total/2)/total)
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, ", ")
}

// changes lists the largest changes by category, with their sign: "+32.00 KiB activation, -8.00 KiB input".
func changes(delta map[string]int64, n int) string {
	cs := largestFirst(delta)
	if len(cs) == 0 {
		return "-"
	}
	var parts []string
	for _, c := range head(cs, n) {
		parts = append(parts, units.FormatChange(c.n)+" "+c.name)
	}
	if len(cs) > n {
		parts = append(parts, fmt.Sprintf("(+%d more)", len(cs)-n))
	}
	return strings.Join(parts, ", ")
}

// namedBytes is a category's bytes, or their change.
type namedBytes struct {
	name string
	n    int64
}

// largestFirst returns the non-zero entries of by, the largest in magnitude first, then by name.
func largestFirst(by map[string]int64) []namedBytes {
	var out []namedBytes
	for name, n := range by {
		if n != 0 {
			out = append(out, namedBytes{name, n})
		}
	}
	slices.SortFunc(out, func(a, b namedBytes) int {
		if c := cmp.Compare(abs(b.n), abs(a.n)); c != 0 {
			return c
		}
		return cmp.Compare(a.name, b.name)
	})
	return out
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

func stackLine(frames []string, n int) string {
	if len(frames) == 0 {
		return "(no stack)"
	}
	return strings.Join(head(frames, n), " < ")
}

// shownIterations picks the iterations a human report shows: setup, the first two, the peak's, the OOM's and
// the last; hidden names the others.
func (r *Report) shownIterations() (shown []int, hidden string) {
	want := map[int32]bool{r.Peak.Iteration: true}
	if r.OOM != nil {
		want[r.OOM.Iteration] = true
	}
	var skipped []int32
	for i, it := range r.Iterations {
		if i < 3 || i == len(r.Iterations)-1 || want[it.Iteration] {
			shown = append(shown, i)
		} else {
			skipped = append(skipped, it.Iteration)
		}
	}
	if len(skipped) == 0 {
		return shown, ""
	}
	return shown, plural(len(skipped), "iteration") + " " + rangeList(skipped)
}

// rangeList prints numbers compactly: "2-7", "0, 3, 5-6".
func rangeList(ns []int32) string {
	var parts []string
	for i := 0; i < len(ns); {
		j := i
		for j+1 < len(ns) && ns[j+1] == ns[j]+1 {
			j++
		}
		if j == i {
			parts = append(parts, itoa(int64(ns[i])))
		} else {
			parts = append(parts, itoa(int64(ns[i]))+"-"+itoa(int64(ns[j])))
		}
		i = j + 1
	}
	return strings.Join(parts, ", ")
}

func writeLeaksText(w io.Writer, l Leaks, indent string) {
	if g := l.GradientsNeverCleared; g != nil {
		fmt.Fprintf(w, "%s%s\n", indent, g.Reason)
	}
	if len(l.Points) > 0 {
		fmt.Fprintf(w, "%sat the end of each iteration (warm-up %d):\n", indent, l.Warmup)
		t := newTable(indent+"  ", "iteration", ">allocated", ">reserved", "")
		for i, p := range l.Points {
			note := ""
			if i == 0 {
				note = "baseline"
			}
			t.row(iterationName(p.Iteration), units.FormatSize(p.Allocated), units.FormatSize(p.Reserved), note)
		}
		t.write(w)
	}
	for i, sp := range l.Suspects {
		if i == 10 {
			fmt.Fprintf(w, "%s(%d more suspects; --format json lists them all)\n", indent, len(l.Suspects)-10)
			break
		}
		fmt.Fprintf(w, "%s- %s per iteration (%.1f %s) of %s in %s: %s\n", indent, units.FormatSize(sp.BytesPerIteration),
			sp.CountPerIteration, blocksWord(sp.CountPerIteration), sp.Category, sp.Scope, leaks.Kind(sp.Kind).Describe())
		if sp.Label != "" {
			fmt.Fprintf(w, "%s    e.g. %s, left alive by iterations %s\n", indent, sp.Label, rangeList(sp.Survivors))
		}
		writeHolderText(w, indent, sp.RetainedBy, sp.Stack)
	}
	if len(l.Held) > 0 {
		fmt.Fprintf(w, "%s%s: %s\n", indent, leaks.Held.Describe(), units.FormatSize(l.HeldBytes))
	}
	for i, h := range l.Held {
		if i == 10 {
			fmt.Fprintf(w, "%s(%d more groups; --format json lists them all)\n", indent, len(l.Held)-10)
			break
		}
		fmt.Fprintf(w, "%s- %s (%d %s) of %s in %s, allocated in iterations %s\n", indent, units.FormatSize(h.Bytes), h.Count,
			plural(h.Count, "block"), h.Category, h.Scope, rangeList(h.Iterations))
		if h.Label != "" {
			fmt.Fprintf(w, "%s    e.g. %s\n", indent, h.Label)
		}
		writeHolderText(w, indent, h.RetainedBy, h.Stack)
	}
}

// writeHolderText writes what retained a group's example block and the stack that allocated the group.
func writeHolderText(w io.Writer, indent string, r *RetainerPath, stack []string) {
	if r != nil {
		fmt.Fprintf(w, "%s    retained by %s\n", indent, retainerLine(r, 6))
	} else {
		fmt.Fprintf(w, "%s    retained by: no heap dump names it\n", indent)
	}
	if len(stack) > 0 {
		fmt.Fprintf(w, "%s    allocated at %s\n", indent, stackLine(stack, 3))
	}
}

// retainerLine prints a retainer path root first, its middle left out past max holders.
func retainerLine(r *RetainerPath, max int) string {
	lr := leaks.RetainerPath{Path: r.Path, Root: r.Root}
	return lr.Short(max)
}

// savingText prints a measured saving with its sign (a fix may cost memory), an estimate as the upper
// bound it is.
// savingText is a fix's saving: measured or replayed, as found (negative when it costs memory); estimated,
// the bound it is.
func savingText(a Advice) string {
	if a.Measured || a.Replayed {
		return units.FormatChange(a.Saving)
	}
	return "up to " + units.FormatSize(a.Saving)
}

func peakAfterText(a Advice) string {
	if a.PeakAfter == nil {
		return "-"
	}
	return units.FormatSize(*a.PeakAfter)
}

func fitsText(a Advice) string {
	switch {
	case a.Fits == nil:
		return "-"
	case *a.Fits:
		return "yes"
	case a.Verdict == headroom.Tight:
		return "tight"
	}
	return "no"
}

// measuredAny reports whether any advice was measured: its fits column follows the headroom rule.
func measuredAny(advice []Advice) bool {
	return slices.ContainsFunc(advice, func(a Advice) bool { return a.Measured })
}

func howText(a Advice) string {
	s := "estimated"
	switch {
	case a.Measured:
		s = "measured"
	case a.Replayed:
		s = "replayed"
	}
	if a.Metric != "allocated" {
		s += ", " + a.Metric
	}
	return s
}

// table aligns columns; a header starting with ">" right-aligns its column.
type table struct {
	indent string
	header []string
	right  []bool
	rows   [][]string
}

func newTable(indent string, header ...string) *table {
	t := &table{indent: indent}
	for _, h := range header {
		right := strings.HasPrefix(h, ">")
		t.header = append(t.header, strings.TrimPrefix(h, ">"))
		t.right = append(t.right, right)
	}
	return t
}

func (t *table) row(cells ...string) { t.rows = append(t.rows, cells) }

// write writes the header and the rows.
func (t *table) write(w io.Writer) { t.writeAll(w, true) }

// writeRows writes the rows only.
func (t *table) writeRows(w io.Writer) { t.writeAll(w, false) }

func (t *table) writeAll(w io.Writer, header bool) {
	rows := t.rows
	if header {
		rows = append([][]string{t.header}, rows...)
	}
	widths := make([]int, len(t.header))
	for _, r := range rows {
		for i, c := range r {
			widths[i] = max(widths[i], len([]rune(c)))
		}
	}
	for _, r := range rows {
		var b strings.Builder
		b.WriteString(t.indent)
		for i, c := range r {
			pad := strings.Repeat(" ", widths[i]-len([]rune(c)))
			if i > 0 {
				b.WriteString("  ")
			}
			if t.right[i] {
				b.WriteString(pad + c)
			} else if i < len(r)-1 {
				b.WriteString(c + pad)
			} else {
				b.WriteString(c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(b.String(), " "))
	}
}

// blocksWord is "block" for exactly one block, "blocks" otherwise: "1.0 block", "0.5 blocks".
func blocksWord(n float64) string {
	if n == 1 {
		return "block"
	}
	return "blocks"
}
