package triage

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
)

// WriteJSON writes the report as JSON in the "oomdbg-report/5" schema (docs/report-json.md), indented.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

// WriteMarkdown writes the report as GitHub-flavoured markdown, to paste into an issue or a pull request.
func (r *Report) WriteMarkdown(w io.Writer) error {
	ew := &errWriter{w: w}
	r.writeMarkdown(ew)
	return ew.err
}

// cell escapes a table cell.
func cell(s string) string {
	s = strings.ReplaceAll(s, "|", `\|`)
	return strings.ReplaceAll(s, "\n", " ")
}

// code quotes s as inline code, with a fence that s cannot close.
func code(s string) string {
	if s == "" {
		return ""
	}
	fence := "`"
	for strings.Contains(s, fence) {
		fence += "`"
	}
	if strings.HasPrefix(s, "`") || strings.HasSuffix(s, "`") {
		return fence + " " + s + " " + fence
	}
	return fence + s + fence
}

// mdTable writes a table; a header starting with ">" right-aligns its column.
func mdTable(w io.Writer, header []string, rows [][]string) {
	names := make([]string, len(header))
	for i, h := range header {
		names[i] = strings.TrimPrefix(h, ">")
	}
	fmt.Fprintf(w, "| %s |\n|", strings.Join(names, " | "))
	for _, h := range header {
		if strings.HasPrefix(h, ">") {
			fmt.Fprint(w, "---:|")
		} else {
			fmt.Fprint(w, "---|")
		}
	}
	fmt.Fprintln(w)
	for _, row := range rows {
		for i := range row {
			row[i] = cell(row[i])
		}
		fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
	}
}

// writeMarkdown writes the report's sections in order: the summary, the OOM, the peak, the phases, the gaps,
// the leaks and the fixes.
func (r *Report) writeMarkdown(w io.Writer) {
	r.writeSummaryMarkdown(w)
	if o := r.OOM; o != nil {
		writeOOMMarkdown(w, o, strings.ToLower(r.onDevice()))
	}
	fmt.Fprintf(w, "\n### Peak%s: %s allocated\n\n", strings.ToLower(r.onDevice()), units.FormatSize(r.Peak.Allocated))
	writeAliveMarkdown(w, r.Peak.Alive, r.Peak.Allocated)
	if line := r.rankLine(); line != "" {
		fmt.Fprintf(w, "\n### Rank\n\n%s.\n", upperFirst(line))
		if r.Host != nil {
			fmt.Fprintf(w, "\nHost memory: %s.\n", r.hostLine())
		}
	}
	r.writePhasesMarkdown(w)
	writeGapsMarkdown(w, r.Gaps, strings.ToLower(r.onDevice()))
	writeLeaksMarkdown(w, r.Leaks)
	r.writeFixesMarkdown(w)
}

// writeSummaryMarkdown writes the report's title and its summary as a list.
func (r *Report) writeSummaryMarkdown(w io.Writer) {
	name := r.Source.File
	if name == "" {
		name = "snapshot"
	}
	fmt.Fprintf(w, "## oomdbg report: %s\n\n", code(name))
	if r.Source.WorkloadSummary != "" {
		fmt.Fprintf(w, "- **workload**: %s\n", r.Source.WorkloadSummary)
	}
	for _, d := range r.Devices {
		fmt.Fprintf(w, "- **device**: %s\n", deviceLine(d))
		if len(r.Devices) > 1 {
			fmt.Fprintf(w, "  - %s\n", deviceMemoryLine(d))
		}
	}
	fmt.Fprintf(w, "- **snapshot**: %s\n", sourceLine(r.Source))
	fmt.Fprintf(w, "- **iterations**: %s\n", r.Source.Iterations)
	if line := r.focusLine(); line != "" {
		fmt.Fprintf(w, "- **focus**: %s\n", line)
	}
	fmt.Fprintf(w, "- **peak**: %s allocated at event %d (%s); reserved peaked at %s\n",
		units.FormatSize(r.Peak.Allocated), r.Peak.Event, where(r.Peak.Iteration, r.Peak.Phase), units.FormatSize(r.Peak.Reserved))
	if o := r.OOM; o != nil {
		fmt.Fprintf(w, "- **out of memory** at event %d (%s)", o.Event, where(o.Iteration, o.Phase))
		if o.Label != "" {
			fmt.Fprintf(w, ", allocating %s", code(o.Label))
		}
		if o.Scope != "" {
			fmt.Fprintf(w, " in %s", code(o.Scope))
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "- **leaks**: %s\n", r.Leaks.Reason)
	if g := r.Leaks.GradientsNeverCleared; g != nil {
		fmt.Fprintf(w, "- **gradients**: %s\n", g.Reason)
	}
}

// writeOOMMarkdown writes the out-of-memory section.
func writeOOMMarkdown(w io.Writer, o *OOM, on string) {
	fmt.Fprintf(w, "\n### Out of memory%s\n\n```\n%s\n```\n\n", on, o.Message)
	fmt.Fprintf(w, "%s. %s\n\n", sentence(o.Diagnosis), servedText(o))
	if len(o.Stack) > 0 {
		fmt.Fprintf(w, "Allocated at %s.\n\n", code(stackLine(o.Stack, 3)))
	}
	writeAliveMarkdown(w, o.Alive, o.Allocated)
}

// writePhasesMarkdown writes the phases of the iterations shown, as a table.
func (r *Report) writePhasesMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n### Phases\n\nPeak inside each phase, allocated at its end, and the change by category.\n\n")
	shown, hidden := r.shownIterations()
	var rows [][]string
	for _, i := range shown {
		it := r.Iterations[i]
		for _, p := range it.Phases {
			rows = append(rows, []string{phaseRowName(it.Iteration, p.Name), p.Name, units.FormatSize(p.PeakAllocated), units.FormatSize(p.EndAllocated), changes(p.DeltaByCategory, 3)})
		}
	}
	mdTable(w, []string{"iteration", "phase", ">peak", ">at end", "change"}, rows)
	if hidden != "" {
		fmt.Fprintf(w, "\n%s not shown (the JSON report has every phase of every iteration).\n", hidden)
	}
}

// writeGapsMarkdown writes the gaps between what the device has and what the allocator allocated.
func writeGapsMarkdown(w io.Writer, g Gaps, on string) {
	fmt.Fprintf(w, "\n### Gaps%s\n\n", on)
	fmt.Fprintf(w, "- CUDA context (not available to the allocator): %s\n", units.FormatSize(g.ContextReserve))
	fmt.Fprintf(w, "- reserved but unallocated at the peak of allocated memory: %s\n", units.FormatSize(g.ReservedUnallocatedAtPeak))
	fmt.Fprintf(w, "- reserved but unallocated after the last event: %s\n", units.FormatSize(g.ReservedUnallocatedAtEnd))
	if g.ReservedUnallocatedAtOOM != nil {
		fmt.Fprintf(w, "- reserved but unallocated at the OOM: %s\n", units.FormatSize(*g.ReservedUnallocatedAtOOM))
	}
}

// writeLeaksMarkdown writes the leak section: the verdict, the memory at the end of each iteration, the
// suspects and what is held across iterations, ten of each at most.
func writeLeaksMarkdown(w io.Writer, l Leaks) {
	fmt.Fprintf(w, "\n### Leaks\n\n%s\n", l.Reason)
	if g := l.GradientsNeverCleared; g != nil {
		fmt.Fprintf(w, "\n%s\n", g.Reason)
	}
	if len(l.Points) > 0 {
		fmt.Fprintf(w, "\nAt the end of each iteration (warm-up %d):\n\n", l.Warmup)
		var rows [][]string
		for _, p := range l.Points {
			rows = append(rows, []string{iterationName(p.Iteration), units.FormatSize(p.Allocated), units.FormatSize(p.Reserved)})
		}
		mdTable(w, []string{"iteration", ">allocated", ">reserved"}, rows)
	}
	if len(l.Suspects) > 0 {
		fmt.Fprintf(w, "\n")
		var rows [][]string
		for _, sp := range head(l.Suspects, 10) {
			rows = append(rows, []string{units.FormatSize(sp.BytesPerIteration), sp.Category, code(sp.Scope), leaks.Kind(sp.Kind).Describe(),
				code(sp.Label), retainedByCell(sp.RetainedBy), code(stackLine(sp.Stack, 2))})
		}
		mdTable(w, []string{">bytes per iteration", "category", "scope", "kind", "example", "retained by", "allocated at"}, rows)
		if len(l.Suspects) > 10 {
			fmt.Fprintf(w, "\n%d more suspects in the JSON report.\n", len(l.Suspects)-10)
		}
	}
	if len(l.Held) > 0 {
		fmt.Fprintf(w, "\n%s, %s:\n\n", upperFirst(leaks.Held.Describe()), units.FormatSize(l.HeldBytes))
		var rows [][]string
		for _, h := range head(l.Held, 10) {
			rows = append(rows, []string{units.FormatSize(h.Bytes), itoa(int64(h.Count)), h.Category, code(h.Scope), rangeList(h.Iterations),
				code(h.Label), retainedByCell(h.RetainedBy), code(stackLine(h.Stack, 2))})
		}
		mdTable(w, []string{">bytes", ">blocks", "category", "scope", "allocated in iterations", "example", "retained by", "allocated at"}, rows)
		if len(l.Held) > 10 {
			fmt.Fprintf(w, "\n%d more groups in the JSON report.\n", len(l.Held)-10)
		}
	}
}

// retainedByCell is a table's "retained by" cell: the path, its middle left out, or that none names it.
func retainedByCell(r *RetainerPath) string {
	if r == nil {
		return "no heap dump names it"
	}
	return code(retainerLine(r, 4))
}

// writeFixesMarkdown writes the fixes that apply to what was alive at the peak, and the fragmentation rule.
func (r *Report) writeFixesMarkdown(w io.Writer) {
	fmt.Fprintf(w, "\n### Fixes\n\nSavings %s.\n\n", r.AdviceNote)
	if len(r.Advice) == 0 {
		fmt.Fprintf(w, "None applies to what was alive at the peak.\n")
		return
	}
	var rows [][]string
	for _, a := range r.Advice {
		rows = append(rows, []string{a.Fix, savingText(a), peakAfterText(a), fitsText(a), howText(a), a.Why})
	}
	mdTable(w, []string{"fix", ">saves", ">needs", "fits", "how", "why"}, rows)
	if measuredAny(r.Advice) {
		fmt.Fprintf(w, "\n%s.\n", sentence(r.FitsRule))
	}
	if rc := r.FragmentationRule; rc != nil {
		fmt.Fprintf(w, "\n**The %.0f%% rule** (call `empty_cache` when more than %.0f%% of reserved memory is unallocated): %s.\n",
			100*rc.Threshold, 100*rc.Threshold, rc.Verdict)
	}
}

// writeAliveMarkdown writes what was alive at a point: its bytes by category, the largest blocks and the
// largest scopes.
func writeAliveMarkdown(w io.Writer, a Alive, total int64) {
	fmt.Fprintf(w, "By category: %s.\n\n", categoryLine(a.ByCategory, total))
	if len(a.Top) > 0 {
		var rows [][]string
		for _, b := range a.Top {
			rows = append(rows, []string{units.FormatSize(b.Bytes), b.Category, code(b.Scope), code(b.Label), where(b.Iteration, b.Phase), code(stackLine(b.Stack, 2))})
		}
		mdTable(w, []string{">bytes", "category", "scope", "label", "allocated in", "at"}, rows)
	}
	if len(a.ByScope) > 0 {
		fmt.Fprintln(w)
		var rows [][]string
		for _, s := range head(a.ByScope, 5) {
			rows = append(rows, []string{code(s.Name), units.FormatSize(s.Bytes), itoa(int64(s.Count))})
		}
		mdTable(w, []string{"scope", ">bytes", ">blocks"}, rows)
	}
}

// upperFirst capitalises the first letter of an ASCII phrase, to begin a sentence with it.
func upperFirst(s string) string {
	if s == "" || s[0] < 'a' || s[0] > 'z' {
		return s
	}
	return string(s[0]-'a'+'A') + s[1:]
}
