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
	run := planner{plans: []FitPlan{
		{Name: "bf16 autocast, flash attention", Fixes: fixed, PeakReserved: 3 << 20, StepTime: 0.010},
		{Name: "checkpoint all", Fixes: slower, PeakReserved: 2 << 20, StepTime: 0.020},
	}}
	m := New(context.Background(), Options{Snapshot: fixture(t, "tiny-oom"), Backend: run, Profile: colorprofile.Ascii, Devices: noDriver})
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
	for cmd != nil {
		_, cmd = m.Update(cmd())
	}
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
