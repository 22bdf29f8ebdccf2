package tui

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

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

// recommendation is the measured fixes, ranked: those that fit first, then by what they cost the training
// (the batch kept before a smaller micro-batch; less recomputation; the precision kept; the optimizer kept),
// then by what they need.
type recommendation struct {
	measuring bool
	err       error
	base      *Measured // the workload as configured (its leak, if any, fixed)
	ranked    []Measured
	selected  int
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
	slices.SortStableFunc(out, func(a, b Measured) int {
		if a.OOM != b.OOM {
			if a.OOM {
				return 1
			}
			return -1
		}
		return cmp.Or(slices.Compare(cost(base, a.Fixes), cost(base, b.Fixes)), cmp.Compare(a.Needs, b.Needs))
	})
	return out
}

// best is the top-ranked fix that fits; nil when none does.
func (r *recommendation) best() *Measured {
	if len(r.ranked) > 0 && !r.ranked[0].OOM {
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
	r.ranked = rank(p.base.Fixes, msg.rows)
	p.onAfterMeasured(msg)
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
		line += fmt.Sprintf("; 5 ranks %d fixes", len(r.ranked))
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
	if b := r.best(); b != nil {
		lines = append(lines, s.Good.Render(cut(fmt.Sprintf("best: %s (needs %s); a applies it", b.Fix, units.FormatSize(b.Needs)))))
	} else {
		lines = append(lines, s.Error.Render(cut(fmt.Sprintf("no measured fix fits; the run needs %s", units.FormatSize(r.base.Needs)))))
	}
	nameW := min(max(w-40, 16), 48)
	lines = append(lines, s.Header.Render(cut(fmt.Sprintf("  %-*s %10s %10s  %s", nameW, "fixes measured: cheapest that fit first", "needs", "peak", "on the device"))))
	from := min(max(r.selected-rows+1, 0), max(len(r.ranked)-rows, 0))
	for i := from; i < len(r.ranked) && i < from+rows; i++ {
		f := r.ranked[i]
		fits := "fits"
		if f.OOM {
			fits = "OOM in " + f.OOMPhase
		}
		line := cut(fmt.Sprintf("  %-*s %10s %10s  %s", nameW, ansi.Truncate(f.Fix, nameW, "…"), units.FormatSize(f.Needs), units.FormatSize(f.Peak), fits))
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

// measureAfter measures what the re-run of w needs: from the base's measurements when they hold w, else by
// measuring it. A run that keeps its leak bug needs more each iteration: nothing to measure.
func (p *fixesPane) measureAfter(ctx context.Context, w Workload) tea.Cmd {
	p.afterNeeds = 0
	if w.Fixes.Bug != "" {
		return nil
	}
	if b := p.rec.base; b != nil && b.Fixes == w.Fixes {
		p.afterNeeds = b.Needs
		return nil
	}
	for _, r := range p.rec.ranked {
		if r.Fixes == w.Fixes {
			p.afterNeeds = r.Needs
			return nil
		}
	}
	return measureFixes(ctx, p.backend, w)
}

// onAfterMeasured takes what the re-run needs.
func (p *fixesPane) onAfterMeasured(msg measuredMsg) {
	if msg.err == nil && len(msg.rows) > 0 && msg.of == p.config().Fixes {
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
