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

// Smallest usable terminal.
const minWidth, minHeight = 40, 12

func (m *Model) relayout() {
	w, h := m.width, m.height
	if w < minWidth || h < minHeight {
		m.layout = layout{tooSmall: true}
		return
	}
	fixed := 1 + 1 + 2 + 1 // title, tabs, status, help
	if m.leakBanner() != "" {
		fixed++
	}
	rest := h - fixed
	tl := max(rest*2/5, 4)
	m.layout = layout{timeline: rect{w, tl}, pane: rect{w, rest - tl}}
	m.help.SetWidth(w)
}

// frame is the last screen drawn. While a snapshot loads, messages arrive far faster than a terminal
// redraws: the screen is drawn again when something other than loading happened, or every refreshEvery.
type frame struct {
	content string
	at      time.Time
	valid   bool
}

// View renders the screen.
func (m *Model) View() tea.View {
	if !m.frame.valid || m.load.done || time.Since(m.frame.at) >= refreshEvery {
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
		return ansi.Truncate(fmt.Sprintf("oomdbg needs a terminal of at least %dx%d (this one is %dx%d)", minWidth, minHeight, m.width, m.height), m.width, "…")
	}
	if m.showHelp {
		return fitHeight(m.helpView(), m.height)
	}
	var parts []string
	parts = append(parts, m.titleView())
	if m.leakBanner() != "" {
		parts = append(parts, m.bannerView())
	}
	if m.ix == nil || m.ix.len() == 0 {
		parts = append(parts, m.loadingView())
	} else {
		parts = append(parts, m.timeline.view(m.styles, m.width, m.layout.timeline.h, m.viewFrom, m.viewTo, m.cursor))
		parts = append(parts, m.tabsView())
		parts = append(parts, fitHeight(m.paneView(), m.layout.pane.h))
		parts = append(parts, m.statusView()...)
	}
	parts = append(parts, ansi.Truncate(m.help.ShortHelpView(m.keys.ShortHelp()), m.width, "…"))
	return fitHeight(strings.Join(parts, "\n"), m.height)
}

func (m *Model) titleView() string {
	title := "oomdbg"
	if m.snap != nil {
		meta := m.snap.Meta
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
		if len(meta.Devices) > 0 && meta.Devices[0].Capacity > 0 {
			fmt.Fprintf(&w, ", %s", units.FormatSize(meta.Devices[0].Capacity))
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
	if m.leakBanner() != "" {
		h--
	}
	msg := ansi.Truncate(m.load.label+"…", m.width, "…")
	if m.load.err != nil {
		msg = m.styles.Error.Render(ansi.Truncate(m.load.err.Error(), m.width, "…"))
	}
	return fitHeight(msg, h)
}

func (m *Model) tabsView() string {
	var b strings.Builder
	for i, name := range paneNames[:m.panes()] {
		label := fmt.Sprintf(" %d %s ", i+1, name)
		if pane(i) == m.pane {
			b.WriteString(m.styles.ActiveTab.Render(label))
		} else {
			b.WriteString(m.styles.Tab.Render(label))
		}
	}
	return ansi.Truncate(b.String(), m.width, "")
}

func (m *Model) paneView() string {
	w, h := m.layout.pane.w, m.layout.pane.h
	if held := m.pane == paneLive || m.pane == paneCategories || m.pane == paneSegments; held && !m.ix.covers(m.cursor) {
		return m.styles.Muted.Render(ansi.Truncate("these events are paged out of memory: reading them back…", w, "…"))
	}
	switch m.pane {
	case paneLive:
		if m.showingOOM() {
			return m.oomp.view(m.styles, m.ix, m.fixes.needsLine(), w, h)
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
		pos = fmt.Sprintf("event %d/%d  %s  %s  alloc %s (%s this event)  reserved %s", c, ix.len()-1,
			triage.Where(sp.iteration, sp.phase), action, units.FormatSize(ix.allocated(c)), units.FormatChange(delta), units.FormatSize(ix.reserved(c)))
	} else { // a paged run, outside the window: the overview's highest near the cursor
		pos = fmt.Sprintf("event %d/%d  %s  alloc ≤%s  reserved ≤%s  (paged out)", c, ix.len()-1,
			triage.Where(sp.iteration, sp.phase), units.FormatSize(ix.allocated(c)), units.FormatSize(ix.reserved(c)))
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

func (m *Model) helpView() string {
	lines := []string{m.styles.Title.Render(padRight(" oomdbg keys (? or esc to close)", m.width)), ""}
	groups := [][][]key.Binding{m.keys.FullHelp()}
	unbounded := m.help
	unbounded.SetWidth(0)
	if all := groups[0]; widest(unbounded.FullHelpView(all)) > m.width { // too narrow: two rows of groups
		groups = [][][]key.Binding{all[:len(all)/2], all[len(all)/2:]}
	}
	for i, g := range groups {
		if i > 0 {
			lines = append(lines, "")
		}
		for _, l := range strings.Split(m.help.FullHelpView(g), "\n") {
			lines = append(lines, ansi.Truncate(l, m.width, "…"))
		}
	}
	lines = append(lines, "")
	for _, l := range strings.Split(ansi.Wordwrap(legend, m.width, " "), "\n") { // wrapped, never cut
		lines = append(lines, m.styles.Muted.Render(ansi.Truncate(l, m.width, "…")))
	}
	return strings.Join(lines, "\n")
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
const legend = "timeline: █ allocated, ░ reserved, ─ device capacity, • a re-run with fixes; the row under it: reserved minus allocated, on its own scale up to the size at its left; phase band: s setup, d data, F forward, B backward, R recompute, O optimizer, z zero_grad, e eval, │ an iteration"

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
