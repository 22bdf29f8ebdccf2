package tui

import (
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// TestPanesAnswerWithActions drives panes alone, without a Model: what a key asks of the screen comes back
// as an action.
func TestPanesAnswerWithActions(t *testing.T) {
	k := DefaultKeyMap()
	t.Run("leaks: enter shows the suspect's block", func(t *testing.T) {
		res := leaks.Analyze(timeline.New(fixture(t, "leaky")))
		p := leaksPane{res: res}
		a := p.onKey(keyPress("enter"), k, 20)
		if a.show == nil || a.show.alloc != res.Suspects[0].Example.Alloc || a.show.what != "the suspect's" || a.cmd != nil {
			t.Errorf("enter on the first suspect: %+v", a)
		}
	})
	t.Run("fixes: a applies nothing before a fix is measured; r re-runs", func(t *testing.T) {
		p := newFixesPane(workload(t, "tiny-oom"), playback{}, 0)
		if a := p.onKey(context.Background(), keyPress("a"), k, 20); a.status != "no fix fits with the 5% margin yet" || a.cmd != nil {
			t.Errorf("a before measuring: %+v", a)
		}
		a := p.onKey(context.Background(), keyPress("r"), k, 20)
		if a.status != "re-running with no change on the meta device…" || a.cmd == nil || p.running == nil {
			t.Errorf("r: %+v, running %v", a, p.running != nil)
		}
		if a := p.onKey(context.Background(), keyPress("r"), k, 20); a.status != "re-run cancelled" || p.running != nil {
			t.Errorf("r again: %+v", a)
		}
	})
	t.Run("fixes: f with a backend that cannot plan shows its error", func(t *testing.T) {
		p := newFixesPane(workload(t, "tiny-oom"), playback{}, 0)
		a := p.onKey(context.Background(), keyPress("f"), k, 20)
		if a.cmd == nil {
			t.Fatal("f searched nothing")
		}
		a = p.onFitPlans(a.cmd().(fitPlansMsg))
		if !a.isErr || a.status != "fit failed: the recordings played back hold no plans" {
			t.Errorf("f with playback: %+v", a)
		}
	})
}
