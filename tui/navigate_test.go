package tui

import (
	"strconv"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

// TestNextPhaseStepsOverRecomputation: under checkpointing, ] stops once in an iteration's backward pass,
// however many times it alternates with recomputation; zoomed in, it stops at each.
func TestNextPhaseStepsOverRecomputation(t *testing.T) {
	m := newTestModel(t, fixture(t, "smollm-ft-qlora"), 100, 30)
	ix := m.ix
	bw := func(p snapshot.Phase) bool { return p == snapshot.PhaseBackward || p == snapshot.PhaseRecompute }
	raw := 0
	for _, sp := range ix.spans() {
		if sp.Iteration == 0 && bw(sp.Phase) {
			raw++
		}
	}
	if raw < 4 {
		t.Fatalf("iteration 0 has %d backward and recompute spans; the fixture does not checkpoint", raw)
	}
	stops := func() int {
		press(m, "home")
		n := 0
		for prev := -1; m.Cursor() != prev; {
			prev = m.Cursor()
			press(m, "]")
			if sp := ix.spanAt(m.Cursor()); sp.iteration == 0 && bw(sp.phase) && m.Cursor() != prev {
				n++
			}
		}
		return n
	}
	if n := stops(); n != 1 {
		t.Errorf("] stops %d times in iteration 0's backward pass, want 1", n)
	}
	m.zoomed = true
	if n := stops(); n != raw {
		t.Errorf("zoomed in, ] stops %d times in iteration 0's backward pass, want each of its %d spans", n, raw)
	}
}

// TestSmallDefects holds the small things a first use found wrong, each against what it should read.
func TestSmallDefects(t *testing.T) {
	t.Run("a hint goes when the cursor moves on", func(t *testing.T) {
		m := newTestModel(t, fixture(t, "tiny-oom"), 100, 30)
		press(m, "p")
		if !strings.Contains(screen(m), "the peak: the first event") {
			t.Fatal("p gives no hint")
		}
		press(m, "end")
		if strings.Contains(screen(m), "the peak: the first event") {
			t.Error("the peak's hint stays after moving to the end")
		}
	})
	t.Run("the help's legend is wrapped, not cut", func(t *testing.T) {
		for _, w := range []int{80, 160} {
			m := newTestModel(t, fixture(t, "tiny-oom"), w, 48)
			press(m, "?")
			if out := strings.Join(strings.Fields(screen(m)), " "); !strings.Contains(out, "e eval, │ an iteration") {
				t.Errorf("at %d columns the legend is cut:\n%s", w, screen(m))
			}
		}
	})
	t.Run("a filter without a match says so and counts what it keeps", func(t *testing.T) {
		m := newTestModel(t, fixture(t, "tiny-oom"), 100, 30)
		press(m, "esc", "/", "z", "q", "x", "enter")
		out := screen(m)
		if !strings.Contains(out, "0 of "+strconv.Itoa(len(m.live.rows))+" blocks") || !strings.Contains(out, `no live block matches "zqx"`) {
			t.Errorf("a filter matching nothing:\n%s", out)
		}
	})
	t.Run("the status gives the event's own change", func(t *testing.T) {
		m := newTestModel(t, fixture(t, "tiny-oom"), 160, 30)
		press(m, "p") // from the OOM to the peak: the change since the last stop is not the event's
		e := m.snap.Events.At(m.Cursor())
		if e.Action != snapshot.ActionAlloc {
			t.Fatalf("the peak is a %v event", e.Action)
		}
		// An allocation adds its block's size to the allocated bytes.
		if want := "(" + units.FormatChange(e.Size) + " this event)"; !strings.Contains(screen(m), want) {
			t.Errorf("at the alloc of %d bytes the status lacks %q:\n%s", e.Size, want, screen(m))
		}
	})
	t.Run("g and G move a list pane's list", func(t *testing.T) {
		m := newTestModel(t, fixture(t, "tiny-oom"), 100, 30)
		press(m, "esc", "G")
		if m.Cursor() != m.ix.oom || m.live.selected != len(m.live.shown)-1 {
			t.Errorf("G in the live set: cursor %d (OOM %d), row %d of %d", m.Cursor(), m.ix.oom, m.live.selected, len(m.live.shown))
		}
		press(m, "g")
		if m.Cursor() != m.ix.oom || m.live.selected != 0 {
			t.Errorf("g in the live set: cursor %d, row %d", m.Cursor(), m.live.selected)
		}
	})
	t.Run("every category says what it holds", func(t *testing.T) {
		m := newTestModel(t, fixture(t, "tiny-oom"), 160, 48)
		press(m, "2")
		if out := screen(m); !strings.Contains(out, "autograd_detail  gradients flowing through backward") {
			t.Errorf("the categories pane does not explain autograd_detail:\n%s", out)
		}
	})
}
