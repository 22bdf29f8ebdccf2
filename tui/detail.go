package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// detailLines is everything the detail of block b says, one line each, at most w cells wide: what it is,
// its lifetime and the categories it had, the whole retainer path, and the whole stack (for a PyTorch
// trace, its Python frames, then, with a, the compiled ones).
func (p *livePane) detailLines(s Styles, b timeline.Allocation, w int) []string {
	snap, tl := p.ix.snap, p.ix.tl
	cut := func(l string) string { return ansi.Truncate(l, w, "…") }
	lines := []string{
		s.Bold.Render(cut(fmt.Sprintf("%s  %s  (%s: %s)", orDash(p.title(b)), units.FormatSize(b.Size), b.Category, b.Category.Describe()))),
		cut(fmt.Sprintf("requested %s, block %s at %#x on device %d, stream %d", units.FormatSize(b.Requested), units.FormatSize(b.Size), b.Addr, b.Device, b.Stream)),
		s.Header.Render("lifetime"),
		cut(fmt.Sprintf("  allocated at event %d: %s, in %s", b.Alloc, triage.Where(b.Iteration, b.Phase), orDash(snap.String(b.Scope)))),
	}
	if first := tl.Allocation(b.ID, b.Alloc).Category; first != b.Category {
		lines = append(lines, cut(fmt.Sprintf("  %s when allocated, %s here (event %d)", first, b.Category, p.at)))
	}
	switch {
	case b.Free >= 0:
		lines = append(lines, cut(fmt.Sprintf("  freed at event %d: %s; alive for %d events", b.Free, where(p.ix.spanAt(b.Free)), b.Free-b.Alloc)))
	case tl.Len() < p.ix.len(): // a paged run's window, which ends before the run does
		lines = append(lines, cut(fmt.Sprintf("  not freed by event %d, the last of the pages held; step on to read its end", tl.Len()-1)))
	default:
		lines = append(lines, cut(fmt.Sprintf("  never freed: alive to the last event (%d), %d events", p.ix.len()-1, p.ix.len()-1-b.Alloc)))
	}
	if path := p.ix.retainerPath(b, p.at); len(path) > 0 {
		lines = append(lines, s.Header.Render(cut(fmt.Sprintf("kept alive by (%d holders, the block's first, the root last)", len(path)))))
		for i, r := range path {
			lines = append(lines, cut(strings.Repeat(" ", min(i, 12))+"← "+r))
		}
	} else {
		lines = append(lines, s.Muted.Render(cut("no heap dump names this block (heap dumps come at iteration ends and at an OOM)")))
	}
	// The program's frames first (a Python program's Python frames, as memory_viz shows them); the
	// allocator's and the dispatcher's compiled frames after them, or hidden until a asks for them.
	frames := snap.Stack(b.Stack)
	own := snap.UserFrames(b.Stack, 0)
	python := len(own) > 0 && strings.HasSuffix(snap.String(snap.Frame(own[0]).File), ".py")
	switch {
	case python && len(own) < len(frames):
		hidden := ""
		if !p.allFrames {
			hidden = fmt.Sprintf(" (%d compiled frames hidden · a shows all)", len(frames)-len(own))
		}
		lines = append(lines, s.Header.Render(cut("allocated from"+hidden)), s.Muted.Render("  python"))
		for _, f := range own {
			lines = append(lines, cut("  "+frameLine(snap, f)))
		}
		if p.allFrames {
			lines = append(lines, s.Muted.Render(compiledHeader))
			for _, f := range frames {
				if !strings.HasSuffix(snap.String(snap.Frame(f).File), ".py") {
					lines = append(lines, cut("  "+frameLine(snap, f)))
				}
			}
		}
	default:
		lines = append(lines, s.Header.Render("allocated from"))
		for _, f := range frames {
			lines = append(lines, cut("  "+frameLine(snap, f)))
		}
	}
	if len(frames) == 0 {
		lines = append(lines, s.Muted.Render("  no stack recorded"))
	}
	return lines
}

// compiledHeader heads the compiled frames of a Python program's stack in the detail.
const compiledHeader = "  compiled"

// frameLine is one frame: function, then file and line.
func frameLine(snap *snapshot.Snapshot, f snapshot.FrameID) string {
	fr := snap.Frame(f)
	return fmt.Sprintf("%s  %s:%d", snap.String(fr.Function), shortFile(snap.String(fr.File)), fr.Line)
}

// detailView shows the selected block's detail from its scroll offset, with a line saying where it is when
// it does not fit.
func (p *livePane) detailView(s Styles, w, h int) string {
	lines := p.detailLines(s, p.shown[p.selected], w)
	if len(lines) <= h {
		p.scroll = 0
		return strings.Join(lines, "\n")
	}
	room := h - 1
	if p.toCompiled {
		for i, l := range lines {
			if ansi.Strip(l) == compiledHeader {
				p.scroll = i
			}
		}
		p.toCompiled = false
	}
	p.scroll = min(max(p.scroll, 0), len(lines)-room)
	shown := lines[p.scroll : p.scroll+room]
	more := fmt.Sprintf("lines %d-%d of %d · ↑↓ pgup/pgdn ctrl+u/ctrl+d scroll · esc back", p.scroll+1, p.scroll+room, len(lines))
	return strings.Join(append(shown, s.Muted.Render(ansi.Truncate(more, w, "…"))), "\n")
}

// scrollDetail scrolls the detail: a line with ↑↓ (j/k), half a page with ctrl+u and ctrl+d, a page with
// pgup and pgdn; the view clamps the offset.
func (p *livePane) scrollDetail(msg tea.KeyPressMsg, k KeyMap, h int) {
	page := max(h-1, 2) // the lines shown: the pane less the line that says where they are
	switch {
	case key.Matches(msg, k.Up):
		p.scroll--
	case key.Matches(msg, k.Down):
		p.scroll++
	case msg.String() == "ctrl+d":
		p.scroll += page / 2
	case msg.String() == "ctrl+u":
		p.scroll -= page / 2
	case key.Matches(msg, k.PageDown):
		p.scroll += page
	case key.Matches(msg, k.PageUp):
		p.scroll -= page
	}
	p.scroll = max(p.scroll, 0)
}
