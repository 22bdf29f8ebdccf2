package tui

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

// TestOneMomentSaysItsOrderIsInvented: PyTorch snapshots of one moment (f1's legacy history, f2's segments
// without a trace, f4's and f7's final states with at most one trace event) are drawn as a climb from zero
// to the moment, made of events the importer rebuilt from the final state in an order of its own: the screen
// says so under the title, the band marks those events ~, and the position line says so at them. A trace
// (f3) whose first events were rebuilt (a ring buffer that lost its start) says so where they are, without
// the banner.
func TestOneMomentSaysItsOrderIsInvented(t *testing.T) {
	for _, f := range []string{torchtest.F1, torchtest.F2, torchtest.F4, torchtest.F7, torchtest.F3} {
		s, err := load.File(torchtest.FixturePath(t, f))
		if err != nil {
			t.Fatal(err)
		}
		m := newTestModel(t, s, 80, 24)
		press(m, "home")
		out := screen(m)
		banner := strings.Contains(out, "final state only: the climb to it is rebuilt, in an invented order")
		if moment := f != torchtest.F3; banner != moment {
			t.Errorf("%s: one moment %v, the banner shown %v:\n%s", f, moment, banner, out)
		}
		if _, cells := band(t, m); !strings.HasPrefix(cells, "~") {
			t.Errorf("%s: the band %q does not mark the rebuilt events", f, cells)
		}
		if !strings.Contains(out, "rebuilt from the final state (order invented)") {
			t.Errorf("%s: at event 0, the position line does not say it was rebuilt:\n%s", f, out)
		}
	}
}

// TestOneNameForTheMomentBeforeIteration0: f3, an inference trace, runs outside any iteration; every line
// that names its moments says so as the report does ("forward, outside any iteration"), none "iteration -1",
// and the live set's iteration column says "-".
func TestOneNameForTheMomentBeforeIteration0(t *testing.T) {
	s, err := load.File(torchtest.FixturePath(t, torchtest.F3))
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 120, 40)
	press(m, "p")
	seen := screen(m)
	press(m, "2")
	seen += screen(m)
	press(m, "1", "enter")
	seen += screen(m)
	for _, want := range []string{"forward, outside any iteration", "change since this phase began (forward, outside any iteration)",
		": forward, outside any iteration, in "} {
		if !strings.Contains(seen, want) {
			t.Errorf("f3's screens lack %q", want)
		}
	}
	if strings.Contains(seen, "iteration -1") || strings.Contains(seen, "-1  ") {
		t.Errorf("f3's screens name the moment by iteration -1:\n%s", seen)
	}
}
