package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// categoriesPane shows the live bytes by category at the cursor as bars, with the change since the start of
// the current phase: what this phase added, and what it freed.
type categoriesPane struct {
	now, start [snapshot.NumCategories]int64
	span       span
}

func (p *categoriesPane) setData(live []timeline.Allocation, sp span) {
	p.now, p.start, p.span = byCategory(live), sp.before, sp
}

func (p *categoriesPane) view(s Styles, w, h int) string {
	var total int64
	for _, v := range p.now {
		total = sum(total, v)
	}
	head := fmt.Sprintf("%s live by category; change since this phase began (%s)", units.FormatSize(total), where(p.span))
	lines := []string{s.Muted.Render(ansi.Truncate(head, w, "…"))}
	const label, num = 16, 23
	barW := max(w-label-num-2, 4)
	var top int64 = 1
	for _, v := range p.now {
		top = max(top, v)
	}
	for c := range snapshot.NumCategories {
		v, d := p.now[c], p.now[c]-p.start[c]
		if v == 0 && d == 0 {
			continue
		}
		n := share(v, top, barW)
		bar := strings.Repeat("█", n) + strings.Repeat(" ", barW-n)
		delta := ""
		if d != 0 {
			delta = units.FormatChange(d)
		}
		line := fmt.Sprintf("%-*s %s %10s %11s", label, snapshot.Category(c), s.Category[c].Render(bar), units.FormatSize(v), delta)
		lines = append(lines, ansi.Truncate(line, w, ""))
		if len(lines) >= h {
			break
		}
	}
	if len(lines) == 1 {
		lines = append(lines, s.Muted.Render("nothing is alive here"))
	}
	// What each category holds, in PyTorch's words, as room allows: the least familiar names first.
	for _, c := range []snapshot.Category{snapshot.CategoryAutogradDetail, snapshot.CategoryAMPCache, snapshot.CategoryActivation,
		snapshot.CategoryTemporary, snapshot.CategoryOptimizerState, snapshot.CategoryGradient, snapshot.CategoryInput,
		snapshot.CategoryParameter, snapshot.CategoryUnknown} {
		if len(lines) >= h {
			break
		}
		if p.now[c] != 0 || p.now[c] != p.start[c] {
			lines = append(lines, s.Muted.Render(ansi.Truncate(fmt.Sprintf("%-*s %s", label, snapshot.Category(c), snapshot.Category(c).Describe()), w, "…")))
		}
	}
	return strings.Join(lines, "\n")
}
