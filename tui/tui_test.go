package tui

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"
	"github.com/charmbracelet/x/ansi"
	"github.com/charmbracelet/x/exp/golden"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/tracer/nvml"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func noDriver() nvml.Report {
	return nvml.Report{Err: fmt.Errorf("%w (libnvidia-ml.so.1 could not be loaded); GPU readings are unavailable", nvml.ErrNoDriver)}
}

// newTestModel returns a model showing s at w x h, with device readings answered without a driver.
func newTestModel(t testing.TB, s *snapshot.Snapshot, w, h int) *Model {
	t.Helper()
	m := New(context.Background(), Options{Snapshot: s, Backend: playback{}, Profile: colorprofile.Ascii, Devices: noDriver})
	m.Update(tea.WindowSizeMsg{Width: w, Height: h})
	m.Update(deviceMsg{noDriver()})
	m.Update(m.leaks.analyze(m.ix.tl)()) // as Init's commands would
	run(m, m.fixes.measure(m.ctx))
	return m
}

// run runs cmd and the commands its messages lead to, as the program would, one at a time.
func run(m *Model, cmd tea.Cmd) { runEach(m, cmd, nil) }

// runEach is run, calling seen after each message is handled.
func runEach(m *Model, cmd tea.Cmd, seen func(tea.Msg)) {
	if cmd == nil {
		return
	}
	switch msg := cmd().(type) {
	case tea.BatchMsg:
		for _, c := range msg {
			runEach(m, c, seen)
		}
	default:
		_, next := m.Update(msg)
		if seen != nil {
			seen(msg)
		}
		runEach(m, next, seen)
	}
}

// pressRun presses keys and runs what they start (re-runs, measurements) to the end.
func pressRun(m *Model, keys ...string) {
	for _, k := range keys {
		_, cmd := m.Update(keyPress(k))
		run(m, cmd)
	}
}

// press sends keys as a user types them: "right", "p", "space", ...
func press(m *Model, keys ...string) {
	for _, k := range keys {
		m.Update(keyPress(k))
	}
}

func keyPress(k string) tea.KeyPressMsg {
	switch k {
	case "right":
		return tea.KeyPressMsg{Code: tea.KeyRight}
	case "left":
		return tea.KeyPressMsg{Code: tea.KeyLeft}
	case "up":
		return tea.KeyPressMsg{Code: tea.KeyUp}
	case "down":
		return tea.KeyPressMsg{Code: tea.KeyDown}
	case "enter":
		return tea.KeyPressMsg{Code: tea.KeyEnter}
	case "esc":
		return tea.KeyPressMsg{Code: tea.KeyEscape}
	case "tab":
		return tea.KeyPressMsg{Code: tea.KeyTab}
	case "space":
		return tea.KeyPressMsg{Code: tea.KeySpace, Text: " "}
	case "backspace":
		return tea.KeyPressMsg{Code: tea.KeyBackspace}
	case "pgdown":
		return tea.KeyPressMsg{Code: tea.KeyPgDown}
	case "pgup":
		return tea.KeyPressMsg{Code: tea.KeyPgUp}
	case "ctrl+d":
		return tea.KeyPressMsg{Code: 'd', Mod: tea.ModCtrl}
	case "home":
		return tea.KeyPressMsg{Code: tea.KeyHome}
	case "end":
		return tea.KeyPressMsg{Code: tea.KeyEnd}
	}
	r := []rune(k)[0]
	return tea.KeyPressMsg{Code: r, Text: k}
}

// screen draws the screen, without its styles. Tests that change a pane directly, not through Update, draw
// it anew.
func screen(m *Model) string {
	m.frame.valid = false
	return ansi.Strip(m.View().Content)
}

func TestViews(t *testing.T) {
	sizes := []struct{ w, h int }{{80, 24}, {160, 48}}
	// The screens a newcomer meets first are drawn below the smallest size too, where a notice says so.
	small := []string{"oom-live", "oom-help", "oom-fixes-applied"}
	views := []struct {
		name    string
		fixture string
		keys    []string
		run     bool // run what the keys start (re-runs) to the end
	}{
		{"oom-live", "tiny-oom", nil, false},
		{"oom-list", "tiny-oom", []string{"esc"}, false},
		{"oom-grouped-site", "tiny-oom", []string{"esc", "b"}, false},
		{"oom-grouped-op", "tiny-oom", []string{"esc", "b", "b", "b"}, false},
		{"oom-group-opened", "tiny-oom", []string{"esc", "b", "enter"}, false},
		{"oom-fixes-ranked", "tiny-oom", []string{"5"}, false},
		{"oom-fixes-applied", "tiny-oom", []string{"5", "a"}, true},
		{"oom-live-detail", "tiny-oom", []string{"enter"}, false},
		{"oom-live-detail-scrolled", "tiny-oom", []string{"enter", "pgdown"}, false},
		{"oom-categories", "tiny-oom", []string{"2"}, false},
		{"oom-segments", "tiny-oom", []string{"3"}, false},
		{"oom-time-axis", "tiny-oom", []string{"t"}, false},
		{"oom-segment-blocks", "tiny-oom", []string{"3", "enter"}, false},
		{"peak-live", "tiny-oom", []string{"p"}, false},
		{"leak-leaks", "leaky", []string{"4"}, false},
		{"leak-fixes", "leaky", []string{"5"}, false},
		{"leak-fixes-applied", "leaky", []string{"5", "a"}, true},
		{"held-leaks", "module-attribute", []string{"4"}, false},
		{"held-fixes", "module-attribute", []string{"5"}, false},
		{"no-zero-grad-leaks", "no-zero-grad", []string{"4", "down", "down"}, false},
		{"gpt-leak-leaks", "gpt-retain-graph", []string{"4"}, false},
		{"oom-device", "tiny-oom", []string{"6"}, false},
		{"oom-help", "tiny-oom", []string{"?"}, false},
		{"filtered", "tiny-oom", []string{"/", "a", "t", "t", "n", "enter"}, false},
	}
	for _, sz := range append(sizes, struct{ w, h int }{40, 12}) {
		for _, v := range views {
			if sz.w < minWidth && !slices.Contains(small, v.name) {
				continue
			}
			t.Run(fmt.Sprintf("%s-%dx%d", v.name, sz.w, sz.h), func(t *testing.T) {
				m := newTestModel(t, fixture(t, v.fixture), sz.w, sz.h)
				if v.run {
					pressRun(m, v.keys...)
				} else {
					press(m, v.keys...)
				}
				out := screen(m)
				if got := strings.Count(out, "\n") + 1; got != sz.h {
					t.Errorf("view has %d lines, want %d", got, sz.h)
				}
				for i, line := range strings.Split(out, "\n") {
					if w := ansi.StringWidth(line); w > sz.w {
						t.Errorf("line %d is %d cells wide, more than %d: %q", i, w, sz.w, line)
					}
				}
				golden.RequireEqual(t, []byte(out))
			})
		}
	}
}

func TestNavigation(t *testing.T) {
	s := fixture(t, "tiny-oom")
	m := newTestModel(t, s, 100, 30)
	ix := m.ix
	if ix.oom < 0 || m.Cursor() != ix.oom {
		t.Fatalf("the view opens at event %d; want the OOM at %d", m.Cursor(), ix.oom)
	}
	steps := []struct {
		keys  []string
		check func() error
	}{
		{[]string{"home"}, atEvent(m, 0)},
		{[]string{"right", "right", "left"}, atEvent(m, 1)},
		{[]string{"p"}, atEvent(m, ix.peak)},
		{[]string{"o"}, atEvent(m, ix.oom)},
		{[]string{"end"}, atEvent(m, ix.len()-1)},
		{[]string{"home", "}"}, atEvent(m, ix.iters[0])},
		{[]string{"}"}, atEvent(m, ix.iters[1])},
		{[]string{"{"}, atEvent(m, ix.iters[0])},
		{[]string{"]"}, func() error { // the next phase begins with a phase marker
			if e := s.Events.At(m.Cursor()); e.Action != snapshot.ActionPhase {
				return fmt.Errorf("] landed on a %v event, want a phase marker", e.Action)
			}
			return nil
		}},
		{[]string{"o", "["}, func() error {
			if sp := ix.spanAt(ix.oom); m.Cursor() != sp.from {
				return fmt.Errorf("[ from the OOM landed at %d, want the start of its phase %d", m.Cursor(), sp.from)
			}
			return nil
		}},
		{[]string{"o", "+", "+", "<", "<"}, func() error { // zoomed in and panned left: the cursor comes along
			if m.viewTo-m.viewFrom >= ix.len() || m.cursor < m.viewFrom || m.cursor >= m.viewTo || m.viewFrom >= ix.oom {
				return fmt.Errorf("window [%d,%d) of %d, cursor %d", m.viewFrom, m.viewTo, ix.len(), m.cursor)
			}
			return nil
		}},
		{[]string{"tab", "tab"}, func() error {
			if m.Pane() != "Segments" {
				return fmt.Errorf("two tabs from Live show %s", m.Pane())
			}
			return nil
		}},
	}
	for i, st := range steps {
		press(m, st.keys...)
		if err := st.check(); err != nil {
			t.Errorf("step %d %v: %v", i, st.keys, err)
		}
	}
}

func atEvent(m *Model, want int) func() error {
	return func() error {
		if m.Cursor() != want {
			return fmt.Errorf("cursor at %d, want %d", m.Cursor(), want)
		}
		return nil
	}
}

func TestEveryKeyAtEverySizeNeverPanics(t *testing.T) {
	s := fixture(t, "tiny-oom")
	keys := []string{"right", "left", "H", "L", "[", "]", "{", "}", "p", "o", "g", "G", "+", "<", ">", "-", "0", "up", "down",
		"tab", "1", "enter", "esc", "2", "3", "down", "4", "5", "down", "space", "6", "/", "x", "backspace", "enter",
		"s", "?", "?"}
	for _, sz := range [][2]int{{1, 1}, {10, 5}, {39, 11}, {40, 12}, {80, 24}, {61, 17}, {200, 60}, {300, 100}} {
		m := newTestModel(t, s, sz[0], sz[1])
		for _, k := range keys {
			press(m, k)
			out := screen(m)
			for _, line := range strings.Split(out, "\n") {
				if ansi.StringWidth(line) > sz[0] {
					t.Fatalf("%dx%d after %q: a line is wider than the terminal: %q", sz[0], sz[1], k, line)
				}
			}
		}
		// A resize to the transposed size redraws to the new width and height.
		w, h := sz[1], sz[0]
		m.Update(tea.WindowSizeMsg{Width: w, Height: h})
		out := screen(m)
		switch got := strings.Count(out, "\n") + 1; {
		case m.layout.tooSmall && !strings.Contains(out, "terminal too small") && w > 20:
			t.Errorf("%dx%d resized to %dx%d, too small: %q does not say so", sz[0], sz[1], w, h, out)
		case !m.layout.tooSmall && got != h:
			t.Errorf("%dx%d resized to %dx%d: the view has %d lines", sz[0], sz[1], w, h, got)
		}
		for _, line := range strings.Split(out, "\n") {
			if ansi.StringWidth(line) > w {
				t.Fatalf("%dx%d resized to %dx%d: a line is wider than the terminal: %q", sz[0], sz[1], w, h, line)
			}
		}
	}
}

func TestNoColorDrawsNoColor(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 80, 24)
	out := m.View().Content
	if sgrColour.MatchString(out) {
		t.Errorf("the Ascii profile still sets colours: %q", sgrColour.FindString(out))
	}
	if !strings.Contains(ansi.Strip(out), "OOM in iteration") {
		t.Error("the view does not show the OOM")
	}
}

// sgrColour matches an SGR sequence that sets a foreground or background colour.
var sgrColour = regexp.MustCompile(`\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m`)

// TestFixesPaneTurnsAFineTuneIntoQLoRA chooses QLoRA, checkpointing and the paged 8-bit optimizer for a
// Llama workload in the fixes pane, re-runs it, and checks what was run and that the peak fell.
func TestFixesPaneTurnsAFineTuneIntoQLoRA(t *testing.T) {
	m := newTestModel(t, fixture(t, "smollm-ft"), 100, 30)
	press(m, "5")
	if got := m.fixes.choices(rowAdapter); len(got) != 3 || got[0] != "none" {
		t.Fatalf("adapter choices %q for a full fine-tune", got)
	}
	// adapter: qlora 16; checkpointing: all; optimizer: paged-adamw8bit.
	toRow(t, m, rowAdapter)
	press(m, "space", "space")
	toRow(t, m, rowCheckpoint)
	press(m, "space", "space")
	toRow(t, m, rowOptimizer)
	press(m, "space", "space", "space", "space", "space", "space", "space")
	got := m.fixes.config().Fixes
	if got.LoRA != adapterRank || !got.QLoRA || got.LoRATargets != allProjections || got.Checkpoint != knob.CheckpointAll ||
		got.Optimizer != "paged-adamw8bit" || got.OptimizerImpl != "" {
		t.Fatalf("chosen %+v", got)
	}
	if d := m.fixes.describe(); d != "qlora 16, checkpoint all, paged-adamw8bit" {
		t.Errorf("describe %q", d)
	}
	run(m, m.apply(m.fixes.onKey(m.ctx, keyPress("r"), m.keys, 20)))
	if m.fixes.after == nil || m.fixes.after.peakAlloc >= m.fixes.before.peakAlloc {
		t.Fatalf("after the re-run: %+v (err %v), before %+v", m.fixes.after, m.fixes.err, m.fixes.before)
	}
}

// TestFixesPaneKeepsTheBaseChoice checks a base setting the pane does not offer (LoRA of rank 8, AdamW
// fused) is one of its row's choices, chosen, so that re-running unchanged changes nothing.
func TestFixesPaneKeepsTheBaseChoice(t *testing.T) {
	w := *workload(t, "smollm-ft")
	w.Fixes.LoRA, w.Fixes.LoRATargets, w.Fixes.OptimizerImpl = 8, train.DefaultLoRATargets, knob.Fused
	p := newFixesPane(&w, playback{}, 0)
	if got := p.choices(rowAdapter); got[p.choice[rowAdapter]] != "lora 8" {
		t.Errorf("adapter row %q chooses %d", got, p.choice[rowAdapter])
	}
	if got := p.choices(rowOptimizer); got[p.choice[rowOptimizer]] != "adamw fused" {
		t.Errorf("optimizer row %q chooses %d", got, p.choice[rowOptimizer])
	}
	if c := p.config(); c.Fixes != w.Fixes || p.describe() != "no change" {
		t.Errorf("unchanged choices give %+v (%s), want %+v", c.Fixes, p.describe(), w.Fixes)
	}
}

func TestFixesRerunLowersThePeak(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 100, 30)
	press(m, "5")
	// ↑↓ start on the ranked fixes; past the last one, on the settings.
	if !m.fixes.focusRanked {
		t.Fatal("the fixes pane opens with ↑↓ on the settings, not on the ranked fixes")
	}
	for m.fixes.focusRanked {
		press(m, "down")
	}
	// bf16 autocast, flash attention and the leak fixed, then re-run.
	press(m, "space")
	toRow(t, m, rowAttention)
	press(m, "space")
	toRow(t, m, rowBug)
	press(m, "space")
	cfg := m.fixes.config().Fixes
	if cfg.AMP != knob.AMPBF16 || cfg.Attention != knob.AttentionFlash || cfg.Bug != "" {
		t.Fatalf("chosen fixes %s/%s/%q, want bf16/flash and no bug", cfg.AMP, cfg.Attention, cfg.Bug)
	}
	cmd := m.apply(m.fixes.onKey(m.ctx, keyPress("r"), m.keys, 20))
	if cmd == nil {
		t.Fatal("r started no re-run")
	}
	var sawProgress bool
	runEach(m, cmd, func(msg tea.Msg) { // run the re-run's commands as the program would
		if _, ok := msg.(fixChunkMsg); ok && strings.Contains(screen(m), "re-running… ") {
			sawProgress = true
		}
	})
	if !sawProgress {
		t.Error("the re-run showed no progress while streaming")
	}
	if m.fixes.after == nil {
		t.Fatalf("no result after the re-run (err %v)", m.fixes.err)
	}
	if m.fixes.after.oom || m.fixes.after.peakAlloc >= m.fixes.before.peakAlloc {
		t.Errorf("after bf16+flash: oom %v, peak %d; before: peak %d", m.fixes.after.oom, m.fixes.after.peakAlloc, m.fixes.before.peakAlloc)
	}
	if out := screen(m); !strings.Contains(out, "fits") || !strings.Contains(out, "•") {
		t.Errorf("the pane and timeline do not show the re-run:\n%s", out)
	}
}

func TestStreamingAWorkloadLandsOnTheOOM(t *testing.T) {
	w := workload(t, "tiny-oom")
	m := New(context.Background(), Options{Workload: w, Backend: playback{}, Profile: colorprofile.Ascii})
	m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
	chunks := 0
	drive(m, m.Init(), func(msg tea.Msg) bool {
		if _, ok := msg.(chunkMsg); ok {
			chunks++
		}
		return false
	})
	if !m.load.done || m.ix.oom < 0 || m.Cursor() != m.ix.oom {
		t.Fatalf("after %d chunks: done %v, oom at %d, cursor %d", chunks, m.load.done, m.ix.oom, m.Cursor())
	}
	if m.leaks.res == nil {
		t.Error("loading ended without a leak analysis")
	}
	if m.snap.Footer == nil {
		t.Error("the streamed snapshot has no footer")
	}
	if want := fixture(t, "tiny-oom"); want.Events.Len() != m.snap.Events.Len() {
		t.Errorf("streamed %d events, a recording of the same run has %d", m.snap.Events.Len(), want.Events.Len())
	}
}

func TestDevicePaneComparesDriverReadingsWithReserved(t *testing.T) {
	s := &snapshot.Snapshot{Strings: []string{"", "nvml.used"}, Stacks: [][]snapshot.FrameID{nil}, Frames: []snapshot.Frame{{}}}
	s.Events = snapshot.EventsOf([]snapshot.Event{
		{Seq: 0, Action: snapshot.ActionSegmentAlloc, Addr: 1 << 40, Size: 20 << 20},
		{Seq: 1, Action: snapshot.ActionAlloc, Addr: 1 << 40, Size: 10 << 20, BlockSize: 10 << 20},
		{Seq: 2, Action: snapshot.ActionSample, Size: 532 << 20, Text: 1},
	}...)
	m := newTestModel(t, s, 100, 30)
	press(m, "6", "G")
	out := screen(m)
	if !strings.Contains(out, "the driver saw 532.00 MiB used; the allocator reserved 20.00 MiB; the rest, 512.00 MiB") {
		t.Errorf("the device pane does not compare the reading with reserved memory:\n%s", out)
	}
}

func TestPyTorchSnapshotView(t *testing.T) {
	s, err := load.File(torchtest.FixturePath(t, torchtest.F3))
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 100, 30)
	out := screen(m)
	// Blocks are shown at the innermost frame of the program's own code (not torch's nn.Linear), and as
	// pre-existing only where their frames say nothing.
	for _, want := range []string{"landed on the peak", "at forward modeling_llama.py:330", "pre-existing (allocated before the"} {
		if !strings.Contains(out, want) {
			t.Errorf("the view of f3 lacks %q:\n%s", want, out)
		}
	}
	press(m, "4")
	if out := screen(m); !strings.Contains(out, "inconclusive") {
		t.Errorf("a trace without iterations should read as inconclusive for leaks:\n%s", out)
	}
}

// TestPadLeftMeasuresCells pads and cuts by terminal cells: "µ" is two bytes and one cell.
func TestPadLeftMeasuresCells(t *testing.T) {
	for _, tc := range []struct{ in, want string }{{"µs", "  µs"}, {"12µs", "12µs"}, {"123µs", "123µ"}, {"█", "   █"}} {
		if got := padLeft(tc.in, 4); got != tc.want || ansi.StringWidth(got) != 4 {
			t.Errorf("padLeft(%q, 4) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// TestFilterInput types a filter in the / input as a user edits one: characters, a word deleted with
// ctrl+w, backspace, enter to keep it; esc clears it. No colour is drawn under NO_COLOR while typing.
func TestFilterInput(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 100, 30)
	all := len(m.live.shown)
	press(m, "/", "g", "e", "l", "u")
	if !m.live.filtering() || m.live.filter.Value() != "gelu" {
		t.Fatalf("typing: filtering %v, value %q", m.live.filtering(), m.live.filter.Value())
	}
	if out := m.View().Content; sgrColour.MatchString(out) || !strings.Contains(ansi.Strip(out), "filter: gelu") {
		t.Errorf("while typing, the head reads:\n%s", ansi.Strip(out))
	}
	m.Update(tea.KeyPressMsg{Code: 'w', Mod: tea.ModCtrl})
	press(m, "s", "o", "f", "t", "backspace", "t", "enter")
	if m.live.filtering() || m.live.filter.Value() != "soft" {
		t.Fatalf("after enter: filtering %v, value %q", m.live.filtering(), m.live.filter.Value())
	}
	for _, b := range m.live.shown {
		if !strings.Contains(strings.ToLower(m.live.describe(b)), "soft") {
			t.Errorf("the filter %q shows %q", "soft", m.live.describe(b))
		}
	}
	if n := len(m.live.shown); n == 0 || n >= all {
		t.Errorf("the filter keeps %d of %d blocks", n, all)
	}
	press(m, "/", "esc")
	if m.live.filter.Value() != "" || len(m.live.shown) != all {
		t.Errorf("esc left the filter %q with %d of %d blocks", m.live.filter.Value(), len(m.live.shown), all)
	}
}

// TestLeaksPaneReachesHeldGroups: below a leak's suspects, the rows held across iterations scroll into view
// and enter jumps to their example block, as for a suspect.
func TestLeaksPaneReachesHeldGroups(t *testing.T) {
	m := newTestModel(t, fixture(t, "gpt-retain-graph"), 80, 24)
	press(m, "4")
	r := m.leaks.res
	if len(r.Suspects) == 0 || len(r.Held) != 1 || r.Held[0].RetainedBy == nil || r.Held[0].RetainedBy.Root != "logits" {
		t.Fatalf("want suspects and the logits held: %d suspects, held %+v", len(r.Suspects), r.Held)
	}
	if out := screen(m); strings.Contains(out, "held across iterations: ") {
		t.Fatalf("the held rows show before scrolling; the test shows nothing:\n%s", out)
	}
	for range len(r.Suspects) {
		press(m, "down")
	}
	out := screen(m)
	if !strings.Contains(out, "held across iterations: 64.00 KiB") || !strings.Contains(out, " logits") {
		t.Fatalf("the held group is not in view:\n%s", out)
	}
	press(m, "enter")
	ex := r.Held[0].Example
	if m.pane != paneLive || !strings.Contains(m.status, fmt.Sprintf("the held group's example block, allocated at event %d", ex.Alloc)) {
		t.Errorf("enter on a held row: pane %v, status %q", m.pane, m.status)
	}
}

// TestFixesPaneChoosesAStrategy checks that a rank of a data-parallel job gets the strategy and offload rows,
// and that a single GPU does not.
func TestFixesPaneChoosesAStrategy(t *testing.T) {
	w := *workload(t, "smollm-ft")
	single := newFixesPane(&w, playback{}, 0)
	if rows := single.rows(); slices.Contains(rows, rowParallel) || slices.Contains(rows, rowOffload) {
		t.Errorf("a single GPU shows the data-parallel rows: %v", rows)
	}
	w.GPUs, w.Fixes.Parallel, w.Fixes.Offload = 8, dist.DDP, dist.OffloadNone
	p := newFixesPane(&w, playback{}, 0)
	if rows := p.rows(); !slices.Contains(rows, rowParallel) || !slices.Contains(rows, rowOffload) {
		t.Fatalf("a rank lacks the data-parallel rows: %v", rows)
	}
	if got := p.choices(rowParallel); got[p.choice[rowParallel]] != "ddp" || len(got) != len(parallelChoices) {
		t.Fatalf("strategy row %q chooses %d", got, p.choice[rowParallel])
	}
	p.choice[rowParallel] = indexOf(p.choices(rowParallel), "zero3")
	p.choice[rowOffload] = indexOf(p.choices(rowOffload), "optimizer+params")
	if c := p.config().Fixes; c.Parallel != dist.ZeRO3 || c.Offload != dist.OffloadOptimizerParams {
		t.Errorf("chosen %+v", c)
	}
	if d := p.describe(); d != "zero3, offload optimizer+params" {
		t.Errorf("describe %q", d)
	}
}

// TestRanksPane opens a job's ranks: the Ranks pane lists them side by side, marks the one shown, and enter
// on another loads and shows it.
func TestRanksPane(t *testing.T) {
	files := []string{"rank0.oomdbg", "rank1.oomdbg"}
	snaps := map[string]*snapshot.Snapshot{files[0]: fixture(t, "tiny-oom"), files[1]: fixture(t, "tiny-oom-fixed")}
	var reports []*triage.Report
	for _, f := range files {
		reports = append(reports, triage.Analyze(context.Background(), timeline.New(snaps[f]), triage.Options{File: f}))
	}
	table := triage.CompareRanks(files, reports, make([]error, 2))
	load := func(path string) (*snapshot.Snapshot, error) { return snaps[path], nil }
	m := New(context.Background(), Options{File: files[table.Worst], Snapshot: snaps[files[table.Worst]], Ranks: table, Load: load,
		Profile: colorprofile.Ascii, Devices: noDriver})
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	press(m, "7")
	got := screen(m)
	if m.Pane() != "Ranks" || !strings.Contains(got, "7 Ranks") || !strings.Contains(got, "▸ 0") || !strings.Contains(got, "ran out of memory") {
		t.Fatalf("ranks pane:\n%s", got)
	}
	press(m, "down")
	cmd := m.apply(m.ranks.onKey(keyPress("enter"), m.keys, 20))
	if cmd == nil {
		t.Fatal("enter on another rank loads nothing")
	}
	m.Update(cmd())
	if m.opts.File != files[1] || m.snap != snaps[files[1]] || !strings.Contains(screen(m), "▸ 1") {
		t.Fatalf("after enter: file %s\n%s", m.opts.File, screen(m))
	}
	// Without ranks, the tabs stop at Device and 7 does nothing.
	single := newTestModel(t, snaps[files[0]], 100, 30)
	press(single, "7")
	if single.Pane() == "Ranks" || strings.Contains(screen(single), "Ranks") {
		t.Error("a single snapshot shows the Ranks pane")
	}
}

// TestPyTorchStacksDevicesAndSearch: on f4 (a LoRA diffusion run whose memory is on device 1, its blocks
// rebuilt as alive before a one-entry trace), the title names the device, rows name the program's frame
// instead of "pre-existing" where their frames say it, / finds blocks by frame text, and the detail opens on
// Python frames with the compiled ones folded behind a. On f7, whose two devices hold memory, d switches
// the device shown.
func TestPyTorchStacksDevicesAndSearch(t *testing.T) {
	s, err := load.File(torchtest.FixturePath(t, torchtest.F4))
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 120, 40)
	if out := screen(m); !strings.Contains(out, "oomdbg · cuda:1") {
		t.Errorf("the title does not name the device shown:\n%s", out)
	}
	// At 80 columns a long path gives way to the file's name, so the device shown stays on the title line.
	narrow := newTestModel(t, s, 80, 24)
	narrow.opts.File = "/data/runs/2024-06-01/rank1/f4_2024_time_us_no_settings_2dev.pickle"
	if title := strings.SplitN(screen(narrow), "\n", 2)[0]; !strings.Contains(title, "oomdbg · f4_2024_time_us_no_settings_2dev.pickle · cuda:1") {
		t.Errorf("at 80 columns the title loses the device to the path: %q", title)
	}
	// report attributes 1.26 GiB to nn.Linear's forward under lora.py:430.
	press(m, "/", "l", "i", "n", "e", "a", "r", "enter")
	out := screen(m)
	if strings.Contains(out, "no block is alive here") || !strings.Contains(out, "filter: linear") || !strings.Contains(out, "at forward lora.py:430") {
		t.Errorf("/linear finds no block named by its frames:\n%s", out)
	}
	press(m, "enter")
	if out := screen(m); !strings.Contains(out, "at forward lora.py:430 · allocated before the trace") {
		t.Errorf("the detail does not say where the block was allocated:\n%s", out)
	}

	// f3 keeps the allocator's C++ frames under the Python ones.
	s, err = load.File(torchtest.FixturePath(t, torchtest.F3))
	if err != nil {
		t.Fatal(err)
	}
	m = newTestModel(t, s, 120, 40)
	// The TUI labels the peak in the report's words (report says "at event N (forward, outside any iteration)").
	var text bytes.Buffer
	if err := triage.Analyze(t.Context(), m.ix.tl, triage.Options{}).WriteText(&text); err != nil {
		t.Fatal(err)
	}
	press(m, "p")
	if out := screen(m); !strings.Contains(out, "forward, outside any iteration") || !strings.Contains(text.String(), "(forward, outside any iteration)") {
		t.Errorf("the TUI and report label f3's peak differently:\n%s\n%s", out, text.String())
	}
	press(m, "enter")
	out = screen(m)
	if !strings.Contains(out, "compiled frames hidden") || strings.Contains(out, "::") {
		t.Errorf("the detail does not open on Python frames:\n%s", out)
	}
	press(m, "a")
	if out := screen(m); strings.Contains(out, "compiled frames hidden") || !strings.Contains(out, "::") {
		t.Errorf("a does not show the compiled frames:\n%s", out)
	}

	s, err = load.File(torchtest.FixturePath(t, torchtest.F7))
	if err != nil {
		t.Fatal(err)
	}
	m = newTestModel(t, s, 120, 40)
	// f7 opens on cuda:0, whose 8.13 MiB is the higher of the two devices' peaks (no OOM): two cards' memory is
	// not one pool; d steps to cuda:1, to their sum, which says it is a sum, and back.
	for _, want := range []string{"cuda:0 (1 of 2", "cuda:1 (2 of 2", "all 2 devices summed, not one pool", "cuda:0 (1 of 2"} {
		if out := screen(m); !strings.Contains(out, want) {
			t.Errorf("the title lacks %q:\n%s", want, out)
		}
		press(m, "d")
	}
}

// TestTraceFixesDrawTheChosenFix: on a PyTorch snapshot the fixes pane replays every fix, keeps only their
// outcomes, and makes the chosen one's trace again when it is drawn over the timeline.
func TestTraceFixesDrawTheChosenFix(t *testing.T) {
	s, err := load.File(torchtest.FixturePath(t, torchtest.F3))
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 120, 40)
	pressRun(m, "5", "r")
	p := &m.fixes.trace
	if len(p.results) == 0 || p.err != nil {
		t.Fatalf("no fixes replayed: %v\n%s", p.err, screen(m))
	}
	i := slices.IndexFunc(p.results, func(r whatif.Outcome) bool { return r.Fix.Name == "batch x0.5" })
	if i < 0 || p.results[i].Err != nil {
		t.Fatalf("batch x0.5 was not replayed on f3: %v", p.results)
	}
	for range i {
		press(m, "down")
	}
	pressRun(m, "space")
	if p.shown == nil || m.timeline.after == nil {
		t.Fatalf("space drew nothing over the timeline:\n%s", screen(m))
	}
	// The trace drawn is the fix's: its peak is the replayed outcome's, by the trace's own accounting.
	if got, want := p.shown.tl.Peak(timeline.Allocated).Bytes, p.results[i].Report.After.PeakAllocated; got > want || got < want*99/100 {
		t.Errorf("the trace drawn peaks at %d allocated, the replay of the fix at %d", got, want)
	}
}

// TestFixesRerunStopsAtTheMemoryBudget: the workload a re-run records comes from the file; a re-run that
// would outgrow the view's memory budget, held whole, is stopped with one line that says so.
func TestFixesRerunStopsAtTheMemoryBudget(t *testing.T) {
	s := fixture(t, "tiny-oom")
	m := New(context.Background(), Options{Snapshot: s, Backend: playback{}, Profile: colorprofile.Ascii, Devices: noDriver,
		MemoryBudget: 500 * residentPerEvent})
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	m.Update(deviceMsg{noDriver()})
	press(m, "5")
	cmd := m.apply(m.fixes.onKey(m.ctx, keyPress("r"), m.keys, 20))
	if cmd == nil {
		t.Fatal("r started no re-run")
	}
	run(m, cmd)
	if m.fixes.after != nil || m.fixes.err == nil || !strings.Contains(m.fixes.err.Error(), "memory budget") ||
		m.fixes.running != nil {
		t.Fatalf("a re-run past the budget: result %v, error %v, still running %v", m.fixes.after != nil, m.fixes.err, m.fixes.running != nil)
	}
	if out := screen(m); !strings.Contains(out, "stopped at") {
		t.Errorf("the screen does not say the re-run was stopped:\n%s", out)
	}
}
