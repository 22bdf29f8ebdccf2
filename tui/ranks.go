package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
)

// ranksPane shows a data-parallel job's ranks side by side (oomdbg view with several files): each rank's
// peak and where it came, model states, activations, host memory and OOM, the worst marked; enter opens the
// chosen rank in the TUI.
type ranksPane struct {
	table    *triage.RankTable
	load     func(path string) (*snapshot.Snapshot, error)
	selected int
	open     int // the row shown
}

func newRanksPane(t *triage.RankTable, load func(string) (*snapshot.Snapshot, error), open int) ranksPane {
	return ranksPane{table: t, load: load, selected: open, open: open}
}

// rankMsg is a rank's snapshot, loaded.
type rankMsg struct {
	row int
	s   *snapshot.Snapshot
	err error
}

// onKey moves in the ranks; enter reads the one chosen, in the background.
func (p *ranksPane) onKey(msg tea.KeyPressMsg, k KeyMap, h int) action {
	if p.table == nil {
		return action{}
	}
	if sel, ok := listMove(msg, k, p.selected, len(p.table.Ranks), h-2); ok {
		p.selected = sel
		return action{}
	}
	switch {
	case key.Matches(msg, k.Detail):
		if p.selected == p.open || p.table.Ranks[p.selected].Error != "" || p.load == nil {
			return action{}
		}
		row, file, load := p.selected, p.table.Ranks[p.selected].File, p.load
		return action{status: "reading " + file + "…", cmd: func() tea.Msg {
			s, err := load(file)
			return rankMsg{row: row, s: s, err: err}
		}}
	}
	return action{}
}

func (p *ranksPane) view(s Styles, w, h int) string {
	if p.table == nil {
		return s.Muted.Render(ansi.Truncate("one snapshot: oomdbg view FILE FILE... puts a job's ranks side by side", w, "…"))
	}
	lines := []string{s.Muted.Render(ansi.Truncate("↑↓ choose, enter opens the rank; * the worst: "+p.table.Why, w, "…"))}
	nameWidth := 5 // the rank, and its place in a split job
	for _, r := range p.table.Ranks {
		nameWidth = max(nameWidth, len(rankName(r)))
	}
	header := fmt.Sprintf("  %-*s %10s  %-22s %12s %11s %10s  %s", nameWidth, "rank", "peak", "at", "model states", "activations", "host", "OOM")
	lines = append(lines, s.Muted.Render(ansi.Truncate(header, w, "…")))
	for i, r := range p.table.Ranks {
		mark := " "
		switch {
		case i == p.open:
			mark = "▸"
		case i == p.table.Worst:
			mark = "*"
		}
		name := rankName(r)
		var line string
		if r.Error != "" {
			line = fmt.Sprintf("%s %-*s %s", mark, nameWidth, name, r.File+": "+r.Error)
		} else {
			oom, host := "-", "-"
			if r.OOM {
				oom = whereNamed(r.OOMIteration, r.OOMPhase)
			}
			if r.HostAllocated > 0 {
				host = units.FormatSize(r.HostAllocated)
			}
			line = fmt.Sprintf("%s %-*s %10s  %-22s %12s %11s %10s  %s", mark, nameWidth, name, units.FormatSize(r.PeakAllocated),
				whereNamed(r.PeakIteration, r.PeakPhase), units.FormatSize(r.ModelStates),
				units.FormatSize(r.Activations), host, oom)
		}
		line = ansi.Truncate(line, w, "…")
		if i == p.selected {
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	if len(lines) > h {
		lines = lines[:h]
	}
	return strings.Join(lines, "\n")
}

// openRank shows a rank's snapshot in place of the one shown.
func (m *Model) openRank(msg rankMsg) tea.Cmd {
	if msg.err != nil {
		m.setStatus(msg.err.Error(), true)
		return nil
	}
	m.ranks.open = msg.row
	m.opts.File = m.ranks.table.Ranks[msg.row].File
	m.fixes = newFixesPane(nil, m.opts.Backend, m.opts.MemoryBudget)
	m.landedOnTarget, m.zoomed, m.cursor, m.prev = false, false, 0, 0
	m.setSnapshot(msg.s)
	m.load = loadState{label: "snapshot", done: true}
	m.landOnTarget()
	return m.leaks.analyze(m.ix.tl)
}

// rankName is a rank's name in the pane: its number, and its short place in a split job ("0 s2 c1").
func rankName(r triage.RankRow) string {
	name := "?"
	if r.Rank >= 0 {
		name = fmt.Sprint(r.Rank)
	}
	if r.ShortPlace != "" {
		name += " " + r.ShortPlace
	}
	return name
}
