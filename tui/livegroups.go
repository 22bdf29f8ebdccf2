package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// The live set grouped: b cycles the grouping (none, site, scope, op, category); each group is a row with its
// blocks, bytes and share, largest first; enter opens a group's blocks, esc goes back to the groups.

// grouped reports whether the pane shows groups rather than blocks.
func (p *livePane) grouped() bool { return p.groupBy != groupNone && p.openGroup == "" }

// cycleGroup moves to the next grouping.
func (p *livePane) cycleGroup() string {
	p.groupBy = (p.groupBy + 1) % numGroupBys
	p.openGroup, p.groupSel = "", 0
	p.apply()
	if p.groupBy == groupNone {
		return "live set: every block"
	}
	return "live set grouped by " + groupNames[p.groupBy] + ": enter opens a group, b groups by " + groupNames[(p.groupBy+1)%numGroupBys]
}

// inOpenGroup reports whether block b belongs to the open group (every block when none is open).
func (p *livePane) inOpenGroup(b timeline.Allocation) bool {
	return p.openGroup == "" || groupName(p.ix.snap, b, p.groupBy) == p.openGroup
}

// groupsView renders the groups of the blocks shown: with a filter, those it keeps, their bytes of all live,
// and each group's share of what it keeps. total is the bytes of every block alive.
func (p *livePane) groupsView(s Styles, w, h int, total int64) string {
	what := fmt.Sprintf("%d blocks, %s live", len(p.shown), units.FormatSize(total))
	if p.filter.Value() != "" {
		var kept int64
		for _, b := range p.shown {
			kept = sum(kept, b.Size)
		}
		what = fmt.Sprintf("%d of %d blocks, %s of %s live", len(p.shown), len(p.rows), units.FormatSize(kept), units.FormatSize(total))
		total = kept
	}
	head := fmt.Sprintf("%s · %d groups by %s · b: by %s, enter: a group's blocks",
		what, len(p.groups), groupNames[p.groupBy], groupNames[(p.groupBy+1)%numGroupBys])
	lines := []string{s.Muted.Render(ansi.Truncate(head, w, "…"))}
	lines = append(lines, s.Header.Render(ansi.Truncate(fmt.Sprintf("  %10s %6s %7s  %s", "size", "share", "blocks", groupNames[p.groupBy]), w, "")))
	rows := h - 2
	p.groupSel = min(p.groupSel, max(len(p.groups)-1, 0))
	from := min(max(p.groupSel-rows+1, 0), max(len(p.groups)-rows, 0))
	for i := from; i < len(p.groups) && i < from+rows; i++ {
		g := p.groups[i]
		line := ansi.Truncate(fmt.Sprintf("  %10s %6s %7d  %s", units.FormatSize(g.bytes), percent(g.bytes, total), g.count, g.name), w, "…")
		if i == p.groupSel {
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	if len(p.groups) == 0 {
		lines = append(lines, s.Muted.Render("  no block is alive here"))
	}
	return strings.Join(lines, "\n")
}
