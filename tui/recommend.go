package tui

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks"
)

// measuredMsg is a finished measurement of the workload with settings of.
type measuredMsg struct {
	of   Fixes
	rows []Measured
	err  error
}

// measureFixes measures w's fixes in the background.
func measureFixes(ctx context.Context, b Backend, w Workload) tea.Cmd {
	return func() tea.Msg {
		rows, err := b.MeasureFixes(ctx, w)
		return measuredMsg{of: w.Fixes, rows: rows, err: err}
	}
}

// recommendation is the measured fixes, and the plans the fit key found, ranked as one list by the one
// headroom rule (internal/headroom), so that a and f give one best answer: those that fit first; among them
// the cheapest by the estimated step time where every one has an estimate (the planner's cost model), else
// by what they cost the training (the batch kept before a smaller micro-batch; less recomputation; the
// precision kept; the optimizer kept); then by what they need. A run that ran but inside the margin (tight)
// comes after those that fit and before those that ran out.
type recommendation struct {
	measuring bool
	err       error
	base      *Measured  // the workload as configured (its leak, if any, fixed)
	measured  []Measured // the measured fixes, ranked
	plans     []FitPlan  // the plans the fit key found
	ranked    []Measured // both, ranked
	selected  int
}

// verdict judges a measured fix, or a plan, by the headroom rule on its card.
func (m *Measured) verdict() headroom.Verdict {
	return headroom.Judge(m.Reserved, m.OOM, m.Usable, headroom.DefaultMargin)
}

// cost orders what a fix changes, cheapest first.
func cost(base, f Fixes) []int {
	b2i := func(b bool) int {
		if b {
			return 1
		}
		return 0
	}
	precision := f.AMP != base.AMP || f.Weights != base.Weights || f.LoRA != base.LoRA || f.QLoRA != base.QLoRA
	changed := 0 // then the fewer settings changed, the better
	for r := range numFixRows {
		if r != rowBug && label(f, r) != label(base, r) {
			changed++
		}
	}
	return []int{b2i(f.Batch != base.Batch), recomputed(f.Checkpoint) - recomputed(base.Checkpoint), b2i(precision),
		b2i(f.Optimizer != base.Optimizer || f.OptimizerImpl != base.OptimizerImpl), changed}
}

// recomputed ranks a checkpointing choice by how much of the forward backward recomputes: none, the
// attention or every block's pointwise ops (selective:ops), every N-th block, every block.
func recomputed(c knob.Checkpoint) int {
	switch {
	case c.Off():
		return 0
	case c.Attention(), c.Ops():
		return 1
	case c.Every() > 1:
		return 2
	}
	return 3
}

// rank orders the measured fixes of base: rows[0] is base itself.
func rank(base Fixes, rows []Measured) []Measured {
	out := slices.Clone(rows[1:])
	if base.Bug != "" && len(rows) > 0 { // the workload without its leak is a fix of its own, and part of each
		for i := range out {
			out[i].Fix += ", leak fixed"
		}
		out = append([]Measured{rows[0]}, out...)
		out[0].Fix = "the leak fixed"
	}
	return order(base, out)
}

// order sorts fixes and plans of base as recommendation says.
func order(base Fixes, out []Measured) []Measured {
	standing := func(m *Measured) int { // fits, tight, unknown, OOM
		return map[string]int{headroom.Fits: 0, headroom.Tight: 1, headroom.Unknown: 2, headroom.OOM: 3}[m.verdict().Word]
	}
	byTime := !slices.ContainsFunc(out, func(m Measured) bool { return m.verdict().Fits() && m.StepTime <= 0 })
	leakFixed := base
	leakFixed.Bug = ""
	onlyLeak := func(m *Measured) int { // the leak is the cause: its fix alone comes before the others
		if base.Bug != "" && m.Fixes == leakFixed {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(out, func(a, b Measured) int {
		if c := cmp.Compare(standing(&a), standing(&b)); c != 0 {
			return c
		}
		if c := cmp.Compare(onlyLeak(&a), onlyLeak(&b)); c != 0 {
			return c
		}
		if byTime && a.verdict().Fits() {
			// Another optimizer family changes what is trained, not how fast: the planner never offers it.
			if c := cmp.Compare(otherOptimizer(base, a.Fixes), otherOptimizer(base, b.Fixes)); c != 0 {
				return c
			}
			if c := cmp.Compare(a.StepTime, b.StepTime); c != 0 {
				return c
			}
		}
		return cmp.Or(slices.Compare(cost(base, a.Fixes), cost(base, b.Fixes)), cmp.Compare(a.Needs, b.Needs))
	})
	return out
}

// otherOptimizer is 1 when f trains with SGD or momentum where base does not.
func otherOptimizer(base, f Fixes) int {
	if f.Optimizer != base.Optimizer && (f.Optimizer == knob.SGD || f.Optimizer == knob.Momentum) {
		return 1
	}
	return 0
}

// withPlans ranks the measured fixes and the plans the fit key found together. A plan that is a measured
// fix is that fix, with the plan's estimate of its step time.
func (r *recommendation) withPlans(base Fixes) {
	all := slices.Clone(r.measured)
	for i := range r.plans {
		pl := &r.plans[i]
		if j := slices.IndexFunc(all, func(m Measured) bool { return m.Fixes == pl.Fixes }); j >= 0 {
			all[j].StepTime = pl.StepTime
			continue
		}
		m := Measured{Fix: pl.Name, Fixes: pl.Fixes, Reserved: pl.PeakReserved, StepTime: pl.StepTime, plan: pl}
		if r.base != nil {
			m.Usable = r.base.Usable
		}
		all = append(all, m)
	}
	r.ranked = order(base, all)
}

// best is the top-ranked fix or plan that fits by the headroom rule; nil when none does.
func (r *recommendation) best() *Measured {
	if len(r.ranked) > 0 && r.ranked[0].verdict().Fits() {
		return &r.ranked[0]
	}
	return nil
}

// onMeasured takes the base's measurement.
func (p *fixesPane) onMeasured(msg measuredMsg) {
	r := &p.rec
	if msg.of != p.base.Fixes {
		p.onAfterMeasured(msg)
		return
	}
	r.measuring, r.err = false, msg.err
	if msg.err != nil || len(msg.rows) == 0 {
		return
	}
	r.base = &msg.rows[0]
	r.measured = rank(p.base.Fixes, msg.rows)
	r.withPlans(p.base.Fixes)
	p.onAfterMeasured(msg)
}

// runNeeds is what the run needs, measured (its peak with unlimited memory); 0 until measured, and for a run
// whose leak grows it (the measurement is of the run without its leak).
func (p *fixesPane) runNeeds() int64 {
	if p.rec.base == nil || p.base == nil || p.base.Fixes.Bug != "" {
		return 0
	}
	return p.rec.base.Needs
}

// needsLine is what the run needs, for the OOM panel: "" until measured.
func (p *fixesPane) needsLine() string {
	r := &p.rec
	switch {
	case r.measuring:
		return "measuring what the run needs (each fix re-run on the meta device)…"
	case r.base == nil:
		return ""
	}
	what := "the run needs"
	if p.base.Fixes.Bug != "" {
		what = "without its leak, the run needs"
	}
	line := fmt.Sprintf("%s %s (its peak with unlimited memory)", what, units.FormatSize(r.base.Needs))
	if b := r.best(); b != nil {
		line += fmt.Sprintf("; 5 shows %d fixes, ranked", len(r.ranked))
	}
	return line
}

// rankedView is the head of the fixes pane: the best fix in a line, then the ranked fixes, at most rows of
// them, the selected one kept in view.
func (p *fixesPane) rankedView(s Styles, w, rows int) []string {
	r := &p.rec
	cut := func(l string) string { return ansi.Truncate(l, w, "…") }
	switch {
	case r.measuring:
		return []string{s.Warn.Render(cut("measuring each fix on the meta device…"))}
	case r.err != nil:
		return []string{s.Error.Render(cut("measuring the fixes failed: " + r.err.Error()))}
	case r.base == nil:
		return nil
	}
	var lines []string
	margin := headroom.Percent(headroom.DefaultMargin)
	if b := r.best(); b != nil {
		what := "needs " + units.FormatSize(b.Needs)
		if b.Needs == 0 { // a plan: its need is measured once it runs
			what = fmt.Sprintf("a plan, %.3g s a step", b.StepTime)
		}
		lines = append(lines, s.Good.Render(cut(fmt.Sprintf("best (fits, %s margin): %s, %s; a applies it", margin, b.Fix, what))))
	} else {
		lines = append(lines, s.Error.Render(cut(fmt.Sprintf("no fix fits with a %s margin; the run needs %s", margin, units.FormatSize(r.base.Needs)))))
	}
	nameW := min(max(w-47, 16), 48)
	limit := "on the card"
	if u := r.base.Usable; u > 0 {
		limit = "fits if ≤ " + units.FormatSize(headroom.Limit(u, headroom.DefaultMargin))
	}
	lines = append(lines, s.Header.Render(cut(fmt.Sprintf("  %-*s %10s %10s  %s", nameW, "cheapest that fit first", "needs", "reserved", limit))))
	from := min(max(r.selected-rows+1, 0), max(len(r.ranked)-rows, 0))
	for i := from; i < len(r.ranked) && i < from+rows; i++ {
		f := r.ranked[i]
		v := f.verdict()
		fits := v.Word
		switch {
		case f.OOM:
			fits = "OOM in " + f.OOMPhase
		case v.Word == headroom.Tight:
			fits = "tight, " + units.FormatSize(max(v.Left(), 0)) + " left"
		}
		needs := units.FormatSize(f.Needs)
		if f.Needs == 0 && f.plan != nil {
			needs = "plan"
		}
		line := cut(fmt.Sprintf("  %-*s %10s %10s  %s", nameW, ansi.Truncate(f.Fix, nameW, "…"), needs, units.FormatSize(f.Reserved), fits))
		if i == r.selected && p.focusRanked {
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	if n := len(r.ranked) - rows; n > 0 {
		lines = append(lines, s.Muted.Render(cut(fmt.Sprintf("  (%d more; ↑↓ scroll)", n))))
	}
	return lines
}

// measureAfter measures what the re-run of w needs: from the measurements when they hold w, else by
// measuring it (a plan's need is its own run's, never the workload's). A run that keeps its leak bug needs
// more each iteration: nothing to measure.
func (p *fixesPane) measureAfter(ctx context.Context, w Workload) tea.Cmd {
	p.afterNeeds, p.afterFixes = 0, w.Fixes
	if w.Fixes.Bug != "" {
		return nil
	}
	if b := p.rec.base; b != nil && b.Fixes == w.Fixes {
		p.afterNeeds = b.Needs
		return nil
	}
	for _, r := range p.rec.measured {
		if r.Fixes == w.Fixes && r.Needs > 0 {
			p.afterNeeds = r.Needs
			return nil
		}
	}
	return measureFixes(ctx, p.backend, w)
}

// onAfterMeasured takes what the re-run needs, when it is the re-run's own measurement.
func (p *fixesPane) onAfterMeasured(msg measuredMsg) {
	if msg.err == nil && len(msg.rows) > 0 && msg.of == p.afterFixes {
		p.afterNeeds = msg.rows[0].Needs
	}
}

// measure measures the base workload's fixes, once it is known.
func (p *fixesPane) measure(ctx context.Context) tea.Cmd {
	if p.base == nil || p.rec.measuring || p.rec.base != nil {
		return nil
	}
	p.rec.measuring = true
	return measureFixes(ctx, p.backend, *p.base)
}

// leakWords says a leak verdict in a few words: "leak, +64.50 KiB per iteration", "no leak".
func leakWords(r *leaks.Result) string {
	if r.Verdict == leaks.Leak {
		return "leak, +" + units.FormatSize(r.LeakPerIteration) + " per iteration"
	}
	return r.Verdict.Describe()
}
