package tui

import (
	"path/filepath"
	"time"

	tea "charm.land/bubbletea/v2"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Watch follows a directory that a running job writes snapshots into (oomdbg record's): the TUI shows the
// newest and moves to each newer one as it appears, landing on its out-of-memory error, or its peak.
type Watch struct {
	Dir string
	// Newest names the snapshot to show now and when it was written; ok is false while there is none.
	Newest func() (path string, written time.Time, ok bool)
	// Load reads a snapshot.
	Load func(path string) (*snapshot.Snapshot, error)
	// Every is how often Dir is looked at (0: every second).
	Every time.Duration
}

// watchState is what the TUI follows of a Watch.
type watchState struct {
	shown   string
	written time.Time
	loading bool
}

type (
	watchTickMsg struct{}
	watchMsg     struct {
		path    string
		written time.Time
		s       *snapshot.Snapshot
		err     error
	}
)

// watchTick looks at the directory again after the Watch's period.
func (m *Model) watchTick() tea.Cmd {
	every := m.opts.Watch.Every
	if every <= 0 {
		every = time.Second
	}
	return tea.Tick(every, func(time.Time) tea.Msg { return watchTickMsg{} })
}

// onWatchTick loads the newest snapshot when it is not the one shown.
func (m *Model) onWatchTick() tea.Cmd {
	w := m.opts.Watch
	path, written, ok := w.Newest()
	if !ok || m.watch.loading || path == m.watch.shown && written.Equal(m.watch.written) {
		return m.watchTick()
	}
	m.watch.loading = true
	load := w.Load
	return func() tea.Msg {
		s, err := load(path)
		return watchMsg{path: path, written: written, s: s, err: err}
	}
}

// onWatch shows a newly written snapshot in place of the one shown.
func (m *Model) onWatch(msg watchMsg) tea.Cmd {
	m.watch.loading = false
	m.watch.shown, m.watch.written = msg.path, msg.written
	if msg.err != nil {
		m.setStatus(msg.err.Error(), true)
		return m.watchTick()
	}
	m.opts.File = msg.path
	m.fixes = newFixesPane(nil, m.opts.Backend, m.opts.MemoryBudget)
	m.landedOnTarget, m.movedLoading, m.zoomed, m.cursor, m.prev = false, false, false, 0, 0
	m.setSnapshot(msg.s)
	m.load = loadState{label: "snapshot", done: true}
	m.devices = deviceView{full: m.snap, devices: m.snap.DevicesWithMemory(), shown: -1}
	m.landOnTarget()
	m.setStatus("following "+m.opts.Watch.Dir+": showing "+filepath.Base(msg.path), false)
	return tea.Batch(m.leaks.analyze(m.ix.tl), m.watchTick())
}
