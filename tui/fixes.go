package tui

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
)

// fixesPane changes the workload's fixes and re-runs it on the meta device in the background: the re-run's
// curve is drawn over the timeline, and a table compares the peaks, whether it fits, the bytes by category at
// each peak, and what the fix costs in recomputation.
type fixesPane struct {
	backend  Backend
	base     *Workload // the workload as recorded; nil when the snapshot is not oomdbg's own
	choice   [numFixRows]int
	selected int
	before   *runSummary
	after    *runSummary
	afterIx  *index
	running  context.CancelFunc
	progress *snapshot.Snapshot // the re-run as it streams in
	stream   *stream
	budget   int64 // the memory the re-run's events may take (the view's memory budget)
	err      error
	fit      fitList    // the plans that fit (fitplans.go)
	trace    traceFixes // the pane on a snapshot that is not oomdbg's own (tracefixes.go)

	rec         recommendation
	beforeLeak  *leaks.Result // the loaded run's leak analysis
	afterNeeds  int64         // what the re-run needs, measured; 0 until known
	afterFixes  Fixes         // the re-run's settings, whose measurement afterNeeds takes
	focusRanked bool          // ↑↓ move in the ranked fixes rather than the settings
	moved       bool          // ↑↓ were pressed in the pane: the focus is the user's
	scroll      scroller      // the pane's page, when taller than its room
	reveal      bool          // bring the comparison into view at the next draw (a re-run ended)
	run         int           // the number of the re-run running or last run (rerun.go)
}

// newFixesPane is the pane for workload w (nil: none, the snapshot is not oomdbg's own), whose re-runs stop at
// the memory budget (0: DefaultMemoryBudget).
func newFixesPane(w *Workload, b Backend, budget int64) fixesPane {
	p := fixesPane{backend: b, budget: cmp.Or(budget, DefaultMemoryBudget)}
	if w != nil && b != nil {
		c := *w
		p.base = &c
		p.reset()
	}
	return p
}

// setBaseline takes the loaded run as the "before" of the comparison.
func (p *fixesPane) setBaseline(ix *index) {
	if ix == nil {
		return
	}
	p.trace.snap = ix.snap
	if p.base == nil && p.backend != nil && len(ix.snap.Meta.Workload) > 0 && ix.snap.Meta.Source == "oomdbg" {
		if w, err := p.backend.Parse(ix.snap.Meta.Workload); err == nil {
			p.base = &w
			p.reset()
		}
	}
	if ix.len() > 0 {
		p.before = summarize(ix)
	}
}

// onKey answers a key in a pane h lines high; the re-runs and searches it starts end with ctx.
func (p *fixesPane) onKey(ctx context.Context, msg tea.KeyPressMsg, k KeyMap, h int) action {
	if p.base == nil {
		return p.trace.onKey(ctx, msg, k, h)
	}
	if p.fit.open && key.Matches(msg, k.PageUp, k.PageDown) {
		p.fit.selected, _ = listMove(msg, k, p.fit.selected, len(p.fit.plans), h-3)
		return action{}
	}
	if a, ok := p.fitKey(ctx, msg, k); ok {
		return a
	}
	r := &p.rec
	if key.Matches(msg, k.Up, k.Down) {
		p.moved = true
	}
	switch {
	case key.Matches(msg, k.PageUp, k.PageDown):
		p.scroll.onKey(msg, k, h)
	case p.focusRanked && key.Matches(msg, k.Up):
		r.selected = max(r.selected-1, 0)
	case p.focusRanked && key.Matches(msg, k.Down):
		if r.selected++; r.selected >= len(r.ranked) {
			r.selected, p.focusRanked = len(r.ranked)-1, false
		}
	case p.focusRanked && key.Matches(msg, k.Detail, k.Toggle):
		return p.apply(ctx, r.ranked[r.selected])
	case key.Matches(msg, k.Apply):
		if b := r.best(); b != nil {
			return p.apply(ctx, *b)
		}
		return say("no fix fits with the " + headroom.Percent(headroom.DefaultMargin) + " margin yet")
	case key.Matches(msg, k.Up):
		if p.selected == 0 && len(r.ranked) > 0 {
			p.focusRanked = true
		}
		p.selected = max(p.selected-1, 0)
	case key.Matches(msg, k.Down):
		p.selected = max(min(p.selected+1, len(p.rows())-1), 0)
	case key.Matches(msg, k.Toggle, k.Detail):
		if rows := p.rows(); p.selected < len(rows) {
			row := rows[p.selected]
			p.choice[row] = (p.choice[row] + 1) % len(p.choices(row))
		}
	case key.Matches(msg, k.Back):
		if p.running != nil {
			p.cancel()
			return say("re-run cancelled")
		}
	case key.Matches(msg, k.Rerun):
		if p.running != nil {
			p.cancel()
			return say("re-run cancelled")
		}
		return p.start(ctx)
	}
	return action{}
}

// apply chooses a measured fix's settings, or a plan's, and re-runs with them.
func (p *fixesPane) apply(ctx context.Context, f Measured) action {
	p.cancel()
	if f.plan != nil {
		return p.applyPlan(ctx, *f.plan)
	}
	p.choose(f.Fixes)
	return p.start(ctx)
}

// start re-runs the workload with the chosen settings, and measures what it needs.
func (p *fixesPane) start(ctx context.Context) action {
	ctx, cancel := context.WithCancel(ctx)
	p.running, p.err, p.after, p.afterIx = cancel, nil, nil, nil
	p.progress = nil
	w := p.config()
	return action{status: "re-running with " + p.describe() + " on the meta device…",
		cmd: tea.Batch(p.rerun(ctx, w), p.measureAfter(ctx, w))}
}

// cancel stops the re-run running, if any: what it still sends is no longer awaited.
func (p *fixesPane) cancel() {
	if p.running != nil {
		p.running()
		p.running, p.progress = nil, nil
		p.run++
	}
}

func (p *fixesPane) afterIndex() *index {
	if p.base == nil {
		return p.trace.shown
	}
	return p.afterIx
}

// view draws the pane: the ranked fixes, the comparison of the last re-run, and the settings, scrolled as one
// page when they are taller than the pane, the row ↑↓ moves in kept in view.
func (p *fixesPane) view(s Styles, w, h int) string {
	if p.base == nil {
		return p.trace.view(s, w, h)
	}
	if p.fit.open {
		return strings.Join(p.scroll.view(s, p.fitView(s, w), w, h, p.fit.selected+1), "\n")
	}
	ranked := 3
	if h >= 24 {
		ranked = 8
	}
	lines := p.rankedView(s, w, ranked)
	keep := -1
	if p.focusRanked { // the ranked block starts the page: its last line in view shows it whole
		keep = len(lines) - 1
	}
	comparison := len(lines)
	lines = append(lines, p.comparison(s, w)...)
	lines = append(lines, s.Muted.Render(ansi.Truncate("↑↓ choose, space change, r re-run on the meta device (r or esc again cancels)"+p.fitHint(), w, "…")))
	for i, r := range p.rows() {
		line := fmt.Sprintf("%-21s %s", fixRowNames[r], choiceCells(p.choices(r), p.choice[r], w-22))
		line = ansi.Truncate(line, w, "…")
		if i == p.selected && !p.focusRanked {
			line = s.Selected.Render(padRight(line, w))
			keep = len(lines)
		}
		lines = append(lines, line)
	}
	if p.reveal { // a re-run just ended: its comparison comes into view
		p.scroll.top, p.scroll.kept, p.reveal = comparison, keep, false
	}
	return strings.Join(p.scroll.view(s, lines, w, h, keep), "\n")
}

// onRanked puts ↑↓ on the ranked fixes once they are measured, unless the user has moved in the settings:
// the list the pane opens on is the one the keys move in.
func (p *fixesPane) onRanked() {
	if !p.moved && len(p.rec.ranked) > 0 {
		p.focusRanked = true
	}
}
