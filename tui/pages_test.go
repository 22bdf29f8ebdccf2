package tui

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// TestPagedRunAgreesWithTheWholeRun opens the same recording held whole and paged (a budget of one byte,
// pages of 300 events), and checks that the paged TUI lands where the whole one does, has the same spans,
// iterations, peak, OOM and leak verdict, and, wherever the cursor goes, shows the same memory, live set,
// categories and segments once it has read the pages around it back: whether no page keeps the State it
// starts from (every window is indexed from the run's start), some do, or all.
func TestPagedRunAgreesWithTheWholeRun(t *testing.T) {
	if _, err := fixtureData("tiny-oom"); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("testdata", "fixtures", "tiny-oom.oomdbg")
	open := func(t *testing.T, budget, states int64) *Model {
		m := New(context.Background(), Options{File: path, Profile: colorprofile.Ascii, MemoryBudget: budget, pageEvents: 300, stateBudget: states})
		m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
		drive(m, m.Init(), nil)
		if !m.load.done || m.load.err != nil {
			t.Fatalf("not loaded: %v", m.load.err)
		}
		return m
	}
	kept := func(m *Model) (n int) {
		for _, p := range m.ix.ov.pages {
			if p.kept {
				n++
			}
		}
		return n
	}
	for name, tc := range map[string]struct {
		states int64 // what the pages' States may take
		kept   func(n, pages int) bool
	}{
		"no State kept":    {1, func(n, _ int) bool { return n == 0 }},
		"some States kept": {64 << 10, func(n, pages int) bool { return n > 0 && n < pages-1 }},
		"every State kept": {1 << 30, func(n, pages int) bool { return n == pages-1 }}, // the first page starts from none
	} {
		t.Run(name, func(t *testing.T) {
			whole, paged := open(t, 0, 0), open(t, 1, tc.states)
			if whole.ix.ov != nil || paged.ix.ov == nil || len(paged.ix.ov.pages) < 5 {
				t.Fatalf("whole run paged: %v; paged run: %v (%d events)", whole.ix.ov != nil, paged.ix.ov != nil, whole.ix.len())
			}
			if n := kept(paged); !tc.kept(n, len(paged.ix.ov.pages)) {
				t.Fatalf("%d of %d pages keep their State", n, len(paged.ix.ov.pages))
			}
			agree(t, whole, paged)
		})
	}
}

// agree checks that a paged run agrees with the run held whole, wherever the cursor goes.
func agree(t *testing.T, whole, paged *Model) {
	t.Helper()
	if paged.ix.len() != whole.ix.len() || paged.ix.peak != whole.ix.peak || paged.ix.oom != whole.ix.oom ||
		!slices.Equal(paged.ix.iters, whole.ix.iters) || !slices.Equal(paged.ix.spans(), whole.ix.spans()) {
		t.Fatalf("paged: %d events, peak %d, OOM %d, %d spans; whole: %d, %d, %d, %d", paged.ix.len(), paged.ix.peak,
			paged.ix.oom, len(paged.ix.spans()), whole.ix.len(), whole.ix.peak, whole.ix.oom, len(whole.ix.spans()))
	}
	if paged.leaks.res == nil || paged.leaks.res.Reason != whole.leaks.res.Reason {
		t.Errorf("leaks paged: %v, whole: %v", paged.leaks.res, whole.leaks.res)
	}
	if paged.Cursor() != whole.Cursor() {
		t.Errorf("paged landed at %d, whole at %d", paged.Cursor(), whole.Cursor())
	}
	for _, keys := range [][]string{nil, {"g"}, {"}"}, {"]", "]"}, {"p"}, {"G"}, {"o", "["}, {"{", "{"}, {"L"}} {
		for _, m := range []*Model{whole, paged} {
			for _, k := range keys {
				_, cmd := m.Update(keyPress(k))
				drive(m, cmd, nil)
			}
		}
		c := whole.Cursor()
		if paged.ix.win != nil {
			t.Logf("after %v: event %d, window of pages [%d, %d) of %d, events [%d, %d), %d live blocks", keys, c, paged.ix.win.lo, paged.ix.win.hi, len(paged.ix.ov.pages), paged.ix.tl.Base(), paged.ix.tl.Len(), len(paged.live.rows))
		}
		if paged.Cursor() != c || !paged.ix.covers(c) {
			t.Fatalf("after %v: paged at %d (held: %v), whole at %d", keys, paged.Cursor(), paged.ix.covers(c), c)
		}
		for _, s := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
			if a, b := paged.ix.tl.Value(s, c), whole.ix.tl.Value(s, c); a != b {
				t.Errorf("after %v: %s %d paged, %d whole", keys, s, a, b)
			}
		}
		if !slices.Equal(asOfEvent(paged.live.rows), asOfEvent(whole.live.rows)) || paged.cats.now != whole.cats.now ||
			len(paged.segs.segs) != len(whole.segs.segs) {
			t.Errorf("after %v at event %d: the panes differ (%d and %d live blocks)", keys, c, len(paged.live.rows), len(whole.live.rows))
		}
	}
	// t draws time on the run held whole; the paged run says it keeps the events as columns.
	press(whole, "t")
	press(paged, "t")
	if !strings.Contains(whole.status, "x-axis: time, each column") || !strings.Contains(paged.status, "this one is paged") {
		t.Errorf("t: whole run says %q, paged run %q", whole.status, paged.status)
	}
}

// asOfEvent clears what a window does not know of blocks: their IDs and the frees after it.
func asOfEvent(bs []timeline.Allocation) []timeline.Allocation {
	out := slices.Clone(bs)
	for i := range out {
		out[i].ID, out[i].Free, out[i].Released = 0, 0, 0
	}
	return out
}

// TestLoadingEndsWithWhatStoppedIt opens a recording that has more events than the reader may hold, and
// the same recording cut in its last chunk: the TUI lands on the peak or the OOM of what it read, and the
// status line still says why the rest is missing.
func TestLoadingEndsWithWhatStoppedIt(t *testing.T) {
	data, err := fixtureData("tiny-oom")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	full := filepath.Join(dir, "full.oomdbg")
	cut := filepath.Join(dir, "cut.oomdbg")
	if err := os.WriteFile(full, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cut, data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	whole, err := snapshot.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		path string
		lim  snapshot.Limits
		want string
	}{
		"over the event limit": {full, snapshot.Limits{Events: uint64(whole.Events.Len() / 2)}, "too many events"},
		"cut short":            {cut, snapshot.Limits{}, "cut short"},
	} {
		m := New(context.Background(), Options{File: tc.path, Limits: tc.lim, Profile: colorprofile.Ascii})
		m.Update(tea.WindowSizeMsg{Width: 200, Height: 40})
		drive(m, m.Init(), nil)
		if !m.load.done || m.ix.len() == 0 || m.ix.len() >= whole.Events.Len() {
			t.Fatalf("%s: loaded %v, %d of %d events", name, m.load.done, m.ix.len(), whole.Events.Len())
		}
		if !m.statusIsError || !strings.Contains(m.status, tc.want) || !strings.Contains(screen(m), tc.want) {
			t.Errorf("%s: status %q (an error: %v), want it to say %q", name, m.status, m.statusIsError, tc.want)
		}
	}
}

// TestProgressFitsEightyColumns checks that the loading line keeps its figures (events, bytes, rate) on an
// 80-column terminal however long the file's path is: the path is what gets cut.
func TestProgressFitsEightyColumns(t *testing.T) {
	l := loadState{label: "reading /home/someone/runs/2025-06-01/gpt2-medium-checkpointed.oomdbg (paged: too long to hold whole)",
		started: time.Now().Add(-10 * time.Second), bytes: 140 << 20, size: 154 << 20}
	got := ansi.Truncate(l.progress(99_685_661), 80, "…")
	for _, want := range []string{"99,685,661 events", "140.00 MiB of 154.00 MiB", "10.0M events/s"} {
		if !strings.Contains(got, want) {
			t.Errorf("at 80 columns %q lacks %q", got, want)
		}
	}
}

// TestMovingWhileLoadingKeepsTheCursor streams a recording through a pipe, takes the cursor back to the
// start after the first chunk, and checks that the end of loading leaves it there, saying where the OOM is,
// where a user who waited lands on the OOM.
func TestMovingWhileLoadingKeepsTheCursor(t *testing.T) {
	data, err := fixtureData("tiny-oom")
	if err != nil {
		t.Fatal(err)
	}
	for _, move := range []bool{false, true} {
		r, w := io.Pipe()
		more := make(chan struct{})
		go func() {
			w.Write(data[:len(data)/3])
			<-more
			w.Write(data[len(data)/3:])
			w.Close()
		}()
		m := New(context.Background(), Options{File: "pipe", Input: r, Profile: colorprofile.Ascii})
		m.Update(tea.WindowSizeMsg{Width: 120, Height: 40})
		var moved bool
		drive(m, m.Init(), func(msg tea.Msg) bool {
			if _, ok := msg.(chunkMsg); ok && !moved && m.ix.len() > 0 {
				moved = true
				if move {
					m.Update(keyPress("home"))
				}
				close(more)
			}
			return false
		})
		if !m.load.done || m.load.err != nil || m.ix.oom < 0 {
			t.Fatalf("moved %v: loaded %v, err %v, OOM at %d", move, m.load.done, m.load.err, m.ix.oom)
		}
		switch {
		case move && (m.Cursor() != 0 || !strings.Contains(m.status, "o jumps to the OOM")):
			t.Errorf("moved to the start while loading: at event %d, status %q; want 0 and where the OOM is", m.Cursor(), m.status)
		case !move && m.Cursor() != m.ix.oom:
			t.Errorf("waited: at event %d, want the OOM at %d", m.Cursor(), m.ix.oom)
		}
	}
}
