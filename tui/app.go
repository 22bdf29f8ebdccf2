// Package tui is oomdbg's terminal interface: a timeline of allocated and reserved memory with phase bands,
// stepping by event, phase and iteration to the peak and the OOM, the live set with stacks and retainers,
// the bytes by category, the allocator's segments, the leaks, and fixes that re-run the workload and show the
// peak before and after. It works in any 80x24 terminal, over SSH, without a mouse or colour.
package tui

import (
	"context"
	"io"

	"charm.land/bubbles/v2/help"
	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"charm.land/lipgloss/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
)

// Options say what the TUI shows.
type Options struct {
	// Workload, when set, is recorded on start by Backend and streamed in as it runs.
	Workload *Workload
	// Backend records workloads (the one above, and the fixes pane's re-runs of oomdbg's own snapshots),
	// measures their fixes and finds the plans that fit. Nil: the fixes pane cannot re-run.
	Backend Backend
	// File, when set, is a snapshot to open; Follow keeps reading it as it grows. Input, when set, is File
	// already open (a pipe, standard input), read instead of opening File again.
	File   string
	Follow bool
	Input  io.Reader
	// Limits caps what reading File may take (the events held, and so the memory); zero fields keep the
	// snapshot package's defaults. A paged file is not capped in events: the TUI holds a window of it.
	Limits snapshot.Limits
	// Snapshot, when set, is shown as is (tests, imported files).
	Snapshot *snapshot.Snapshot
	// MemoryBudget is what a file's events and index may take in memory before the TUI pages it: holds a
	// window of it around the cursor, and an overview of the whole (0: DefaultMemoryBudget). A fix's re-run,
	// held whole, stops at it.
	MemoryBudget int64
	// pageEvents sets the events per page of a paged run (tests); 0 means pageEventsFor(MemoryBudget).
	pageEvents int
	// stateBudget sets what the pages' States may take (tests); 0 means an eighth of MemoryBudget.
	stateBudget int64
	// Profile is the terminal's colour profile (NO_COLOR gives Ascii).
	Profile colorprofile.Profile
	// Devices reads the GPUs for the device pane; nil shows that no reader is configured.
	Devices DeviceReader
	// Ranks, when set, are a data-parallel job's ranks side by side (oomdbg view with several files), File
	// one of them; the Ranks pane shows them and Load reads the one chosen.
	Ranks *triage.RankTable
	Load  func(path string) (*snapshot.Snapshot, error)
	// Watch, when set, follows a directory of snapshots a job is writing (watch.go).
	Watch *Watch
}

// pane names the panes under the timeline.
type pane int

const (
	paneLive pane = iota
	paneCategories
	paneSegments
	paneLeaks
	paneFixes
	paneDevice
	paneRanks // shown only for a job's ranks (Options.Ranks)
	numPanes
)

var paneNames = [numPanes]string{"Live", "Categories", "Segments", "Leaks", "Fixes", "Device", "Ranks"}

// paneShortNames name the panes where the tabs would not fit the width otherwise.
var paneShortNames = [numPanes]string{"Live", "Cats", "Segs", "Leaks", "Fixes", "Dev", "Ranks"}

// panes returns how many panes the tabs show: the Ranks pane only for a job's ranks.
func (m *Model) panes() pane {
	if m.ranks.table == nil {
		return paneRanks
	}
	return numPanes
}

// Model is the TUI's one root model.
type Model struct {
	ctx    context.Context
	opts   Options
	keys   KeyMap
	styles Styles
	help   help.Model

	width, height int
	layout        layout

	snap   *snapshot.Snapshot
	ix     *index
	stream *stream
	load   loadState

	cursor, prev   int // the event shown, and the one shown before the last move
	viewFrom       int // the timeline's window of events
	viewTo         int
	zoomed         bool
	pane           pane
	showHelp       bool
	helpScroll     scroller
	status         string
	statusIsError  bool
	landedOnTarget bool // the cursor was put on the OOM (or peak) once loading ended
	movedLoading   bool // the user moved the cursor while the snapshot loaded: it stays where they took it

	frame  frame // the last screen drawn
	footer struct {
		width int
		text  string
	} // the key help, made once per width
	banner string // the line under the title (banner.go); made by relayout

	timeline timelinePane
	live     livePane
	cats     categoriesPane
	segs     segmentsPane
	leaks    leaksPane
	fixes    fixesPane
	devices  deviceView
	device   devicePane
	ranks    ranksPane
	oomp     oomPanel
	watch    watchState
}

// New returns the model for opts.
func New(ctx context.Context, opts Options) *Model {
	m := &Model{ctx: ctx, opts: opts, keys: DefaultKeyMap(), styles: DefaultStyles(opts.Profile), help: help.New()}
	if opts.Profile <= colorprofile.Ascii { // the help's own styles carry colours
		plain := lipgloss.NewStyle()
		m.help.Styles = help.Styles{Ellipsis: plain, ShortKey: plain.Bold(true), ShortDesc: plain, ShortSeparator: plain,
			FullKey: plain.Bold(true), FullDesc: plain, FullSeparator: plain}
	}
	m.live.filter = newFilterInput()
	m.fixes = newFixesPane(opts.Workload, opts.Backend, opts.MemoryBudget)
	m.device = newDevicePane(opts.Devices)
	if opts.Ranks != nil {
		open := 0
		for i, r := range opts.Ranks.Ranks {
			if r.File == opts.File {
				open = i
			}
		}
		m.ranks = newRanksPane(opts.Ranks, opts.Load, open)
	}
	switch {
	case opts.Snapshot != nil:
		m.setSnapshot(opts.Snapshot)
		m.load = loadState{label: "snapshot", done: true}
		m.devices = deviceView{full: m.snap, devices: m.snap.DevicesWithMemory(), shown: -1}
		m.openOnFocusDevice()
		m.landOnTarget()
	case opts.Workload != nil:
		m.load.label = "recording " + opts.Workload.Name
	case opts.File != "":
		m.load.label = "reading " + opts.File
	case opts.Watch != nil:
		m.load.label = "waiting for a snapshot in " + opts.Watch.Dir
	}
	return m
}

// Init starts loading.
func (m *Model) Init() tea.Cmd {
	cmds := []tea.Cmd{m.device.refresh()}
	switch {
	case m.opts.Snapshot != nil:
		cmds = append(cmds, m.leaks.analyze(m.ix.tl), m.fixes.measure(m.ctx))
	case m.opts.Workload != nil:
		cmds = append(cmds, recordWorkload(m.ctx, m.opts.Backend, *m.opts.Workload))
	case m.opts.File != "":
		cmds = append(cmds, openFile(m.ctx, m.opts))
	}
	if m.opts.Watch != nil {
		cmds = append(cmds, m.onWatchTick())
	}
	return tea.Batch(cmds...)
}

// Update handles a message.
func (m *Model) Update(msg tea.Msg) (tea.Model, tea.Cmd) {
	drawn := m.frame.valid
	switch msg.(type) {
	case chunkMsg, indexMsg, pagedMsg: // loading redraws on its own clock
	default:
		m.frame.valid = false
	}
	if m.typing() { // the filter's own keys: a key that changes nothing (past its length) draws nothing
		switch msg.(type) {
		case tea.KeyPressMsg, tea.PasteMsg:
			cmd, changed := m.live.onFilterKey(msg)
			m.frame.valid = drawn && !changed
			return m, cmd
		}
	}
	switch msg := msg.(type) {
	case tea.WindowSizeMsg:
		m.width, m.height = msg.Width, msg.Height
		m.relayout()
		return m, nil
	case streamMsg:
		return m, m.onStream(msg)
	case chunkMsg:
		return m, m.onChunk(msg)
	case pagedMsg:
		return m, m.onPaged(msg)
	case windowMsg:
		m.onWindow(msg)
		if msg.err != nil {
			return m, nil
		}
		return m, m.ensureWindow() // the cursor may have moved on while the pages were read
	case indexMsg:
		return m, m.onIndex()
	case fixStreamMsg:
		return m, m.fixes.onStream(msg)
	case fixChunkMsg:
		return m, m.fixes.onChunk(msg)
	case fitPlansMsg:
		return m, m.apply(m.fixes.onFitPlans(msg))
	case traceFixesMsg:
		return m, m.apply(m.fixes.trace.onResult(msg))
	case traceFixShowMsg:
		cmd := m.apply(m.fixes.trace.onShow(msg))
		if msg.err == nil {
			m.timeline.after = m.fixes.afterIndex()
		}
		return m, cmd
	case fixResultMsg:
		if !m.fixes.onResult(msg) {
			return m, nil
		}
		m.fixes.reveal = true
		m.timeline.after = m.fixes.afterIndex()
		switch {
		case msg.err != nil:
			m.setStatus("re-run: "+msg.err.Error(), true)
		case m.fixes.after != nil:
			done := "re-run done: " + m.fixes.after.verdict()
			if l := m.fixes.after.leak; l != nil && m.leaks.res != nil && m.leaks.res.Verdict == leaks.Leak {
				done += "; " + leakWords(l)
			}
			m.setStatus(done+"; the • curve is the re-run, phase by phase", false)
		}
		return m, nil
	case measuredMsg:
		m.fixes.onMeasured(msg)
		m.fixes.onRanked()
		return m, nil
	case leaksMsg:
		m.leaks.onResult(msg)
		m.fixes.beforeLeak = msg.res
		m.relayout() // the banner takes a line
		return m, nil
	case deviceMsg:
		m.device.onReading(msg)
		return m, m.device.tick()
	case watchTickMsg:
		return m, m.onWatchTick()
	case watchMsg:
		return m, m.onWatch(msg)
	case rankMsg:
		return m, m.openRank(msg)
	case tea.KeyPressMsg:
		return m, tea.Batch(m.onKey(msg), m.ensureWindow())
	}
	return m, nil
}

// setSnapshot makes s the snapshot shown.
func (m *Model) setSnapshot(s *snapshot.Snapshot) { m.setIndex(newIndex(s)) }

// setIndex makes ix's snapshot the one shown.
func (m *Model) setIndex(ix *index) {
	m.snap, m.ix = ix.snap, ix
	m.oomp = oomPanel{} // the OOM, if any, is the new snapshot's
	m.viewFrom, m.viewTo = 0, m.ix.len()
	m.timeline.ix = m.ix
	m.fixes.setBaseline(m.ix)
	m.refreshPanes()
	m.relayout() // the banner may say something else of this snapshot
}

// landOnTarget puts the cursor on the OOM, else on the peak, once.
func (m *Model) landOnTarget() {
	if m.landedOnTarget || m.ix == nil || m.ix.len() == 0 {
		return
	}
	m.landedOnTarget = true
	if m.movedLoading { // the user went somewhere while it loaded: tell them where the targets are instead
		hint := "loaded: p jumps to the peak"
		if m.ix.oom >= 0 {
			hint = "loaded: o jumps to the OOM, p to the peak"
		}
		m.setStatus(hint, false)
		return
	}
	switch {
	case m.ix.oom >= 0:
		m.moveTo(m.ix.oom)
		why := "3 shows why"
		if kind, _ := m.ix.diagnoseOOM(m.ix.oom); kind != "" {
			why = kind + ": " + why
		}
		m.setStatus("landed on the OOM ("+why+"); o jumps back here, p to the peak", false)
	case m.ix.peak >= 0:
		m.moveTo(m.ix.peak)
		m.setStatus("landed on the peak: p jumps back here", false)
	}
	m.prev = m.cursor // the first stop has nothing before it to compare with
	m.refreshPanes()
}

// onKey handles a key press: global keys first, then the focused pane's.
func (m *Model) onKey(msg tea.KeyPressMsg) tea.Cmd {
	k := m.keys
	switch {
	case key.Matches(msg, k.Repaint): // wherever the keys go: another program may have drawn over any screen
		return tea.ClearScreen
	case m.showHelp:
		return m.onHelpKey(msg)
	case m.layout.tooSmall && !key.Matches(msg, k.Quit): // nothing to act on that can be seen
		return nil
	}
	switch {
	case key.Matches(msg, k.Quit):
		m.fixes.cancel()
		return tea.Quit
	case key.Matches(msg, k.Help):
		m.showHelp, m.helpScroll.top = true, 0
		return nil
	case key.Matches(msg, k.NextPane):
		m.pane = (m.pane + 1) % m.panes()
		return nil
	case key.Matches(msg, k.PrevPane):
		m.pane = (m.pane + m.panes() - 1) % m.panes()
		return nil
	case key.Matches(msg, k.Live, k.Categories, k.Segments, k.Leaks, k.Fixes, k.Device):
		m.pane = pane(msg.String()[0] - '1')
		return nil
	case key.Matches(msg, k.Ranks) && m.ranks.table != nil:
		m.pane = paneRanks
		return nil
	}
	if m.ix == nil || m.ix.len() == 0 {
		return nil
	}
	if key.Matches(msg, k.NextDevice) {
		if !m.nextDevice() {
			return nil
		}
		return m.leaks.analyze(m.ix.tl)
	}
	if m.onListKey(msg) {
		return nil
	}
	if cmd, handled := m.onNavigate(msg); handled {
		m.movedLoading = m.movedLoading || !m.load.done
		return cmd
	}
	return m.onPaneKey(msg)
}

// typing reports whether keys go to the live set's filter: it is focused, and neither the help nor the notice
// of a terminal too small covers it. A paste (bracketed paste, tea.PasteMsg) goes there too; elsewhere it is
// text nothing takes.
func (m *Model) typing() bool { return m.live.filtering() && !m.showHelp && !m.layout.tooSmall }

// onPaneKey gives a key to the focused pane.
func (m *Model) onPaneKey(msg tea.KeyPressMsg) tea.Cmd {
	switch m.pane {
	case paneLive:
		if m.showingOOM() { // any key of the list puts the panel away; esc only that
			m.oomp.hidden = true
			if key.Matches(msg, m.keys.Back) {
				return nil
			}
		}
		return m.apply(m.live.onKey(msg, m.keys, m.layout.pane.h))
	case paneSegments:
		m.segs.onKey(msg, m.keys, m.layout.pane.h)
	case paneLeaks:
		return m.apply(m.leaks.onKey(msg, m.keys, m.layout.pane.h))
	case paneFixes:
		return m.apply(m.fixes.onKey(m.ctx, msg, m.keys, m.layout.pane.h))
	case paneRanks:
		return m.apply(m.ranks.onKey(msg, m.keys, m.layout.pane.h))
	}
	return nil
}

// setStatus shows a message in the status bar.
func (m *Model) setStatus(s string, isErr bool) { m.status, m.statusIsError = s, isErr }

// Cursor returns the event the TUI shows (for tests and program-level checks).
func (m *Model) Cursor() int { return m.cursor }

// Pane returns the name of the pane shown under the timeline.
func (m *Model) Pane() string { return paneNames[m.pane] }
