package tui

import (
	"fmt"
	"strings"

	"charm.land/lipgloss/v2"
	"charm.land/lipgloss/v2/table"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// runSummary is what the comparison shows of one run.
type runSummary struct {
	peakAlloc, peakRes int64
	capacity, usable   int64
	oom                bool
	oomWhere           string
	atPeak             [snapshot.NumCategories]int64
	leak               *leaks.Result // nil until analysed
	recompute, forward int           // allocations in the recompute and forward phases
}

func summarize(ix *index) *runSummary {
	r := &runSummary{peakAlloc: ix.allocated(max(ix.peak, 0)), peakRes: ix.peakReserved(), capacity: ix.capacity, usable: ix.usable,
		oom: ix.oom >= 0}
	if ix.ov != nil { // a paged run's, summed up page by page as it was read
		b := ix.ov.baseline
		r.peakAlloc, r.atPeak, r.forward, r.recompute = b.peakAlloc, b.atPeak, b.forward, b.recompute
	}
	if r.oom {
		sp := ix.spanAt(ix.oom)
		r.oomWhere = "OOM in " + where(sp)
	}
	if ix.ov != nil {
		return r
	}
	if ix.peak >= 0 {
		r.atPeak = byCategory(ix.liveAt(ix.peak))
	}
	r.forward, r.recompute = forwardAllocs(ix.snap.Events.Actions(), 0, ix.spans())
	return r
}

// forwardAllocs counts the allocations of the forward and the recompute phases among spans, whose events'
// actions are actions[span.Start-base : span.End-base]: what checkpointing recomputes against what the
// forward made.
func forwardAllocs(actions []snapshot.Action, base int, spans []timeline.PhaseSpan) (forward, recompute int) {
	for _, sp := range spans {
		if sp.Phase != snapshot.PhaseForward && sp.Phase != snapshot.PhaseRecompute {
			continue
		}
		n := 0
		for _, a := range actions[sp.Start-base : sp.End-base] {
			if a == snapshot.ActionAlloc {
				n++
			}
		}
		if sp.Phase == snapshot.PhaseForward {
			forward += n
		} else {
			recompute += n
		}
	}
	return forward, recompute
}

// fits says whether the run fits its card by the headroom rule, in a word or two: "fits", "tight: 12.00 MiB
// left", "OOM in forward, iteration 0"; "ran" where the card's capacity is unknown.
func (r *runSummary) fits() string {
	v := headroom.Judge(r.peakRes, r.oom, r.usable, headroom.DefaultMargin)
	switch v.Word {
	case headroom.OOM:
		return r.oomWhere
	case headroom.Unknown:
		return "ran"
	}
	return v.Short()
}

// verdict says in a few words how a run ended.
func (r *runSummary) verdict() string {
	if r.oom {
		return r.oomWhere + fmt.Sprintf(" at %s allocated", units.FormatSize(r.peakAlloc))
	}
	return fmt.Sprintf("%s, peak %s allocated", r.fits(), units.FormatSize(r.peakAlloc))
}

// comparison is the before/after table.
func (p *fixesPane) comparison(s Styles, w int) []string {
	switch {
	case p.running != nil && p.progress != nil && p.progress.Events.Len() > 0:
		n := p.progress.Events.Len()
		phase, iteration := p.progress.Events.Phase(n - 1)
		return []string{s.Warn.Render(fmt.Sprintf("re-running… %d events, iteration %d, %s", n, iteration, phase))}
	case p.running != nil:
		return []string{s.Warn.Render("re-running…")}
	case p.err != nil:
		return []string{s.Error.Render(ansi.Truncate("re-run failed: "+p.err.Error(), w, "…"))}
	case (p.after == nil || p.before == nil) && p.rec.base != nil:
		return nil
	case p.after == nil || p.before == nil:
		return []string{s.Muted.Render("no re-run yet")}
	}
	b, a := p.before, p.after
	fits := func(r *runSummary) string { return r.fits() }
	row := func(name string, before, after int64) []string {
		return []string{name, units.FormatSize(before), units.FormatSize(after), units.FormatChange(after - before)}
	}
	// What each run needs (its peak with unlimited memory) compares fixes; the peaks on the device stop at
	// an OOM, and a run that ran out sooner shows a lower one.
	var rows [][]string
	if p.rec.base != nil && p.afterNeeds > 0 && p.base.Fixes.Bug == "" {
		rows = append(rows, row("needs", p.rec.base.Needs, p.afterNeeds))
	}
	if p.rec.base != nil && p.afterNeeds > 0 && p.base.Fixes.Bug != "" { // a leak's need grows with the run
		rows = append(rows, []string{"needs", "grows (leak)", units.FormatSize(p.afterNeeds), ""})
	}
	rows = append(rows, row("peak allocated", b.peakAlloc, a.peakAlloc), row("peak reserved", b.peakRes, a.peakRes))
	n := len(rows)
	for c := range snapshot.NumCategories {
		if a.atPeak[c] != b.atPeak[c] {
			rows = append(rows, row("  "+snapshot.Category(c).String(), b.atPeak[c], a.atPeak[c]))
		}
	}
	// The categories' rows follow the device's verdict, which is a sentence rather than a row of the table.
	head, cats := rows[:n], rows[n:]
	var out []string
	for _, line := range strings.Split(comparisonTable(s, head), "\n") {
		out = append(out, ansi.Truncate(line, w, ""))
	}
	verdict := s.Good
	if !headroom.Judge(a.peakRes, a.oom, a.usable, headroom.DefaultMargin).Fits() {
		verdict = s.Error
	}
	out = append(out, ansi.Truncate(fmt.Sprintf("%-18s before: %s; after: ", "device", fits(b)), w, "")+verdict.Render(fits(a)))
	if bl, al := p.beforeLeak, a.leak; bl != nil && al != nil && (bl.Verdict == leaks.Leak || al.Verdict == leaks.Leak) {
		st := s.Good
		if al.Verdict == leaks.Leak {
			st = s.Error
		}
		out = append(out, ansi.Truncate(fmt.Sprintf("%-18s before: %s; after: ", "leak", leakWords(bl)), w, "")+st.Render(ansi.Truncate(leakWords(al), w/2, "…")))
	}
	if len(cats) > 0 {
		lines := strings.Split(comparisonTable(s, cats), "\n")
		for _, line := range lines[1:] { // the columns are the table's above
			out = append(out, ansi.Truncate(line, w, ""))
		}
	}
	if a.recompute > 0 && a.forward > 0 {
		out = append(out, ansi.Truncate(fmt.Sprintf("cost: backward recomputes %d%% of the forward's allocations", 100*a.recompute/a.forward), w, "…"))
	}
	return out
}

// comparisonTable lays out rows of a name and three sizes (before, after, change) under the before/after
// header: the name left-aligned, the sizes right-aligned, no borders.
func comparisonTable(s Styles, rows [][]string) string {
	return table.New().Border(lipgloss.HiddenBorder()).
		BorderTop(false).BorderBottom(false).BorderLeft(false).BorderRight(false).BorderHeader(false).BorderColumn(false).
		Headers("", "before", "after", "change").
		Rows(rows...).
		StyleFunc(func(row, col int) lipgloss.Style {
			st := lipgloss.NewStyle().Width(19).PaddingRight(1)
			if col > 0 {
				st = lipgloss.NewStyle().Width(13).PaddingLeft(1).Align(lipgloss.Right)
			}
			if row == table.HeaderRow {
				st = st.Inherit(s.Header)
			}
			return st
		}).
		Render()
}
