package tui

import (
	"context"
	"fmt"
	"slices"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// fitPlansMsg is a finished search for plans.
type fitPlansMsg struct {
	plans []FitPlan
	err   error
}

// fitList is the fixes pane's list of plans: closed, searching, or open with one selected.
type fitList struct {
	open, busy bool
	plans      []FitPlan
	selected   int
	err        error
	cancel     context.CancelFunc
}

// fitKey handles the fit key, and the list's keys while it is open; ok says the key was the list's.
func (p *fixesPane) fitKey(ctx context.Context, msg tea.KeyPressMsg, k KeyMap) (action, bool) {
	l := &p.fit
	switch {
	case key.Matches(msg, k.Fit) && !l.open:
		if p.running != nil {
			return action{}, true
		}
		ctx, cancel := context.WithCancel(ctx)
		*l = fitList{open: true, busy: true, cancel: cancel}
		b, w := p.backend, *p.base
		return action{status: "fit: searching for the plans that fit on the meta device…", cmd: func() tea.Msg {
			plans, err := b.Plans(ctx, w)
			return fitPlansMsg{plans: plans, err: err}
		}}, true
	case !l.open:
		return action{}, false
	case key.Matches(msg, k.Apply): // the best of all, as in the pane: one answer
		b := p.rec.best()
		if b == nil || l.busy {
			return action{}, true
		}
		if l.cancel != nil {
			l.cancel()
		}
		*l = fitList{}
		return p.apply(ctx, *b), true
	case key.Matches(msg, k.Back), key.Matches(msg, k.Fit):
		if l.cancel != nil {
			l.cancel()
		}
		*l = fitList{}
	case key.Matches(msg, k.Up, k.Down):
		l.selected, _ = listMove(msg, k, l.selected, len(l.plans), 1)
	case key.Matches(msg, k.Detail, k.Rerun):
		if l.busy || len(l.plans) == 0 {
			return action{}, true
		}
		plan := l.plans[l.selected]
		*l = fitList{}
		return p.applyPlan(ctx, plan), true
	}
	return action{}, true
}

// onFitPlans shows the plans found, the cheapest selected.
func (p *fixesPane) onFitPlans(msg fitPlansMsg) action {
	if !p.fit.open { // closed meanwhile
		return action{}
	}
	p.fit.busy, p.fit.plans, p.fit.err, p.fit.selected = false, msg.plans, msg.err, 0
	switch {
	case msg.err != nil:
		return action{status: "fit failed: " + msg.err.Error(), isErr: true}
	case len(msg.plans) == 0:
		return action{status: "fit: no plan fits this card", isErr: true}
	}
	// The plans join the measured fixes in one ranking: a applies the best of all.
	p.rec.plans = msg.plans
	p.rec.withPlans(p.base.Fixes)
	return say(fmt.Sprintf("fit: %d plans fit; enter re-runs the one selected, a the best of all", len(msg.plans)))
}

// applyPlan sets the rows to the plan's choices where they offer them and re-runs the workload with the
// plan's fixes.
func (p *fixesPane) applyPlan(ctx context.Context, plan FitPlan) action {
	w := *p.base
	w.Fixes, w.Device = plan.Fixes, device.Meta
	for r := range numFixRows { // the plan's choices, where the rows offer them
		if i := indexOfLabel(options(&w, r), label(plan.Fixes, r)); i >= 0 {
			p.choice[r] = i
		}
	}
	if plan.Fixes.Bug == "" { // plans are of the fixed loop
		if i := indexOf(p.choices(rowBug), "fixed"); i >= 0 {
			p.choice[rowBug] = i
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	p.running, p.err, p.progress, p.after, p.afterIx = cancel, nil, nil, nil, nil
	// What the re-run needs is the plan's own measurement, never the workload's before it.
	return action{status: "re-running with " + plan.Name + " on the meta device…",
		cmd: tea.Batch(p.rerun(ctx, w), p.measureAfter(ctx, w))}
}

// fitView is the list of plans, in place of the rows while it is open.
func (p *fixesPane) fitView(s Styles, w int) []string {
	l := &p.fit
	fits := "that fit"
	if b := p.rec.base; b != nil && b.Usable > 0 {
		fits = "within " + units.FormatSize(headroom.Limit(b.Usable, headroom.DefaultMargin)) + " reserved (a " +
			headroom.Percent(headroom.DefaultMargin) + " margin)"
	}
	lines := []string{s.Muted.Render(ansi.Truncate("plans "+fits+", cheapest first: ↑↓ choose, enter re-run, esc close", w, "…"))}
	// One best answer: the best of the plans and the measured fixes, which a applies, says where it is.
	if b := p.rec.best(); b != nil && !l.busy && len(l.plans) > 0 {
		best := "best of all: " + b.Fix + ", a measured fix; a applies it"
		if b.plan != nil {
			best = fmt.Sprintf("best of all: plan %d; a applies it",
				slices.IndexFunc(l.plans, func(pl FitPlan) bool { return pl.Fixes == b.plan.Fixes })+1)
		}
		lines = append(lines, s.Good.Render(ansi.Truncate(best, w, "…")))
	}
	switch {
	case l.busy:
		return append(lines, s.Warn.Render("fit: searching…"))
	case l.err != nil:
		return append(lines, s.Error.Render(ansi.Truncate("fit failed: "+l.err.Error(), w, "…")))
	case len(l.plans) == 0:
		return append(lines, s.Muted.Render("no plan fits this card"))
	}
	for i, pl := range l.plans {
		line := fmt.Sprintf("%2d %8.3f s %10s  %s", i+1, pl.StepTime, units.FormatSize(pl.PeakReserved), pl.Name)
		line = ansi.Truncate(line, w, "…")
		if i == l.selected {
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	return append(lines, s.Muted.Render(ansi.Truncate("step time estimated on the GPU profile; peak reserved simulated", w, "…")))
}

// fitHint is the fixes pane's line about the fit key, when the backend can plan.
func (p *fixesPane) fitHint() string {
	if !p.backend.CanPlan() {
		return ""
	}
	return ", f plans that fit"
}
