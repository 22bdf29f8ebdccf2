package tui

import (
	"errors"
	"io"
	"slices"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// A snapshot too long to hold event by event is paged, as memray pages a long capture: it is read once, page
// by page, each page indexed (its Timeline resumed from the State the page before ended in), summed up into
// an overview of the whole run that stays in memory, and kept compressed with the State it starts from. The
// TUI holds a window of a few pages around the cursor, indexed again from their State when the cursor goes
// elsewhere; the timeline, the phases, the iterations, the peak, the OOM and the leaks always come from the
// overview.

// DefaultMemoryBudget is what a snapshot's events and index may take in memory before the TUI pages them.
const DefaultMemoryBudget = 1 << 30

const (
	// residentPerEvent is what an event of a training loop and its index take when held whole, with room for
	// the garbage collector.
	residentPerEvent = load.CostView
	pageEvents       = 1 << 20 // events per page at most, unless Options say otherwise
	minPageEvents    = 1 << 12 // events per page at least: the overview keeps a summary of each
	windowPages      = 3       // pages held around the cursor
	bucketEvents     = 1 << 10 // events per column of the overview's memory series
)

// pageEventsFor returns the events per page of a run paged within budget: the window and the one the cursor
// leaves, held together while the new one is indexed, take at most half of it, so that the overview, the
// compressed pages and the reading have the rest. A window of a million-event page each side would hold
// 3M events, some 200 MB, whatever --max-memory says.
func pageEventsFor(budget int64) int {
	n := budget / residentPerEvent / (2 * 2 * windowPages)
	return int(min(max(n, minPageEvents), pageEvents))
}

// page is a run of events kept compressed, and the State the indexing pass was in before its first when the
// page keeps it. A State is the live set, some 100 KB in a training loop: kept for every small page of a
// long run it would outweigh the pages, so a page keeps one only while the States kept stay within their
// share of the budget, and a window that starts on a page without one indexes the pages before it again,
// one at a time, from the last page that keeps one.
type page struct {
	from, to int
	data     []byte
	state    timeline.State
	kept     bool // state is the page's
	first    bool // the run's first page, which no State comes before
}

// resumable reports whether the page's events can be indexed on their own: it is the first, or keeps its State.
func (p *page) resumable() bool { return p.first || p.kept }

// overview is what stays in memory of a paged run: its shape, its memory in buckets, its peaks, and its pages.
type overview struct {
	n          int // events indexed
	phases     []timeline.PhaseSpan
	iterations []timeline.IterationSpan
	ooms       []int
	samples    []sample
	buckets    [2][]timeline.Extent // allocated and reserved over each bucketEvents events
	unused     []int64              // the highest reserved-but-unallocated bytes of each bucket
	peakAlloc  timeline.Peak
	peakRes    timeline.Peak
	pages      []page
	tables     *snapshot.Snapshot // the run's tables and footer, and a View of its events' rows
	baseline   runSummary         // what the fixes pane compares with
}

// sample is a device reading (the device pane shows the last one at the cursor).
type sample struct {
	seq   int
	bytes int64
	text  snapshot.StringID
}

// pagedMsg carries the pages the reader indexed since the last message and what they add to the overview.
type pagedMsg struct {
	pages  []pageSummary
	tables *snapshot.Snapshot
	bytes  int64
	done   bool
	err    error
	leaks  *leaks.Result
}

// pageSummary is a page and what it adds to the overview.
type pageSummary struct {
	page
	phases     []timeline.PhaseSpan
	iterations []timeline.IterationSpan
	ooms       []int
	samples    []sample
	buckets    [2][]timeline.Extent // from the bucket holding the page's first event
	unused     []int64
	peakAlloc  timeline.Peak
	peakRes    timeline.Peak
	peakCats   [snapshot.NumCategories]int64 // allocated bytes by category at peakAlloc
	forward    int                           // allocations in the forward phase
	recompute  int                           // and in the recompute phase
}

// pager reads a paged run: the command that reads owns it.
type pager struct {
	s          *snapshot.Snapshot // the run as read so far: its tables, and the events of the page being filled
	state      *timeline.State
	leaks      *leaks.Stream
	pageEvents int
	// The States the pages keep take at most stateBudget over the expected events, pro rata: those of the
	// first half of the run at most half of it.
	expected    int64
	stateBudget int64
	stateBytes  int64
}

// keepState reports whether the page that ends at event to keeps st, the State it starts from, and counts
// it when it does.
func (p *pager) keepState(st *timeline.State, to int) bool {
	share := p.stateBudget * int64(to) / max(p.expected, int64(to), 1)
	if p.stateBytes+st.Bytes() > share {
		return false
	}
	p.stateBytes += st.Bytes()
	return true
}

// nextPages returns the pages the stream has read and indexed since the last call, waiting for one if need
// be: like nextChunk, the first call starts a reader that goes on to the end of the stream.
func nextPages(s *stream) tea.Cmd {
	return func() tea.Msg {
		s.start.Do(func() {
			s.ready = make(chan struct{}, 1)
			go s.readAhead(s.readPages)
		})
		return s.take()
	}
}

// readPages reads and indexes pages for at least readBudget, or one page, whichever is longer, and reports
// whether the stream ended.
func (s *stream) readPages() (tea.Msg, bool) {
	p := s.pager
	start := time.Now()
	var msg pagedMsg
	for {
		err := s.r.ReadInto(p.s)
		held := p.s.Events.Len() - p.s.Events.Base()
		if held > 0 && (held >= p.pageEvents || err != nil) {
			msg.pages = append(msg.pages, p.index())
		}
		if err != nil {
			s.close()
			msg.done = true
			if !errors.Is(err, io.EOF) {
				msg.err = err
			}
			msg.leaks = p.leaks.Result(p.s)
			// What reading held, the last pages the leak analysis kept and the page being filled, is
			// garbage once the run is read: the overview and the window are what stay.
			p.leaks, p.state = nil, nil
		}
		if err != nil || len(msg.pages) > 0 && time.Since(start) >= readBudget {
			msg.tables, msg.bytes = p.s.View(), s.r.Offset()
			return msg, err != nil
		}
	}
}

// index indexes the events read since the last page, as a page of their own.
func (p *pager) index() pageSummary {
	view := p.s.View()
	var tl *timeline.Timeline
	pg := page{from: view.Events.Base(), to: view.Events.Len()}
	if p.state == nil {
		tl, pg.first = timeline.New(view), true
	} else {
		tl = timeline.Resume(view, *p.state)
		if p.keepState(p.state, pg.to) {
			pg.state, pg.kept = *p.state, true
		}
	}
	pg.data = view.Events.Page(pg.from, pg.to)
	p.leaks.Observe(tl)
	st := tl.State()
	p.state = &st
	p.s.Events.Forget(pg.to)

	ps := pageSummary{page: pg, phases: tl.Phases(), iterations: tl.Iterations(), ooms: tl.OOMs(),
		peakAlloc: tl.Peak(timeline.Allocated), peakRes: tl.Peak(timeline.Reserved)}
	for _, seq := range tl.Samples() {
		e := view.Events.At(seq)
		ps.samples = append(ps.samples, sample{seq: seq, bytes: e.Size, text: e.Text})
	}
	for k, s := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
		for b := pg.from / bucketEvents * bucketEvents; b < pg.to; b += bucketEvents {
			ps.buckets[k] = append(ps.buckets[k], tl.Range(s, b, b+bucketEvents))
		}
	}
	for b := pg.from / bucketEvents * bucketEvents; b < pg.to; b += bucketEvents {
		ps.unused = append(ps.unused, tl.UnallocatedMax(max(b, pg.from), b+bucketEvents))
	}
	if ps.peakAlloc.Seq >= 0 {
		ps.peakCats = byCategory(tl.LiveAt(ps.peakAlloc.Seq, nil))
	}
	ps.forward, ps.recompute = forwardAllocs(view.Events.Actions(), pg.from, ps.phases)
	return ps
}

// add takes what a page adds to the overview: the page, its spans pieced onto those before, its buckets
// merged with the one the page before ended in.
func (ov *overview) add(ps pageSummary) {
	ov.n = ps.to
	ov.pages = append(ov.pages, ps.page)
	for _, p := range ps.phases {
		if l := len(ov.phases) - 1; l >= 0 && ov.phases[l].End == p.Start && ov.phases[l].Phase == p.Phase && ov.phases[l].Iteration == p.Iteration {
			ov.phases[l].End, ov.phases[l].After = p.End, p.After
			continue
		}
		ov.phases = append(ov.phases, p)
	}
	for _, it := range ps.iterations {
		if l := len(ov.iterations) - 1; l >= 0 && ov.iterations[l].End == it.Start && ov.iterations[l].Iteration == it.Iteration {
			ov.iterations[l].End = it.End
			continue
		}
		ov.iterations = append(ov.iterations, it)
	}
	ov.ooms = append(ov.ooms, ps.ooms...)
	ov.samples = append(ov.samples, ps.samples...)
	for k := range ov.buckets {
		b := ps.buckets[k]
		if n := len(ov.buckets[k]); n > 0 && ps.from%bucketEvents != 0 && len(b) > 0 {
			last := &ov.buckets[k][n-1]
			last.Min, last.Max = min(last.Min, b[0].Min), max(last.Max, b[0].Max)
			b = b[1:]
		}
		ov.buckets[k] = append(ov.buckets[k], b...)
	}
	u := ps.unused
	if n := len(ov.unused); n > 0 && ps.from%bucketEvents != 0 && len(u) > 0 {
		ov.unused[n-1] = max(ov.unused[n-1], u[0])
		u = u[1:]
	}
	ov.unused = append(ov.unused, u...)
	if ps.peakAlloc.Seq >= 0 && (ov.peakAlloc.Seq < 0 || ps.peakAlloc.Bytes > ov.peakAlloc.Bytes) {
		ov.peakAlloc = ps.peakAlloc
		ov.baseline.peakAlloc, ov.baseline.atPeak = ps.peakAlloc.Bytes, ps.peakCats
	}
	if ps.peakRes.Seq >= 0 && (ov.peakRes.Seq < 0 || ps.peakRes.Bytes > ov.peakRes.Bytes) {
		ov.peakRes = ps.peakRes
	}
	ov.baseline.peakRes = ov.peakRes.Bytes
	ov.baseline.forward += ps.forward
	ov.baseline.recompute += ps.recompute
}

// extent returns the lowest and highest value of series k (0 allocated, 1 reserved) over the buckets under
// events [from, to): never less than the events' own, so no peak hides, more by what shares their buckets.
func (ov *overview) extent(k, from, to int) timeline.Extent {
	b := ov.buckets[k]
	lo, hi := from/bucketEvents, min((to+bucketEvents-1)/bucketEvents, len(b))
	if lo >= hi {
		return timeline.Extent{}
	}
	e := b[lo]
	for _, x := range b[lo+1 : hi] {
		e.Min, e.Max = min(e.Min, x.Min), max(e.Max, x.Max)
	}
	return e
}

// unallocated returns the highest reserved-but-unallocated bytes over the buckets under events [from, to).
func (ov *overview) unallocated(from, to int) int64 {
	lo, hi := from/bucketEvents, min((to+bucketEvents-1)/bucketEvents, len(ov.unused))
	if lo >= hi {
		return 0
	}
	return slices.Max(ov.unused[lo:hi])
}

// window is the pages held in memory: a Timeline of their events, resumed from the first one's State.
type window struct {
	lo, hi int // pages [lo, hi)
	tl     *timeline.Timeline
}

// windowMsg is a window indexed, or the error that stopped it.
type windowMsg struct {
	w   *window
	err error
}

// loadWindow indexes pages [lo, hi) of the overview again, in a command: the events come back from the
// pages, and the Timeline resumes from the State the first page starts from, found by indexing the pages
// before it again, one at a time, from the last that keeps its State.
func loadWindow(ov *overview, lo, hi int) tea.Cmd {
	from := lo
	for from > 0 && !ov.pages[from].resumable() {
		from--
	}
	pages := slices.Clone(ov.pages[from:hi])
	tables := ov.tables
	return func() tea.Msg {
		var st *timeline.State
		if !pages[0].first {
			st = &pages[0].state
		}
		for _, p := range pages[:lo-from] {
			tl, err := indexPages(tables, st, p)
			if err != nil {
				return windowMsg{err: err}
			}
			next := tl.State()
			st = &next
		}
		tl, err := indexPages(tables, st, pages[lo-from:]...)
		if err != nil {
			return windowMsg{err: err}
		}
		return windowMsg{w: &window{lo: lo, hi: hi, tl: tl}}
	}
}

// indexPages reads pages back and indexes them, resumed from st (nil: from the run's start).
func indexPages(tables *snapshot.Snapshot, st *timeline.State, pages ...page) (*timeline.Timeline, error) {
	data := make([][]byte, len(pages))
	for i, p := range pages {
		data[i] = p.data
	}
	evs, err := tables.Events.LoadPage(data...)
	if err != nil {
		return nil, err
	}
	s := *tables
	s.Events = evs
	if st == nil {
		return timeline.New(&s), nil
	}
	return timeline.Resume(&s, *st), nil
}

// windowFor returns the pages a window around event seq holds.
func (ov *overview) windowFor(seq int) (lo, hi int) {
	i, _ := slices.BinarySearchFunc(ov.pages, seq, func(p page, seq int) int {
		switch {
		case seq < p.from:
			return 1
		case seq >= p.to:
			return -1
		}
		return 0
	})
	i = min(i, len(ov.pages)-1)
	lo = max(i-windowPages/2, 0)
	hi = min(lo+windowPages, len(ov.pages))
	return max(hi-windowPages, 0), hi
}

// onPaged takes the pages the reader indexed.
func (m *Model) onPaged(msg pagedMsg) tea.Cmd {
	ov := m.ix.ov
	for _, ps := range msg.pages {
		ov.add(ps)
	}
	ov.tables = msg.tables
	m.snap = msg.tables
	m.ix.snap = msg.tables
	m.ix.refresh()
	m.load.reading, m.load.bytes = false, msg.bytes
	if !msg.done {
		if !m.zoomed {
			m.viewFrom, m.viewTo = 0, m.ix.len()
		}
		if m.cursor >= m.ix.len()-m.stream.pager.pageEvents-1 && m.ix.len() > 0 && time.Since(m.load.refreshed) >= refreshEvery {
			m.load.refreshed = time.Now()
			m.moveTo(m.ix.len() - 1)
		}
		return m.readMore()
	}
	m.load.readDone, m.load.endErr = true, msg.err
	cmd := m.loaded()
	m.leaks.onResult(leaksMsg{msg.leaks})
	m.relayout() // the banner takes a line
	return tea.Batch(cmd, m.ensureWindow())
}

// onWindow takes a window the command indexed.
func (m *Model) onWindow(msg windowMsg) {
	m.ix.loading = false
	if msg.err != nil {
		m.setStatus("reading pages back: "+msg.err.Error(), true)
		return
	}
	m.ix.win = msg.w
	m.ix.tl = msg.w.tl
	m.refreshPanes()
}

// ensureWindow asks for the pages around the cursor when the window does not hold it.
func (m *Model) ensureWindow() tea.Cmd {
	ix := m.ix
	if ix == nil || ix.ov == nil || ix.loading || len(ix.ov.pages) == 0 || ix.covers(m.cursor) {
		return nil
	}
	lo, hi := ix.ov.windowFor(m.cursor)
	ix.loading = true
	return loadWindow(ix.ov, lo, hi)
}
