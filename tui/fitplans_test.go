package tui

import (
	"context"
	"strings"
	"testing"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/knob"
)

// planner is playback that also plans: it offers the given plans, cheapest first.
type planner struct {
	playback
	plans []FitPlan
}

func (p planner) Plans(context.Context, Workload) ([]FitPlan, error) { return p.plans, nil }
func (p planner) CanPlan() bool                                      { return true }

// TestFitListsPlansAndRerunsTheChosen: f in the fixes pane lists the plans with the cheapest selected, and
// enter re-runs the one chosen with its fixes, which the rows then show.
func TestFitListsPlansAndRerunsTheChosen(t *testing.T) {
	w := workload(t, "tiny-oom")
	fixed := w.Fixes
	fixed.AMP, fixed.Attention, fixed.Bug = knob.AMPBF16, knob.AttentionFlash, "" // a re-run the fixtures recorded
	slower := w.Fixes
	slower.Checkpoint = knob.CheckpointAll
	plans := planner{plans: []FitPlan{
		{Name: "bf16 autocast, flash attention", Fixes: fixed, PeakReserved: 3 << 20, StepTime: 0.010},
		{Name: "checkpoint all", Fixes: slower, PeakReserved: 2 << 20, StepTime: 0.020},
	}}
	m := New(context.Background(), Options{Snapshot: fixture(t, "tiny-oom"), Backend: plans, Profile: colorprofile.Ascii, Devices: noDriver})
	m.Update(tea.WindowSizeMsg{Width: 100, Height: 30})
	press(m, "5")
	if !strings.Contains(screen(m), "f plans that fit") {
		t.Errorf("the fixes pane does not say f plans:\n%s", screen(m))
	}
	cmd := m.apply(m.fixes.onKey(m.ctx, keyPress("f"), m.keys, 20))
	if cmd == nil || !strings.Contains(screen(m), "searching") {
		t.Fatalf("f started no search:\n%s", screen(m))
	}
	m.Update(cmd())
	out := screen(m)
	if !strings.Contains(out, "bf16 autocast, flash attention") || !strings.Contains(out, "checkpoint all") {
		t.Fatalf("the plans are not listed:\n%s", out)
	}
	if m.fixes.fit.selected != 0 {
		t.Errorf("selected plan %d, want the cheapest", m.fixes.fit.selected)
	}
	press(m, "down", "up")
	cmd = m.apply(m.fixes.onKey(m.ctx, keyPress("enter"), m.keys, 20))
	if cmd == nil {
		t.Fatal("enter started no re-run")
	}
	run(m, cmd)
	if m.fixes.after == nil || m.fixes.after.oom {
		t.Fatalf("the plan's re-run: %+v (err %v)", m.fixes.after, m.fixes.err)
	}
	if got := m.fixes.config().Fixes; got != fixed {
		t.Errorf("the rows choose %+v after the plan, want %+v", got, fixed)
	}
	if m.fixes.fit.open {
		t.Error("the list stays open after the re-run started")
	}
}

// measuringPlanner is a planner that plays back measurements given by workload settings: the fixes
// measured of a workload, and what a plan's re-run needs.
type measuringPlanner struct {
	planner
	rows map[Fixes][]Measured
}

func (p measuringPlanner) MeasureFixes(ctx context.Context, w Workload) ([]Measured, error) {
	if rows, ok := p.rows[w.Fixes]; ok {
		return rows, nil
	}
	return p.planner.MeasureFixes(ctx, w)
}

// TestAAndFGiveOneBestAnswer: a plan the fit key finds joins the measured fixes in one ranking by the
// headroom rule and the planner's step time: when it is the cheapest that fits, the pane's best is the plan
// and f's list says so; a, in the pane or in the list, applies it; and what the re-run needs is the plan's
// own measurement, not the workload's before it. The workload is the tiny GPT without its leak, on 40 MiB
// (36 for the allocator); its measured fixes and the plan are given, the plan's re-run is a recording.
func TestAAndFGiveOneBestAnswer(t *testing.T) {
	w := workload(t, "tiny-oom-leak-fixed")
	fixed := w.Fixes
	fixed.AMP, fixed.Attention = knob.AMPBF16, knob.AttentionFlash // the re-run the fixtures recorded
	flash := w.Fixes
	flash.Attention = knob.AttentionFlash
	const usable, planNeeds = 36 << 20, 7 << 20
	rows := []Measured{
		{Fix: "as configured", Fixes: w.Fixes, Needs: 13 << 20, Reserved: 14 << 20, Usable: usable, StepTime: 5e-5},
		{Fix: "flash attention", Fixes: flash, Needs: 11 << 20, Reserved: 12 << 20, Usable: usable, StepTime: 4e-5},
	}
	for _, key := range []string{"a", "f a"} {
		backend := measuringPlanner{planner: planner{plans: []FitPlan{
			{Name: "bf16 autocast, flash attention", Fixes: fixed, PeakReserved: 8 << 20, StepTime: 3e-5},
		}}, rows: map[Fixes][]Measured{w.Fixes: rows, fixed: {{Fix: "as configured", Fixes: fixed, Needs: planNeeds}}}}
		m := New(context.Background(), Options{Snapshot: fixture(t, "tiny-oom-leak-fixed"), Backend: backend, Profile: colorprofile.Ascii, Devices: noDriver})
		m.Update(tea.WindowSizeMsg{Width: 80, Height: 24})
		run(m, m.fixes.measure(m.ctx))
		press(m, "5")
		if b := m.fixes.rec.best(); b == nil || b.Fix != "flash attention" {
			t.Fatalf("before f, best %+v: want flash attention, the cheapest measured fix", b)
		}
		run(m, m.apply(m.fixes.onKey(m.ctx, keyPress("f"), m.keys, 20)))
		b := m.fixes.rec.best()
		if b == nil || b.plan == nil || b.Fixes != fixed {
			t.Fatalf("after f, best %+v: want the plan, cheaper than every measured fix", b)
		}
		if out := screen(m); !strings.Contains(out, "best of all: plan 1; a applies it") {
			t.Errorf("f's list does not give the pane's best:\n%s", out)
		}
		if key == "a" { // a in the pane
			press(m, "esc")
		}
		run(m, m.apply(m.fixes.onKey(m.ctx, keyPress("a"), m.keys, 20)))
		if m.fixes.after == nil || m.fixes.afterFixes != fixed || m.fixes.afterNeeds != planNeeds {
			t.Fatalf("%s: the re-run %+v of %+v needs %d; want the plan's, measured at %d (err %v)", key, m.fixes.after,
				m.fixes.afterFixes, m.fixes.afterNeeds, planNeeds, m.fixes.err)
		}
		var needs []string
		for _, line := range strings.Split(screen(m), "\n") {
			if f := strings.Fields(line); len(f) > 0 && f[0] == "needs" {
				needs = f
			}
		}
		if strings.Join(needs, " ") != "needs 13.00 MiB 7.00 MiB -6.00 MiB" {
			t.Errorf("%s: the comparison's needs %q, want the workload's 13 MiB against the plan's 7:\n%s", key, needs, screen(m))
		}
	}
}
