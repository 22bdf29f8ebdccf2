package tui

import (
	"fmt"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"
)

// Whatever a pane or the help shows that is taller than its room scrolls: the selected row stays in view,
// pgup and pgdn move a page, and the last line says which lines show and how to see the others. At 80x24 a
// pane has a dozen lines; nothing may hide below them.

// scroller is a scrolled view's first line shown.
type scroller struct {
	top  int
	kept int // the line view kept in view last: a selection that moves is brought into view, one that stays is not
}

// view returns at most h of lines from the first one shown; when they do not all fit, the last of the h says
// which show and how to scroll. keep is a line to bring into view when it changed since the last call (the
// selection), -1 for none.
func (sc *scroller) view(s Styles, lines []string, w, h, keep int) []string {
	if h <= 0 {
		return nil
	}
	if len(lines) <= h {
		sc.top, sc.kept = 0, keep
		return lines
	}
	room := h - 1
	if keep >= 0 && keep != sc.kept {
		switch {
		case keep < sc.top:
			sc.top = keep
		case keep >= sc.top+room:
			sc.top = keep - room + 1
		}
	}
	sc.kept = keep
	sc.top = min(max(sc.top, 0), len(lines)-room)
	out := append([]string(nil), lines[sc.top:sc.top+room]...)
	more := fmt.Sprintf("lines %d-%d of %d · pgup/pgdn scroll", sc.top+1, sc.top+room, len(lines))
	return append(out, s.Muted.Render(ansi.Truncate(more, w, "…")))
}

// onKey scrolls by a page (pgup, pgdn) in a view h lines high; it reports whether the key was one of those.
func (sc *scroller) onKey(msg tea.KeyPressMsg, k KeyMap, h int) bool {
	page := max(h-2, 1)
	switch {
	case key.Matches(msg, k.PageDown):
		sc.top += page
	case key.Matches(msg, k.PageUp):
		sc.top = max(sc.top-page, 0)
	default:
		return false
	}
	return true
}

// listMove moves a list's selection as the key says: a row with ↑↓, a page of rows with pgup and pgdn,
// within the list's n rows (0 when it has none). It reports whether the key was one of those.
func listMove(msg tea.KeyPressMsg, k KeyMap, selected, n, page int) (int, bool) {
	switch {
	case key.Matches(msg, k.Up):
		selected--
	case key.Matches(msg, k.Down):
		selected++
	case key.Matches(msg, k.PageUp):
		selected -= max(page, 1)
	case key.Matches(msg, k.PageDown):
		selected += max(page, 1)
	default:
		return selected, false
	}
	return max(min(selected, n-1), 0), true
}
