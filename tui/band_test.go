package tui

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// loop is a snapshot of a training loop of n iterations, each a forward, a backward and an optimizer phase
// with an allocation each; the backward takes most of an iteration's events, the optimizer a few. With pause,
// each iteration waits long after it begins, as for a data loader, before its first allocation.
func loop(n int, pause bool) *snapshot.Snapshot {
	var evs []snapshot.Event
	t := int64(0)
	add := func(e snapshot.Event) {
		t++
		e.Seq, e.Time = uint64(len(evs)), t
		evs = append(evs, e)
	}
	const addr = 1 << 30
	for it := range int32(n) {
		add(snapshot.Event{Action: snapshot.ActionIteration, Iteration: it})
		if pause {
			t += 10_000
		}
		for _, ph := range []struct {
			phase  snapshot.Phase
			allocs int
		}{{snapshot.PhaseForward, 3}, {snapshot.PhaseBackward, 6}, {snapshot.PhaseOptimizer, 1}} {
			add(snapshot.Event{Action: snapshot.ActionPhase, Phase: ph.phase, Iteration: it})
			for k := range ph.allocs {
				a := uint64(addr + k<<20)
				add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: a, Size: 1 << 20, BlockSize: 1 << 20, Phase: ph.phase, Iteration: it,
					Category: snapshot.CategoryActivation})
				add(snapshot.Event{Action: snapshot.ActionFreeCompleted, Addr: a, Size: 1 << 20, BlockSize: 1 << 20, Phase: ph.phase,
					Iteration: it, Category: snapshot.CategoryActivation})
			}
		}
	}
	s := &snapshot.Snapshot{Strings: []string{""}, Stacks: [][]snapshot.FrameID{nil}, Frames: []snapshot.Frame{{}},
		Meta: snapshot.Meta{Source: "oomdbg", TimeUnit: "ns"}}
	s.Events = snapshot.EventsOf(evs...)
	return s
}

// band returns the screen's phase band: its label and its cells.
func band(t *testing.T, m *Model) (label, cells string) {
	t.Helper()
	for _, l := range strings.Split(screen(m), "\n") {
		if name := strings.TrimSpace(l[:min(len(l), axisWidth)]); name == "phase" || name == "iteration" {
			return name, string([]rune(l)[axisWidth:])
		}
	}
	t.Fatalf("no band on the screen:\n%s", screen(m))
	return "", ""
}

// TestBandShowsEachIterationAlike: zoomed so that an iteration spans many columns, every iteration's band
// reads the same (its phases, the backward longest, a tick where it begins), however the columns fall.
func TestBandShowsEachIterationAlike(t *testing.T) {
	m := newTestModel(t, loop(4, false), 80, 24)
	label, cells := band(t, m)
	its := strings.Split(strings.Trim(cells, " "), "│")
	if label != "phase" || len(its) != 5 {
		t.Fatalf("band %s %q: want phases and 4 iterations", label, cells)
	}
	for i, it := range its[1:] {
		if !strings.HasPrefix(it, "F") || !strings.Contains(it, "BBBB") || strings.Count(it, "B") <= strings.Count(it, "F") ||
			strings.ContainsAny(it, "│.") {
			t.Errorf("iteration %d reads %q in %q", i, it, cells)
		}
	}
}

// TestBandNumbersIterationsZoomedOut: with more iterations than the band has room for (2,000 in 69
// columns), it is an axis of iteration numbers, ticked at round ones, not a tick in every column.
func TestBandNumbersIterationsZoomedOut(t *testing.T) {
	m := newTestModel(t, loop(2000, false), 80, 24)
	label, cells := band(t, m)
	if label != "iteration" || strings.Contains(cells, "││") || !strings.Contains(cells, "│0") || !strings.Contains(cells, "│1000") {
		t.Errorf("band %s %q: want iteration numbers", label, cells)
	}
	if n := strings.Count(cells, "│"); n < 3 || n > 12 {
		t.Errorf("band %q has %d ticks", cells, n)
	}
	press(m, "+", "+", "+", "+", "+", "+", "+", "+", "+")
	if label, cells := band(t, m); label != "phase" || strings.Contains(cells, "││") {
		t.Errorf("zoomed in: band %s %q: want phases", label, cells)
	}
}

// TestTimeAxisTicksAnIterationOnce: on the time axis, each iteration of a loop that waits after it begins
// spans a long stretch without events, whose columns repeat the event before them, its iteration mark: the
// iteration's tick is drawn once, not in every repeated column.
func TestTimeAxisTicksAnIterationOnce(t *testing.T) {
	m := newTestModel(t, loop(6, true), 80, 24)
	press(m, "t")
	label, cells := band(t, m)
	if label != "phase" || strings.Contains(cells, "││") || strings.Count(cells, "│") != 6 {
		t.Errorf("time axis band %s %q: want one tick for each of 6 iterations", label, cells)
	}
}

// TestCacheRowSaysWhatItIs: the row under the plot, reserved minus allocated on a scale of its own, is
// labelled as the cache with its scale, not with a bare size that reads as the memory axis below zero.
func TestCacheRowSaysWhatItIs(t *testing.T) {
	m := newTestModel(t, fixture(t, "tiny-oom"), 80, 24)
	lines := strings.Split(screen(m), "\n")
	for i, l := range lines {
		if strings.TrimSpace(l[:axisWidth]) == "0" {
			if next := strings.TrimSpace(lines[i+1][:axisWidth]); !strings.HasPrefix(next, "cache ") {
				t.Errorf("the row under the plot is labelled %q", next)
			}
			return
		}
	}
	t.Errorf("no memory axis:\n%s", screen(m))
}
