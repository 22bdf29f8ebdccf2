package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/triage"
)

// oomPanel is what the Live pane shows at the OOM: the failing request (its size, tensor, scope and stack),
// PyTorch's message as triage writes it, allocated, reserved and free memory then, what the run needs, and
// the three largest categories and sites alive. esc shows the live set under it; o shows the panel again.
type oomPanel struct {
	oom    *triage.OOM // nil until first shown
	hidden bool
}

// explain computes the OOM's explanation once.
func (p *oomPanel) explain(ix *index) *triage.OOM {
	if p.oom == nil && ix.oom >= 0 {
		p.oom = triage.ExplainOOM(ix.tl, 3)
	}
	return p.oom
}

// view renders the panel in w x h; needs is the measured need line ("" when unknown), and runNeeds the bytes
// it gives (0: not measured), against which the kind of OOM is weighed: a run that needs more than the card
// is out of capacity, whatever its request met.
func (p *oomPanel) view(s Styles, ix *index, needs string, runNeeds int64, w, h int) string {
	o := p.explain(ix)
	if runNeeds > 0 && ix.usable > 0 {
		weighed := *o
		weighed.WeighNeeds(runNeeds, ix.usable)
		o = &weighed
	}
	cut := func(l string) string { return ansi.Truncate(l, w, "…") }
	lines := []string{s.Error.Render(cut(fmt.Sprintf("OUT OF MEMORY at event %d, %s (%s)", o.Event, whereNamed(o.Iteration, o.Phase), o.Kind)))}
	req := "request " + units.FormatSize(o.AllocSize)
	if o.Label != "" {
		req += "  " + o.Label
	}
	if o.Scope != "" {
		req += "  in " + o.Scope
	}
	lines = append(lines, s.Bold.Render(cut(req)))
	if len(o.Stack) > 0 {
		lines = append(lines, cut("  at "+o.Stack[0]))
	}
	// PyTorch's message: its first sentences say what failed; the rest (its advice) when there is room.
	msg := strings.Split(ansi.Wordwrap(o.Message, w-2, " ,"), "\n")
	keep := 2
	if h >= 20 {
		keep = 6
	}
	if len(msg) > keep {
		msg = msg[:keep]
		msg[keep-1] += " …"
	}
	for _, l := range msg {
		lines = append(lines, s.Muted.Render(cut("  "+l)))
	}
	lines = append(lines, cut(fmt.Sprintf("then: allocated %s · reserved %s · device free %s",
		units.FormatSize(o.Allocated), units.FormatSize(o.Reserved), units.FormatSize(o.Free))))
	if needs != "" { // a line for each of its parts: the last says where the fixes are, and must not be cut
		for _, l := range strings.Split(needs, "; ") {
			lines = append(lines, s.Bold.Render(cut(l)))
		}
	}
	total := o.Allocated
	var cats []string
	for _, g := range groupLive(ix.snap, ix.liveAt(o.Event), groupCategory)[:] {
		if len(cats) == 3 {
			break
		}
		cats = append(cats, fmt.Sprintf("%s %s %s", g.name, units.FormatSize(g.bytes), percent(g.bytes, total)))
	}
	lines = append(lines, cut("alive: "+strings.Join(cats, " · ")))
	lines = append(lines, s.Header.Render(cut("alive by site (esc: every block alive; 3: the segments)")))
	for i, g := range groupLive(ix.snap, ix.liveAt(o.Event), groupSite) {
		if i == 3 {
			break
		}
		lines = append(lines, cut(fmt.Sprintf("  %10s  %4d blocks  %s", units.FormatSize(g.bytes), g.count, g.name)))
	}
	if len(o.Stack) > 1 && len(lines)+2 <= h {
		lines = append(lines, s.Header.Render("the request's stack"))
		for _, f := range o.Stack {
			lines = append(lines, cut("  "+f))
		}
	}
	return fitLines(lines, h)
}

// percent is part of whole as a whole percentage.
func percent(part, whole int64) string {
	if whole <= 0 {
		return "-"
	}
	return fmt.Sprintf("%d%%", (100*part+whole/2)/whole)
}

// fitLines joins at most h lines.
func fitLines(lines []string, h int) string {
	if len(lines) > h {
		lines = lines[:max(h, 0)]
	}
	return strings.Join(lines, "\n")
}

// showingOOM reports whether the Live pane shows the OOM panel: at the OOM, unless esc put it away or a
// block's detail is open.
func (m *Model) showingOOM() bool {
	return m.ix != nil && m.ix.oom >= 0 && m.cursor == m.ix.oom && !m.oomp.hidden && !m.live.detail
}
