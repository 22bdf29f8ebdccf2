package tui

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// traceFixes is the fixes pane on a snapshot oomdbg did not record (a PyTorch trace): each fix transforms the
// trace and replays it through the allocator model, as oomdbg whatif does, all in the background; the
// results are ranked, those that make the run fit first, by how much of the batch and speed they keep, and
// the selected one's trace is drawn over the timeline, phase by phase.
type traceFixes struct {
	snap     *snapshot.Snapshot
	results  []traceFixResult
	selected int
	running  context.CancelFunc
	err      error
	shown    *index // the selected fix's trace, drawn over the timeline
}

// traceFix is one fix the pane offers.
type traceFix struct {
	name  string
	keeps string // what it keeps of the run: the batch, the speed, the training
	rank  int    // smaller keeps more
	ts    []transform.Transform
	conf  string // allocator settings to replay under; "" keeps the recorded ones
}

func traceFixOptions() []traceFix {
	return []traceFix{
		{"expandable segments", "keeps everything", 0, nil, "expandable_segments:True"},
		{"zero_grad set_to_none", "keeps everything", 0, []transform.Transform{transform.ZeroGrad(knob.ZeroGradNone)}, ""},
		{"adam for-loop", "keeps the training, a slower step", 1, []transform.Transform{transform.OptimizerImpl(knob.ForLoop)}, ""},
		{"adamw8bit", "keeps the batch, 8-bit optimizer state", 1, []transform.Transform{transform.SwitchOptimizer(knob.AdamW8bit)}, ""},
		{"checkpoint every:2", "keeps the batch, recomputes half the blocks", 1, []transform.Transform{transform.Checkpoint(knob.CheckpointEvery(2))}, ""},
		{"checkpoint all", "keeps the batch, about a third more compute", 2, []transform.Transform{transform.Checkpoint(knob.CheckpointAll)}, ""},
		{"accumulate 2", "keeps the effective batch, 2 micro-steps", 3, []transform.Transform{transform.Accumulate(2)}, ""},
		{"accumulate 4", "keeps the effective batch, 4 micro-steps", 4, []transform.Transform{transform.Accumulate(4)}, ""},
		{"momentum", "keeps the batch, changes the optimizer", 5, []transform.Transform{transform.SwitchOptimizer(knob.Momentum)}, ""},
		{"sgd", "keeps the batch, changes the optimizer", 6, []transform.Transform{transform.SwitchOptimizer(knob.SGD)}, ""},
		{"batch x0.5", "halves the batch", 7, []transform.Transform{transform.BatchScale(0.5)}, ""},
	}
}

// traceFixResult is one fix replayed.
type traceFixResult struct {
	fix             traceFix
	before, after   replay.Outcome
	held            *replay.Outcome // the replay with the releases the trace does not record held late; nil without
	capacity        uint64
	assumptions     []string
	err             error
	beforeOOM, oom  bool
	edge            bool // fits at one end of the releases the trace does not record, not at the other
	unrecordedAfter bool // the trace ends in an OOM: what came after it was never recorded
}

// fits reports whether the run fits after the fix, as far as the trace goes, wherever the releases it does
// not record lie.
func (r traceFixResult) fits() bool { return r.err == nil && r.capacity > 0 && !r.oom && !r.edge }

type (
	traceFixesMsg struct {
		results []traceFixResult
		err     error
	}
	traceFixShowMsg struct {
		ix  *index
		err error
	}
)

// runTraceFixes replays every fix of s in the background.
func runTraceFixes(ctx context.Context, s *snapshot.Snapshot) tea.Cmd {
	return func() tea.Msg {
		recorded, _ := replay.RecordedSettings(s)
		w, _, err := whatif.Before(s, recorded, 0)
		if err != nil {
			return traceFixesMsg{err: err}
		}
		beforeOOM, _ := whatif.Fails(w.Outcome)
		var out []traceFixResult
		for _, f := range traceFixOptions() {
			if ctx.Err() != nil {
				return traceFixesMsg{err: ctx.Err()}
			}
			r := traceFixResult{fix: f, before: w.Outcome, capacity: w.Capacity, beforeOOM: beforeOOM,
				unrecordedAfter: w.RecordedOOMs > 0}
			cfg := recorded
			if f.conf != "" {
				cfg, _ = allocator.ParseConfig(f.conf)
			}
			// The pane shows the late end only as a verdict at the edge, which needs a capacity.
			prepare := whatif.Prepare
			if w.Capacity == 0 {
				prepare = whatif.PrepareEstimate
			}
			var prep *whatif.Prepared
			if prep, r.err = prepare(s, f.ts...); r.err == nil {
				r.assumptions = prep.Assumptions
				var res whatif.Result
				if res, r.err = prep.Replay(cfg, w.Device, w.Capacity); r.err == nil {
					r.after, r.held, r.edge = res.After, res.Held, res.Edge()
					r.oom, _ = whatif.Fails(res.After)
				}
			}
			out = append(out, r)
		}
		// Those that fit first, by what they keep; then those at the edge, and the others, lowest peak first.
		slices.SortStableFunc(out, func(a, b traceFixResult) int {
			switch {
			case a.fits() != b.fits():
				if a.fits() {
					return -1
				}
				return 1
			case a.fits():
				return cmp.Compare(a.fix.rank, b.fix.rank)
			case (a.err == nil) != (b.err == nil):
				if a.err == nil {
					return -1
				}
				return 1
			case a.edge != b.edge:
				if a.edge {
					return -1
				}
				return 1
			}
			return cmp.Compare(a.after.PeakReserved, b.after.PeakReserved)
		})
		return traceFixesMsg{results: out}
	}
}

func (p *traceFixes) onKey(msg tea.KeyPressMsg, m *Model) tea.Cmd {
	k := m.keys
	switch {
	case key.Matches(msg, k.Up, k.Down):
		p.selected = listStep(msg, k, p.selected, len(p.results))
	case key.Matches(msg, k.Toggle, k.Detail):
		// The fix's trace is made again to be drawn: the pane keeps each fix's outcome, not its trace, so
		// that a long trace and its eleven fixes do not take eleven copies of memory.
		if p.selected < len(p.results) && p.results[p.selected].err == nil && p.snap != nil {
			s, fix := p.snap, p.results[p.selected].fix
			m.setStatus("drawing "+fix.name+" over the timeline…", false)
			return func() tea.Msg {
				changed, _, err := transform.Apply(s, fix.ts...)
				if err != nil {
					return traceFixShowMsg{err: err}
				}
				return traceFixShowMsg{ix: newIndex(changed)}
			}
		}
	case key.Matches(msg, k.Back):
		if p.running != nil {
			p.running()
			p.running = nil
			m.setStatus("what-if cancelled", false)
		}
	case key.Matches(msg, k.Rerun):
		if p.running != nil {
			p.running()
			p.running = nil
			m.setStatus("what-if cancelled", false)
			return nil
		}
		if p.snap == nil {
			return nil
		}
		ctx, cancel := context.WithCancel(m.ctx)
		p.running, p.err = cancel, nil
		m.setStatus("replaying the trace under each fix…", false)
		return runTraceFixes(ctx, p.snap)
	}
	return nil
}

func (p *traceFixes) onResult(msg traceFixesMsg) {
	p.running = nil
	p.results, p.err, p.selected = msg.results, msg.err, 0
}

func (p *traceFixes) view(s Styles, w, h int) string {
	cut := func(t string) string { return ansi.Truncate(t, w, "…") }
	lines := []string{s.Muted.Render(cut("what if: r replays this trace under each fix (the allocator model, as oomdbg whatif); ↑↓ choose, space draws it over the timeline"))}
	switch {
	case p.running != nil:
		lines = append(lines, cut("replaying…"))
	case p.err != nil:
		lines = append(lines, cut("what-if: "+p.err.Error()))
	case len(p.results) == 0:
		lines = append(lines, s.Muted.Render(cut("nothing replayed yet")))
	}
	if len(p.results) > 0 {
		r0 := p.results[0]
		verdict := "fits"
		switch {
		case r0.capacity == 0:
			verdict = "capacity unknown"
		case r0.beforeOOM:
			verdict = "out of memory"
		}
		lines = append(lines, cut(fmt.Sprintf("as recorded: peak %s allocated, %s reserved, %s", units.FormatSize(r0.before.PeakAllocated),
			units.FormatSize(r0.before.PeakReserved), verdict)))
		if r0.unrecordedAfter {
			lines = append(lines, s.Muted.Render(cut("the trace ends in its OOM: what would have come after was never recorded")))
		}
	}
	for i, r := range p.results {
		var line string
		switch {
		case r.err != nil:
			why := r.err.Error()
			if _, after, ok := strings.Cut(why, " needs "); ok {
				why = "needs " + after
			}
			line = fmt.Sprintf("%-20s refused: %s", r.fix.name, why)
		default:
			verdict := "OOM"
			switch {
			case r.capacity == 0:
				verdict = "?"
			case r.edge:
				verdict = "edge"
			case !r.oom:
				verdict = "fits"
			}
			line = fmt.Sprintf("%-20s %-5s %11s alloc %11s reserved  %s", r.fix.name, verdict,
				units.FormatSize(r.after.PeakAllocated), units.FormatSize(r.after.PeakReserved), r.fix.keeps)
		}
		line = cut(line)
		if i == p.selected {
			line = s.Selected.Render(padRight(line, w))
		}
		lines = append(lines, line)
	}
	if p.selected < len(p.results) && p.results[p.selected].edge {
		lines = append(lines, cut("at the edge: fits if what a checkpointed block saved is released once its first reader returns, "+
			"not if held until the function that made it returns; the trace does not say which"))
	}
	if p.selected < len(p.results) && len(p.results[p.selected].assumptions) > 0 {
		lines = append(lines, s.Muted.Render(cut("assumes: "+strings.Join(p.results[p.selected].assumptions, "; "))))
	}
	if len(lines) > h {
		lines = lines[:h]
	}
	return strings.Join(lines, "\n")
}
