package tui

import (
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/triage"
)

// rect is a region of the screen.
type rect struct{ w, h int }

// layout is the screen's division, computed once per window size: a title line, the timeline (with its phase
// band), the pane tabs, the pane, two status lines and the key help.
type layout struct {
	tooSmall bool
	timeline rect
	pane     rect
}

// The smallest terminal the TUI draws in: the pane tabs on one line, a timeline of a few rows and a pane of
// a few lines under it. Below it, a notice says so, and how to quit.
const minWidth, minHeight = 60, 16

func (m *Model) relayout() {
	m.banner = m.bannerText()
	w, h := m.width, m.height
	if w < minWidth || h < minHeight {
		m.layout = layout{tooSmall: true}
		return
	}
	fixed := 1 + 1 + 2 + 1 // title, tabs, status, help
	if m.banner != "" {
		fixed++
	}
	rest := h - fixed
	tl := max(rest*2/5, 4)
	m.layout = layout{timeline: rect{w, tl}, pane: rect{w, rest - tl}}
	m.help.SetWidth(w)
}

// frame is the last screen drawn. It is drawn again when a message changed what it shows, which every message
// but loading's is taken to do; while a snapshot loads, those arrive far faster than a terminal redraws, and
// the screen is drawn again every refreshEvery, and once loading ends.
type frame struct {
	content string
	at      time.Time
	valid   bool
}

// View renders the screen.
func (m *Model) View() tea.View {
	if !m.frame.valid || !m.load.done && time.Since(m.frame.at) >= refreshEvery {
		m.frame = frame{content: m.render(), at: time.Now(), valid: true}
	}
	v := tea.NewView(m.frame.content)
	v.AltScreen = true
	v.WindowTitle = "oomdbg"
	return v
}

func (m *Model) render() string {
	if m.width == 0 {
		return ""
	}
	if m.layout.tooSmall {
		return m.tooSmallView()
	}
	if m.showHelp {
		return fitHeight(m.helpView(), m.height)
	}
	var parts []string
	parts = append(parts, m.titleView())
	if m.banner != "" {
		parts = append(parts, m.bannerView())
	}
	if m.ix == nil || m.ix.len() == 0 {
		parts = append(parts, m.loadingView())
	} else {
		parts = append(parts, m.timeline.view(&m.styles, m.width, m.layout.timeline.h, m.viewFrom, m.viewTo, m.cursor))
		parts = append(parts, m.tabsView())
		parts = append(parts, fitHeight(m.paneView(), m.layout.pane.h))
		parts = append(parts, m.statusView()...)
	}
	parts = append(parts, m.footerView())
	return fitHeight(strings.Join(parts, "\n"), m.height)
}

// tooSmallView says the terminal is too small, what it needs, and how to quit, in as much of it as there is.
func (m *Model) tooSmallView() string {
	lines := []string{
		fmt.Sprintf("terminal too small (need %dx%d)", minWidth, minHeight),
		fmt.Sprintf("this one is %dx%d: enlarge it", m.width, m.height),
		"q quits",
	}
	for i, l := range lines {
		lines[i] = ansi.Truncate(l, m.width, "…")
	}
	return fitHeight(strings.Join(lines, "\n"), m.height)
}

// footerView is the key help under everything: the keys that matter most, as many as the width takes, and
// always how to get help and how to quit, which the key map puts last.
func (m *Model) footerView() string {
	if m.footer.width == m.width && m.footer.text != "" {
		return m.footer.text
	}
	m.footer.width, m.footer.text = m.width, m.footerFor(m.width)
	return m.footer.text
}

// footerFor is the footer at a width.
func (m *Model) footerFor(width int) string {
	keys := m.keys.ShortHelp()
	always := keys[len(keys)-2:]
	unbounded := m.help
	unbounded.SetWidth(0)
	for n := len(keys) - len(always); n >= 0; n-- {
		if line := unbounded.ShortHelpView(append(keys[:n:n], always...)); ansi.StringWidth(line) <= width {
			return line
		}
	}
	return ansi.Truncate(unbounded.ShortHelpView(always), width, "…")
}

func (m *Model) titleView() string {
	title := "oomdbg"
	if m.snap != nil {
		var w strings.Builder
		file := 0 // where the file's path ends in the title, when it names one
		w.WriteString("oomdbg")
		switch {
		case m.opts.File != "":
			fmt.Fprintf(&w, " · %s", m.opts.File)
			file = w.Len()
		case m.fixes.base != nil:
			fmt.Fprintf(&w, " · %s", m.fixes.base.Name)
		}
		if name := m.devices.name(); name != "" {
			fmt.Fprintf(&w, " · %s", name)
		}
		if m.ix != nil && m.ix.capacity > 0 { // the shown device's: several devices have no one capacity
			fmt.Fprintf(&w, ", %s", units.FormatSize(m.ix.capacity))
		}
		if m.ix != nil && m.ix.oom >= 0 {
			sp := m.ix.spanAt(m.ix.oom)
			fmt.Fprintf(&w, " · OOM in %s", triage.Where(sp.iteration, sp.phase))
		}
		w.WriteString(m.leakTitle())
		title = w.String()
		// A long path would push what follows it (the device, the OOM, a leak) off the line: the file's
		// name stands for it then.
		if file > 0 && ansi.StringWidth(" "+title) > m.width {
			title = "oomdbg · " + filepath.Base(m.opts.File) + title[file:]
		}
	}
	return m.styles.Title.Render(padRight(ansi.Truncate(" "+title, m.width, "…"), m.width))
}

func (m *Model) loadingView() string {
	h := m.layout.timeline.h + 1 + m.layout.pane.h + 2
	msg := ansi.Truncate(m.load.label+"…", m.width, "…")
	if m.load.err != nil {
		msg = m.styles.Error.Render(ansi.Truncate(m.load.err.Error(), m.width, "…"))
	}
	return fitHeight(msg, h)
}

// tabsView is the line of pane tabs: their numbers and names, the names shortened when they do not fit the
// width, and then only the pane shown named.
func (m *Model) tabsView() string {
	for _, names := range [][]string{paneNames[:], paneShortNames[:], nil} {
		var b strings.Builder
		for i := range m.panes() {
			label := fmt.Sprintf(" %d ", i+1)
			switch {
			case names != nil:
				label = fmt.Sprintf(" %d %s ", i+1, names[i])
			case pane(i) == m.pane:
				label = fmt.Sprintf(" %d %s ", i+1, paneNames[i])
			}
			if pane(i) == m.pane {
				b.WriteString(m.styles.ActiveTab.Render(label))
			} else {
				b.WriteString(m.styles.Tab.Render(label))
			}
		}
		if ansi.StringWidth(b.String()) <= m.width || names == nil {
			return ansi.Truncate(b.String(), m.width, "")
		}
	}
	return ""
}

func (m *Model) paneView() string {
	w, h := m.layout.pane.w, m.layout.pane.h
	if held := m.pane == paneLive || m.pane == paneCategories || m.pane == paneSegments; held && !m.ix.covers(m.cursor) {
		return m.styles.Muted.Render(ansi.Truncate("these events are paged out of memory: reading them back…", w, "…"))
	}
	switch m.pane {
	case paneLive:
		if m.showingOOM() {
			return m.oomp.view(m.styles, m.ix, m.fixes.needsLine(), m.fixes.runNeeds(), w, h)
		}
		return m.live.view(m.styles, w, h)
	case paneCategories:
		return m.cats.view(m.styles, w, h)
	case paneSegments:
		return m.segs.view(m.styles, w, h)
	case paneLeaks:
		return m.leaks.view(m.styles, w, h)
	case paneFixes:
		return m.fixes.view(m.styles, w, h)
	case paneDevice:
		return m.device.view(m.styles, w, h)
	case paneRanks:
		return m.ranks.view(m.styles, w, h)
	}
	return ""
}

// statusView is two lines: where the cursor is, with the change since the previous stop, and a message.
func (m *Model) statusView() []string {
	ix, c := m.ix, m.cursor
	sp := ix.spanAt(c)
	var pos string
	if ix.covers(c) {
		action := ix.tl.Snapshot().Events.Action(c)
		// The event's own change: what this allocation or free did, not the distance from the last stop.
		var delta int64
		if c > 0 {
			delta = ix.allocated(c) - ix.allocated(c-1)
		} else {
			delta = ix.allocated(0)
		}
		when := where(sp)
		if ix.isRebuilt(c) {
			when = "rebuilt from the final state (order invented)"
		}
		// As much as the width takes: the event's own change in words, then without them, then not at all;
		// then reserved shortened, then the action left to the live set's head.
		alloc, res, change := units.FormatSize(ix.allocated(c)), units.FormatSize(ix.reserved(c)), units.FormatChange(delta)
		for _, f := range []string{"%[1]s  alloc %[2]s (%[3]s this event)  reserved %[4]s", "%[1]s  alloc %[2]s (%[3]s)  reserved %[4]s",
			"%[1]s  alloc %[2]s  reserved %[4]s", "%[1]s  alloc %[2]s  res %[4]s", "alloc %[2]s  res %[4]s"} {
			pos = fmt.Sprintf("event %d/%d  %s  ", c, ix.len()-1, when) + fmt.Sprintf(f, action, alloc, change, res)
			if ansi.StringWidth(pos) <= m.width {
				break
			}
		}
	} else { // a paged run, outside the window: the overview's highest near the cursor
		pos = fmt.Sprintf("event %d/%d  %s  alloc ≤%s  reserved ≤%s  (paged out)", c, ix.len()-1,
			where(sp), units.FormatSize(ix.allocated(c)), units.FormatSize(ix.reserved(c)))
	}
	msg := m.status
	style := m.styles.Muted
	if m.statusIsError {
		style = m.styles.Error
	}
	if !m.load.done {
		msg = m.load.progress(ix.len())
	}
	return []string{ansi.Truncate(pos, m.width, "…"), style.Render(ansi.Truncate(msg, m.width, "…"))}
}

// helpView is the help overlay: every key, then what the timeline draws, scrolled when it is taller than the
// terminal. Its first line, which never scrolls, says how to close it and how to quit.
func (m *Model) helpView() string {
	title := m.styles.Title.Render(padRight(ansi.Truncate(" oomdbg keys · ? or esc closes · q quits · ↑↓ pgup/pgdn scroll", m.width, "…"), m.width))
	return title + "\n" + strings.Join(m.helpScroll.view(m.styles, m.helpLines(), m.width, m.height-1, -1), "\n")
}

// helpLines are the help's lines under its title: the key map's groups, side by side as the width allows,
// and the legend of the timeline.
func (m *Model) helpLines() []string {
	var lines []string
	all := m.keys.FullHelp()
	unbounded := m.help
	unbounded.SetWidth(0)
	// As many groups side by side as fit: all, then half of them, then one at a time.
	groups := [][][]key.Binding{all}
	for per := len(all); per >= 1; per = (per + 1) / 2 {
		groups = groups[:0]
		for i := 0; i < len(all); i += per {
			groups = append(groups, all[i:min(i+per, len(all))])
		}
		fits := true
		for _, g := range groups {
			fits = fits && widest(unbounded.FullHelpView(g)) <= m.width
		}
		if fits || per == 1 {
			break
		}
	}
	for _, g := range groups {
		lines = append(lines, "")
		for _, l := range strings.Split(unbounded.FullHelpView(g), "\n") {
			lines = append(lines, ansi.Truncate(l, m.width, "…"))
		}
	}
	lines = append(lines, "")
	for _, l := range strings.Split(ansi.Wordwrap(legend, m.width, " "), "\n") { // wrapped, never cut
		lines = append(lines, m.styles.Muted.Render(ansi.Truncate(l, m.width, "…")))
	}
	return lines
}

// onHelpKey answers a key while the help is open: it scrolls, closes, or quits; other keys do nothing behind
// it.
func (m *Model) onHelpKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.keys
	switch {
	case key.Matches(msg, k.Quit):
		m.fixes.cancel()
		return tea.Quit
	case key.Matches(msg, k.Help, k.Back):
		m.showHelp = false
	case key.Matches(msg, k.Up):
		m.helpScroll.top = max(m.helpScroll.top-1, 0)
	case key.Matches(msg, k.Down):
		m.helpScroll.top++
	case key.Matches(msg, k.Start):
		m.helpScroll.top = 0
	case key.Matches(msg, k.End):
		m.helpScroll.top = len(m.helpLines())
	default:
		m.helpScroll.onKey(msg, k, m.height-1)
	}
	return nil
}

// widest is the width of the widest line of s.
func widest(s string) int {
	w := 0
	for _, l := range strings.Split(s, "\n") {
		w = max(w, ansi.StringWidth(l))
	}
	return w
}

// legend says what the timeline draws.
const legend = "timeline: █ allocated, ░ reserved, ─ device capacity, • a re-run with fixes; the cache row under it: reserved minus allocated (memory the allocator holds that no tensor uses), on its own scale up to the size after \"cache\"; phase band: s setup, d data, F forward, B backward, R recompute, O optimizer, z zero_grad, e eval, │ an iteration begins, ~ rebuilt from the final state (order invented); zoomed out past a few columns an iteration, the band numbers the iterations instead"

// fitHeight pads or cuts s to exactly h lines.
func fitHeight(s string, h int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > h {
		lines = lines[:h]
	}
	for len(lines) < h {
		lines = append(lines, "")
	}
	return strings.Join(lines, "\n")
}
