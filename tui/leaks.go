package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// leaksPane shows the leak analysis: the verdict, memory at the end of each iteration and its growth, and the
// suspects (groups of blocks that keep growing) with what keeps them alive. enter on a suspect jumps to its
// example block in the live set.
type leaksPane struct {
	res      *leaks.Result
	selected int
	running  bool
}

// leaksMsg is a finished leak analysis.
type leaksMsg struct{ res *leaks.Result }

// analyze runs the leak analysis of the timeline in the background (it reads the whole snapshot).
func (p *leaksPane) analyze(tl *snapshot.Timeline) tea.Cmd {
	p.running = true
	return func() tea.Msg { return leaksMsg{leaks.Analyze(tl)} }
}

func (p *leaksPane) onResult(msg leaksMsg) {
	p.res, p.running = msg.res, false
	p.selected = 0
}

func (p *leaksPane) onKey(msg tea.KeyPressMsg, m *Model) tea.Cmd {
	if p.res == nil {
		return nil
	}
	k := m.keys
	switch {
	case key.Matches(msg, k.Up):
		p.selected = max(p.selected-1, 0)
	case key.Matches(msg, k.Down):
		p.selected = min(p.selected+1, max(len(p.res.Suspects)-1, 0))
	case key.Matches(msg, k.Detail):
		if p.selected < len(p.res.Suspects) {
			ex := p.res.Suspects[p.selected].Example
			m.moveTo(ex.Alloc)
			m.pane = paneLive
			m.live.selectAlloc(ex.Alloc)
			m.setStatus(fmt.Sprintf("the suspect's example block, allocated at event %d", ex.Alloc), false)
		}
	}
	return nil
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
	case leaks.Fragmentation, leaks.Inconclusive:
		verdict = s.Warn
	}
	lines := []string{verdict.Render(ansi.Truncate(r.Reason, w, "…"))}
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
	if len(r.Suspects) > 0 {
		lines = append(lines, s.Header.Render(ansi.Truncate(fmt.Sprintf("%-12s %-16s %-28s %s", "per iteration", "category", "scope", "kept alive by (enter: the block)"), w, "")))
	}
	for i, sus := range r.Suspects {
		if len(lines) >= h {
			break
		}
		ret := "no heap dump names it"
		if sus.RetainedBy != nil {
			ret = sus.RetainedBy.Short(4)
		}
		line := ansi.Truncate(fmt.Sprintf("%12s %-16s %-28s %s", "+"+units.FormatSize(sus.BytesPerIteration), sus.Category,
			ansi.Truncate(sus.Scope, 28, "…"), ret), w, "…")
		if i == p.selected {
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}
