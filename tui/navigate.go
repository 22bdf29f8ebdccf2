package tui

import (
	"slices"
	"sort"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// onNavigate moves the cursor or the timeline's window; it reports whether the key was one of those.
func (m *Model) onNavigate(msg tea.KeyPressMsg) (tea.Cmd, bool) {
	k, n := m.keys, m.ix.len()
	step := max(n/100, 1)
	// A hint says something of where the cursor was: a move drops it, unless the key gives one of its own.
	status, isErr := m.status, m.statusIsError
	if !isErr {
		m.status = ""
	}
	switch {
	case key.Matches(msg, k.StepBack):
		m.moveTo(m.cursor - 1)
	case key.Matches(msg, k.StepForward):
		m.moveTo(m.cursor + 1)
	case key.Matches(msg, k.JumpBack):
		m.moveTo(m.cursor - step)
	case key.Matches(msg, k.JumpForward):
		m.moveTo(m.cursor + step)
	case key.Matches(msg, k.NextPhase):
		m.moveTo(m.nextBoundary(+1))
	case key.Matches(msg, k.PrevPhase):
		m.moveTo(m.nextBoundary(-1))
	case key.Matches(msg, k.NextIter):
		m.moveTo(m.nextIteration(+1))
	case key.Matches(msg, k.PrevIter):
		m.moveTo(m.nextIteration(-1))
	case key.Matches(msg, k.Peak):
		if m.ix.peak >= 0 {
			m.moveTo(m.ix.peak)
			m.setStatus("the peak: the first event reaching the highest allocated bytes", false)
		}
	case key.Matches(msg, k.OOM):
		if m.ix.oom < 0 {
			m.setStatus("this run did not run out of memory", false)
		} else {
			m.moveTo(m.ix.oom)
			m.oomp.hidden = false
			m.setStatus("the OOM: esc shows the live set", false)
		}
	case key.Matches(msg, k.Start):
		m.moveTo(0)
	case key.Matches(msg, k.End):
		m.moveTo(n - 1)
	case key.Matches(msg, k.ZoomIn):
		m.zoom(0.5)
	case key.Matches(msg, k.ZoomOut):
		m.zoom(2)
	case key.Matches(msg, k.ZoomAll):
		m.viewFrom, m.viewTo, m.zoomed = 0, n, false
	case key.Matches(msg, k.PanLeft, k.PanRight):
		m.pan(key.Matches(msg, k.PanRight))
	case key.Matches(msg, k.TimeAxis):
		a := &m.timeline.axis
		a.byTime = !a.byTime
		switch {
		case a.byTime && m.ix.ov != nil:
			m.setStatus("x-axis: time is drawn only for a run held whole; this one is paged, so the events stay the columns", false)
		case a.byTime:
			m.setStatus("x-axis: time, each column the same span of it (where the events carry no time: events)", false)
		default:
			m.setStatus("x-axis: the run's events, each column as many of them; markers take none", false)
		}
	default:
		m.status, m.statusIsError = status, isErr
		return nil, false
	}
	return nil, true
}

// onListKey gives g and G to the list of a list pane, as less and lazygit do: its first and last row. home
// and end still move the timeline.
func (m *Model) onListKey(msg tea.KeyPressMsg) bool {
	top := msg.String() == "g"
	if !top && msg.String() != "G" {
		return false
	}
	switch {
	case m.pane == paneLive && !m.showingOOM() && !m.live.detail && len(m.live.shown) > 0:
		m.live.selected = 0
		if !top {
			m.live.selected = len(m.live.shown) - 1
		}
	case m.pane == paneLeaks && m.leaks.res != nil && m.leaks.rows() > 0:
		m.leaks.selected = 0
		if !top {
			m.leaks.selected = m.leaks.rows() - 1
		}
	default:
		return false
	}
	return true
}

// moveTo puts the cursor on event i (clamped), keeps it inside the timeline's window, and brings the panes
// to it. The previous stop is remembered so the panes can show what changed.
func (m *Model) moveTo(i int) {
	n := m.ix.len()
	if n == 0 {
		return
	}
	i = min(max(i, 0), n-1)
	if i == m.cursor && m.live.at == i {
		return
	}
	m.prev, m.cursor = m.cursor, i
	if w := m.viewTo - m.viewFrom; i < m.viewFrom || i >= m.viewTo {
		m.viewFrom = min(max(i-w/2, 0), max(n-w, 0))
		m.viewTo = m.viewFrom + w
	}
	m.refreshPanes()
}

// zoom scales the timeline's window around the cursor by f.
func (m *Model) zoom(f float64) {
	n := m.ix.len()
	w := int(float64(m.viewTo-m.viewFrom) * f)
	w = min(max(w, min(n, max(m.layout.timeline.w, 16))), n)
	m.viewFrom = min(max(m.cursor-w/2, 0), n-w)
	m.viewTo = m.viewFrom + w
	m.zoomed = w < n
}

// pan moves the zoomed timeline's window by half its width, taking the cursor along when it would fall out.
func (m *Model) pan(right bool) {
	n, w := m.ix.len(), m.viewTo-m.viewFrom
	d := max(w/2, 1)
	if !right {
		d = -d
	}
	m.viewFrom = min(max(m.viewFrom+d, 0), max(n-w, 0))
	m.viewTo = m.viewFrom + w
	if m.cursor < m.viewFrom || m.cursor >= m.viewTo {
		m.moveTo(min(max(m.cursor, m.viewFrom), m.viewTo-1))
	}
}

// nextBoundary returns the start of the next phase span (dir +1) or of the current or previous one (-1).
// Under checkpointing, backward alternates with the recomputation of each checkpointed block dozens of times
// an iteration: unless zoomed in, those spans are one stop.
func (m *Model) nextBoundary(dir int) int {
	spans := m.ix.spans()
	if len(spans) == 0 {
		return m.cursor
	}
	stop := func(j int) bool { return j == 0 || m.zoomed || !sameBackward(spans[j-1], spans[j]) }
	// The first span starting after the cursor.
	j := sort.Search(len(spans), func(j int) bool { return spans[j].Start > m.cursor })
	if dir > 0 {
		for ; j < len(spans); j++ {
			if stop(j) {
				return spans[j].Start
			}
		}
		return m.ix.len() - 1
	}
	for j--; j >= 0; j-- {
		if spans[j].Start < m.cursor && stop(j) {
			return spans[j].Start
		}
	}
	return 0
}

// sameBackward reports whether two spans in a row are one backward pass: backward and the recomputation of
// a checkpointed block inside it, in one iteration.
func sameBackward(a, b timeline.PhaseSpan) bool {
	bw := func(p snapshot.Phase) bool { return p == snapshot.PhaseBackward || p == snapshot.PhaseRecompute }
	return a.Iteration == b.Iteration && bw(a.Phase) && bw(b.Phase)
}

// nextIteration returns the next (+1) or previous (-1) iteration marker.
func (m *Model) nextIteration(dir int) int {
	it := m.ix.iters
	j, _ := slices.BinarySearch(it, m.cursor+1)
	if dir > 0 {
		if j < len(it) {
			return it[j]
		}
		return m.ix.len() - 1
	}
	j, _ = slices.BinarySearch(it, m.cursor)
	if j > 0 {
		return it[j-1]
	}
	return 0
}

// refreshPanes hands the panes what they show at the cursor.
func (m *Model) refreshPanes() {
	if m.ix == nil || m.ix.len() == 0 {
		return
	}
	live := m.ix.liveAt(m.cursor)
	var before []timeline.Allocation
	if m.prev != m.cursor && m.prev < m.ix.len() {
		before = m.ix.liveAtInOrder(m.prev)
	}
	m.live.setData(m.ix, m.cursor, live, before)
	m.cats.setData(live, m.ix.spanAt(m.cursor))
	m.segs.setData(m.ix, m.cursor)
	m.device.setData(m.ix, m.cursor)
}
