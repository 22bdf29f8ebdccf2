package tui

import (
	"fmt"
	"strings"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
)

// leaksPane shows allocated memory at the start of every iteration and its growth: memory that is still
// there one iteration later, every iteration, is a leak.
type leaksPane struct {
	starts []iterStart
}

type iterStart struct {
	iteration int32
	at        int
	allocated int64
}

func (p *leaksPane) setData(ix *index) {
	p.starts = p.starts[:0]
	for _, i := range ix.iters {
		p.starts = append(p.starts, iterStart{ix.snap.Events[i].Iteration, i, ix.allocated[i]})
	}
}

func (p *leaksPane) onKey(tea.KeyPressMsg, *Model) tea.Cmd { return nil }

func (p *leaksPane) view(s Styles, w, h int) string {
	if len(p.starts) < 2 {
		return s.Muted.Render("growth per iteration needs at least two iterations")
	}
	lines := []string{s.Muted.Render(ansi.Truncate("allocated at the start of each iteration, and growth since the one before", w, "…"))}
	var growing int
	for i, st := range p.starts {
		g := ""
		if i > 0 {
			d := st.allocated - p.starts[i-1].allocated
			g = fmt.Sprintf("%+12s", signed(d))
			if d > 0 {
				growing++
			}
		}
		lines = append(lines, fmt.Sprintf("  iteration %4d  %12s %s", st.iteration, units.FormatSize(st.allocated), g))
	}
	verdict := s.Good.Render("flat: no growth from iteration to iteration")
	if n := len(p.starts) - 1; growing >= max(n-1, 1) && n >= 2 {
		verdict = s.Error.Render(fmt.Sprintf("growing in %d of %d iterations: a leak", growing, n))
	}
	lines = append([]string{lines[0], verdict}, lines[1:]...)
	if len(lines) > h {
		lines = append(lines[:h-1], s.Muted.Render(fmt.Sprintf("  … %d more iterations", len(lines)-h+1)))
	}
	return strings.Join(lines, "\n")
}

func signed(d int64) string {
	if d >= 0 {
		return "+" + units.FormatSize(d)
	}
	return units.FormatSize(d)
}
