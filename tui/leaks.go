package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// leaksPane shows the leak analysis: the verdict, the finding on gradients, memory at the end of each
// iteration and its growth, the suspects (groups of blocks that keep growing) and the groups held across
// iterations, each with what keeps it alive. enter on a row jumps to its example block in the live set.
type leaksPane struct {
	res      *leaks.Result
	selected int // a row: the suspects, then the held groups
	running  bool
}

// leaksMsg is a finished leak analysis.
type leaksMsg struct{ res *leaks.Result }

// analyze runs the leak analysis of the timeline in the background (it reads the whole snapshot).
func (p *leaksPane) analyze(tl *timeline.Timeline) tea.Cmd {
	p.running = true
	return func() tea.Msg { return leaksMsg{leaks.Analyze(tl)} }
}

func (p *leaksPane) onResult(msg leaksMsg) {
	p.res, p.running = msg.res, false
	p.selected = 0
}

// rows is how many rows the pane lists: suspects and held groups.
func (p *leaksPane) rows() int { return len(p.res.Suspects) + len(p.res.Held) }

// example returns the example block of row i.
func (p *leaksPane) example(i int) timeline.Allocation {
	if i < len(p.res.Suspects) {
		return p.res.Suspects[i].Example
	}
	return p.res.Held[i-len(p.res.Suspects)].Example
}

// onKey moves in the rows of a pane h lines high; enter asks for the row's example block in the live set.
func (p *leaksPane) onKey(msg tea.KeyPressMsg, k KeyMap, h int) action {
	if p.res == nil {
		return action{}
	}
	if sel, ok := listMove(msg, k, p.selected, p.rows(), h-4); ok {
		p.selected = sel
		return action{}
	}
	switch {
	case key.Matches(msg, k.Detail):
		if p.selected < p.rows() {
			ex := p.example(p.selected)
			// The block as the analysis saw it, at its last measurement: a block changes category over its
			// life (a temporary saved for backward becomes an activation), and the Leaks row names the later.
			at := ex.Alloc
			if n := len(p.res.Points); n > 0 && p.res.Points[n-1].Seq >= ex.Alloc {
				at = p.res.Points[n-1].Seq
			}
			what := "the suspect's"
			if p.selected >= len(p.res.Suspects) {
				what = "the held group's"
			}
			return action{show: &shownBlock{at: at, alloc: ex.Alloc, what: what}}
		}
	}
	return action{}
}

func (p *leaksPane) view(s Styles, w, h int) string {
	switch {
	case p.running:
		return s.Muted.Render("looking for leaks…")
	case p.res == nil:
		return s.Muted.Render("the leak analysis runs once the snapshot has loaded")
	}
	r := p.res
	verdict := s.Good
	switch r.Verdict {
	case leaks.Leak:
		verdict = s.Error
	case leaks.Held, leaks.Fragmentation, leaks.Inconclusive:
		verdict = s.Warn
	}
	lines := []string{verdict.Render(ansi.Truncate(r.Reason, w, "…"))}
	if a := r.Advice(); a != "" { // what to change, in two lines at most
		fix := strings.Split(ansi.Wordwrap("fix: "+a, w, " "), "\n")
		if len(fix) > 2 {
			fix = append(fix[:1], ansi.Truncate(strings.Join(fix[1:], " "), w, "…"))
		}
		for _, l := range fix {
			lines = append(lines, s.Bold.Render(ansi.Truncate(l, w, "…")))
		}
	}
	if g := r.Gradients; g != nil {
		lines = append(lines, s.Warn.Render(ansi.Truncate(g.Reason, w, "…")))
	}
	if len(r.Points) > 0 {
		var b strings.Builder
		b.WriteString("allocated at iteration ends:")
		for i, pt := range r.Points {
			if i > 0 {
				b.WriteString(" →")
			}
			fmt.Fprintf(&b, " %d: %s", pt.Iteration, units.FormatSize(pt.Allocated))
		}
		lines = append(lines, s.Muted.Render(ansi.Truncate(b.String(), w, "…")))
	}

	// The rows: a header before the suspects and one before the held groups, scrolled to keep the
	// selected row in view.
	type row struct {
		text   string
		header bool
		index  int // the row's number, -1 for a header
	}
	var rows []row
	if len(r.Suspects) > 0 {
		rows = append(rows, row{fmt.Sprintf("%-12s %-16s %-28s %s", "per iteration", "category", "scope", "kept alive by (enter: the block)"), true, -1})
	}
	for i, sus := range r.Suspects {
		rows = append(rows, row{fmt.Sprintf("%12s %-16s %-28s %s", "+"+units.FormatSize(sus.BytesPerIteration), sus.Category,
			ansi.Truncate(sus.Scope, 28, "…"), retainerText(sus.RetainedBy)), false, i})
	}
	if len(r.Held) > 0 {
		rows = append(rows, row{fmt.Sprintf("%-58s %s", leaks.Held.Describe()+": "+units.FormatSize(r.HeldBytes), "kept alive by"), true, -1})
	}
	for i, hg := range r.Held {
		rows = append(rows, row{fmt.Sprintf("%12s %-16s %-28s %s", units.FormatSize(hg.Bytes), hg.Category,
			ansi.Truncate(hg.Scope, 28, "…"), retainerText(hg.RetainedBy)), false, len(r.Suspects) + i})
	}
	room := h - len(lines)
	first := 0
	if room > 0 {
		for i, rw := range rows {
			if rw.index == p.selected && i >= room {
				first = i - room + 1
			}
		}
	}
	for _, rw := range rows[min(first, len(rows)):] {
		if len(lines) >= h {
			break
		}
		line := ansi.Truncate(rw.text, w, "…")
		switch {
		case rw.header:
			line = s.Header.Render(ansi.Truncate(rw.text, w, ""))
		case rw.index == p.selected:
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}

// retainerText says what kept a row's example block alive.
func retainerText(r *leaks.RetainerPath) string {
	if r == nil {
		return "no heap dump names it"
	}
	return r.Short(4)
}
