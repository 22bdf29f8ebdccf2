package tui

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// stream is a snapshot arriving chunk by chunk: from a workload recording into a pipe, or from a file that
// may still be growing. The command that reads it owns snap; the model gets Views of it.
type stream struct {
	r     *snapshot.Reader
	snap  *snapshot.Snapshot // what was read so far
	close func()
	size  int64  // the file's size, 0 for a pipe or a file being followed
	pager *pager // set when the file is too long to hold whole: it is read page by page

	// The reader's goroutine hands its newest message over through latest, signalling ready.
	start  sync.Once
	mu     sync.Mutex
	latest tea.Msg
	ready  chan struct{}
}

// streamMsg says a stream has opened (or failed to).
type streamMsg struct {
	s    *stream
	meta snapshot.Meta
	err  error
}

// chunkMsg carries a View of what the stream has read so far; done when the stream ended.
type chunkMsg struct {
	snap  *snapshot.Snapshot
	bytes int64 // input read so far
	done  bool
	err   error
}

// indexMsg asks the model to go on indexing what it has read.
type indexMsg struct{}

// Loading runs in two goroutines, as fast as the reader reads: a command reads many chunks per message, and
// the model indexes what arrived in steps of at most indexBudget per Update, so keys are answered between
// them. Panes and the screen are brought up to date at most every refreshEvery while loading.
const (
	readBudget   = 20 * time.Millisecond
	indexBudget  = 8 * time.Millisecond
	refreshEvery = 100 * time.Millisecond
)

// recordWorkload starts b recording w into a pipe and opens the pipe's other end.
func recordWorkload(ctx context.Context, b Backend, w Workload) tea.Cmd {
	return func() tea.Msg {
		if b == nil {
			return streamMsg{err: fmt.Errorf("recording %s: no workload runner", w.Name)}
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(b.Record(ctx, w, pw)) }()
		r, err := snapshot.NewReader(pr)
		if err != nil {
			pr.CloseWithError(err)
			return streamMsg{err: fmt.Errorf("recording %s: %w", w.Name, err)}
		}
		return streamMsg{s: &stream{r: r, snap: &snapshot.Snapshot{}, close: func() { pr.Close() }}, meta: r.Meta()}
	}
}

// openFile opens the snapshot file of opts (or reads opts.Input); with opts.Follow, it keeps reading as the
// file grows until its end chunk. A file whose events, judged from its chunk headers, would take more than
// opts.MemoryBudget held whole is paged.
func openFile(ctx context.Context, opts Options) tea.Cmd {
	return func() tea.Msg {
		path := opts.File
		budget := cmp.Or(opts.MemoryBudget, DefaultMemoryBudget)
		var size, events int64
		if f, err := os.Open(path); err == nil {
			if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() && !opts.Follow {
				size = fi.Size()
				events, _ = snapshot.EstimateEvents(f, size)
			}
			f.Close()
		}
		paged := size > 0 && events*residentPerEvent > budget
		in, closeIn := opts.Input, func() {}
		if in == nil {
			f, err := os.Open(path)
			if err != nil {
				return streamMsg{err: err}
			}
			in, closeIn = f, func() { f.Close() }
		}
		lim := opts.Limits
		if paged {
			lim.Events = snapshot.MaxEvents // memory is bounded by the window, not by the run
		}
		ropts := []snapshot.ReaderOption{snapshot.WithLimits(lim)}
		if opts.Follow {
			ropts = append(ropts, snapshot.WithFollow(ctx, 200*time.Millisecond))
		}
		r, err := snapshot.NewReader(in, ropts...)
		if err != nil {
			closeIn()
			return streamMsg{err: fmt.Errorf("%s: %w", path, err)}
		}
		s := &stream{r: r, snap: &snapshot.Snapshot{}, close: closeIn, size: size}
		switch {
		case paged:
			s.pager = &pager{s: &snapshot.Snapshot{}, leaks: leaks.NewStream(), pageEvents: cmp.Or(opts.pageEvents, pageEventsFor(budget)),
				expected: events, stateBudget: cmp.Or(opts.stateBudget, budget/8)}
			s.pager.s.Events.Forget(0) // read page by page
		case events > 0:
			s.snap.Events.Grow(int(events + events/32)) // room for all, so that the columns are not copied
		}
		return streamMsg{s: s, meta: r.Meta()}
	}
}

// nextChunk returns what the stream has read since the last call, waiting for something if need be. The
// first call starts the reader, which reads on to the end of the stream in a goroutine of its own: it does
// not wait for the model to take what it read, so reading and indexing run side by side.
func nextChunk(s *stream) tea.Cmd {
	return func() tea.Msg {
		s.start.Do(func() {
			s.ready = make(chan struct{}, 1)
			go s.readAhead(s.readChunks)
		})
		return s.take()
	}
}

// readChunks reads the stream's next chunks: for a file, as many as arrive within readBudget; for a pipe or
// a file being followed, one, since the next may take the writer a while. It reports whether the stream
// ended.
func (s *stream) readChunks() (tea.Msg, bool) {
	start := time.Now()
	for {
		err := s.r.ReadInto(s.snap)
		if err != nil {
			s.close()
			msg := chunkMsg{snap: s.snap.View(), bytes: s.r.Offset(), done: true}
			if !errors.Is(err, io.EOF) {
				msg.err = err
			}
			return msg, true
		}
		if s.size == 0 || time.Since(start) >= readBudget {
			return chunkMsg{snap: s.snap.View(), bytes: s.r.Offset()}, false
		}
	}
}

// readAhead calls read until it reports the end, keeping its messages for take: a message not taken yet is
// merged into the next, which for chunks means replaced (each says all that was read so far) and for pages
// means added to.
func (s *stream) readAhead(read func() (tea.Msg, bool)) {
	for {
		msg, done := read()
		s.mu.Lock()
		if old, ok := s.latest.(pagedMsg); ok {
			p := msg.(pagedMsg)
			p.pages = append(old.pages, p.pages...)
			msg = p
		}
		s.latest = msg
		s.mu.Unlock()
		select {
		case s.ready <- struct{}{}:
		default: // a signal is pending: it will find this message
		}
		if done {
			return
		}
	}
}

// take waits for the reader's newest message and takes it.
func (s *stream) take() tea.Msg {
	for {
		<-s.ready
		s.mu.Lock()
		msg := s.latest
		s.latest = nil
		s.mu.Unlock()
		if msg != nil {
			return msg
		}
	}
}

// loadState is how far loading has come.
type loadState struct {
	label    string // what is loading
	done     bool   // the stream ended and every event was indexed
	readDone bool   // the stream ended
	err      error

	started     time.Time
	bytes, size int64 // input read so far, and its size when known
	reading     bool  // a read is in flight
	indexing    bool  // an indexMsg is in flight
	refreshed   time.Time
	endErr      error // how the stream ended, reported once every event is indexed
}

// progress says how far loading has come: events, bytes and the rate, then what is loading, so that the
// figures fit 80 columns and a long path is what gets cut.
func (l *loadState) progress(indexed int) string {
	s := fmt.Sprintf("%s events", groupDigits(int64(indexed)))
	if l.size > 0 {
		s += fmt.Sprintf(", %s of %s", units.FormatSize(l.bytes), units.FormatSize(l.size))
	} else if l.bytes > 0 {
		s += ", " + units.FormatSize(l.bytes)
	}
	if el := time.Since(l.started).Seconds(); el > 0.2 && indexed > 0 {
		s += fmt.Sprintf(", %.1fM events/s", float64(indexed)/el/1e6)
	}
	return s + " · " + l.label
}

// onStream starts reading an opened stream.
func (m *Model) onStream(msg streamMsg) tea.Cmd {
	if msg.err != nil {
		m.load.err, m.load.done = msg.err, true
		m.setStatus(msg.err.Error(), true)
		return nil
	}
	m.stream = msg.s
	m.load.started, m.load.size = time.Now(), msg.s.size
	if msg.s.pager != nil {
		m.load.label += " (paged: too long to hold whole)"
		m.setIndex(newPagedIndex(&snapshot.Snapshot{Meta: msg.meta}))
	} else {
		m.setSnapshot(&snapshot.Snapshot{Meta: msg.meta})
	}
	return m.readMore()
}

// readMore asks for the stream's next chunks.
func (m *Model) readMore() tea.Cmd {
	m.load.reading = true
	if m.stream.pager != nil {
		return nextPages(m.stream)
	}
	return nextChunk(m.stream)
}

// onChunk takes what the stream read: the reader goes on at once, and the model indexes it in steps.
func (m *Model) onChunk(msg chunkMsg) tea.Cmd {
	*m.snap = *msg.snap
	m.load.reading, m.load.bytes = false, msg.bytes
	var cmds []tea.Cmd
	if msg.done {
		m.load.readDone, m.load.endErr = true, msg.err
	} else {
		cmds = append(cmds, m.readMore())
	}
	if !m.load.indexing {
		cmds = append(cmds, m.onIndex())
	}
	return tea.Batch(cmds...)
}

// onIndex indexes what was read for at most indexBudget, and asks for more time while some is left.
func (m *Model) onIndex() tea.Cmd {
	m.load.indexing = false
	// The cursor follows the stream until the user moves it, and again once they take it back to the end.
	follow := !m.movedLoading || m.cursor >= m.ix.len()-1
	start := time.Now()
	for m.ix.behind() > 0 && time.Since(start) < indexBudget {
		m.ix.extendTo(m.ix.len() + 1<<15)
	}
	caughtUp := m.ix.behind() == 0
	if caughtUp && m.load.readDone {
		return m.loaded()
	}
	if time.Since(m.load.refreshed) >= refreshEvery {
		m.load.refreshed = time.Now()
		if !m.zoomed {
			m.viewFrom, m.viewTo = 0, m.ix.len()
		}
		if follow && m.ix.len() > 0 {
			m.moveTo(m.ix.len() - 1)
		}
	}
	if caughtUp {
		return nil // the next chunk brings more
	}
	m.load.indexing = true
	return func() tea.Msg { return indexMsg{} }
}

// loaded ends loading: the panes come to the OOM (or the peak) and the leaks are looked for.
func (m *Model) loaded() tea.Cmd {
	m.load.done, m.frame.valid = true, false
	if !m.zoomed {
		m.viewFrom, m.viewTo = 0, m.ix.len()
	}
	if m.cursor >= m.ix.len()-2 && m.ix.len() > 0 {
		m.moveTo(m.ix.len() - 1)
	}
	m.devices = deviceView{full: m.snap, devices: m.snap.DevicesWithMemory(), shown: -1}
	m.fixes.setBaseline(m.ix)
	if !m.movedLoading {
		m.openOnFocusDevice()
	}
	m.landOnTarget()
	// What ended the reading outlasts the landing's message: events it never read are not on the screen.
	switch {
	case m.load.endErr != nil:
		m.load.err = m.load.endErr
		m.setStatus(fmt.Sprintf("read %d events; then: %v", m.ix.len(), m.load.endErr), true)
	case m.snap.Warning != nil:
		m.setStatus(m.snap.Warning.Error(), true)
	}
	m.refreshPanes()
	cmds := []tea.Cmd{m.fixes.measure(m.ctx), m.repaintAfterPipe()}
	if m.ix.ov == nil { // a paged run's leaks were analyzed as it was read
		cmds = append(cmds, m.leaks.analyze(m.ix.tl))
	}
	return tea.Batch(cmds...)
}

// repaintAfterPipe draws the whole screen again once a pipe's writer is done: oomdbg run -o - | oomdbg view -
// shares the terminal with run, which writes its summary on it as it ends, over the TUI; the pipe ends
// only once run has exited, so the summary is there to draw over.
func (m *Model) repaintAfterPipe() tea.Cmd {
	if m.stream == nil || m.stream.size > 0 || m.opts.File == "" || m.opts.Follow {
		return nil // a regular file, a workload the TUI records itself, or a file another shell grows
	}
	return tea.ClearScreen
}

// groupDigits prints n with thousands separators: 12,345,678.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
