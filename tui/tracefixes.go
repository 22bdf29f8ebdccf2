package tui

import (
	"context"
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif"
)

// traceFixes is the fixes pane on a snapshot oomdbg did not record (a PyTorch trace): each fix of the
// what-if's catalogue transforms the trace and replays it through the allocator model, as oomdbg whatif
// does, all in the background; the results come ranked, those that make the run fit first, by how much of
// the batch and speed they keep, and the selected one's trace is drawn over the timeline, phase by phase.
type traceFixes struct {
	snap     *snapshot.Snapshot
	before   *whatif.Baseline // the trace replayed as recorded
	results  []whatif.Outcome
	selected int
	running  context.CancelFunc
	err      error
	shown    *index   // the selected fix's trace, drawn over the timeline
	scroll   scroller // the list, when taller than the pane
}

type (
	traceFixesMsg struct {
		before  *whatif.Baseline
		results []whatif.Outcome
		err     error
	}
	traceFixShowMsg struct {
		ix  *index
		err error
	}
)

// runTraceFixes replays every fix of the catalogue on s in the background.
func runTraceFixes(ctx context.Context, s *snapshot.Snapshot) tea.Cmd {
	return func() tea.Msg {
		b, out, err := whatif.EvaluateAll(ctx, s, whatif.Catalogue(), 0)
		return traceFixesMsg{before: b, results: out, err: err}
	}
}

// onKey answers a key in a pane h lines high; the replays it starts end with ctx.
func (p *traceFixes) onKey(ctx context.Context, msg tea.KeyPressMsg, k KeyMap, h int) action {
	if sel, ok := listMove(msg, k, p.selected, len(p.results), h-4); ok {
		p.selected = sel
		return action{}
	}
	switch {
	case key.Matches(msg, k.Toggle, k.Detail):
		// The fix's trace is made again to be drawn: the pane keeps each fix's outcome, not its trace, so
		// that a long trace and its eleven fixes do not take eleven copies of memory.
		if p.selected < len(p.results) && p.results[p.selected].Err == nil && p.snap != nil {
			s, fix := p.snap, p.results[p.selected].Fix
			return action{status: "drawing " + fix.Name + " over the timeline…", cmd: func() tea.Msg {
				changed, err := fix.Trace(s)
				if err != nil {
					return traceFixShowMsg{err: err}
				}
				return traceFixShowMsg{ix: newIndex(changed)}
			}}
		}
	case key.Matches(msg, k.Back):
		if p.running != nil {
			p.running()
			p.running = nil
			return say("what-if cancelled")
		}
	case key.Matches(msg, k.Rerun):
		if p.running != nil {
			p.running()
			p.running = nil
			return say("what-if cancelled")
		}
		if p.snap == nil {
			return action{}
		}
		ctx, cancel := context.WithCancel(ctx)
		p.running, p.err = cancel, nil
		return action{status: "replaying the trace under each fix…", cmd: runTraceFixes(ctx, p.snap)}
	}
	return action{}
}

// onResult takes the replays.
func (p *traceFixes) onResult(msg traceFixesMsg) action {
	p.running = nil
	p.before, p.results, p.err, p.selected = msg.before, msg.results, msg.err, 0
	if msg.err != nil {
		return action{status: "what-if: " + msg.err.Error(), isErr: true}
	}
	return say("what-if done: the fixes that fit come first")
}

// onShow takes the selected fix's trace, to be drawn over the timeline.
func (p *traceFixes) onShow(msg traceFixShowMsg) action {
	if msg.err != nil {
		return action{status: "what-if: " + msg.err.Error(), isErr: true}
	}
	p.shown = msg.ix
	return say("the • curve is the fix's trace, phase by phase")
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
	if b := p.before; b != nil && len(p.results) > 0 {
		w := b.Worst
		oom, _ := whatif.Fails(w.Outcome)
		verdict := headroom.Judge(w.Outcome.PeakReserved, oom, int64(w.Capacity), b.Margin).Word
		switch verdict {
		case headroom.Unknown:
			verdict = "capacity unknown"
		case headroom.OOM:
			verdict = "out of memory"
		}
		lines = append(lines, cut(fmt.Sprintf("as recorded: peak %s allocated, %s reserved, %s", units.FormatSize(w.Outcome.PeakAllocated),
			units.FormatSize(w.Outcome.PeakReserved), verdict)))
		if w.RecordedOOMs > 0 {
			lines = append(lines, s.Muted.Render(cut("the trace ends in its OOM: what would have come after was never recorded")))
		}
	}
	keep := -1
	for i, r := range p.results {
		var line string
		switch {
		case r.Err != nil:
			line = fmt.Sprintf("%-20s refused: %s", r.Fix.Name, refusal(r))
		default:
			line = fmt.Sprintf("%-20s %-5s %11s alloc %11s reserved  %s", r.Fix.Name, verdictWord(r.Report.Verdict),
				units.FormatSize(r.Report.After.PeakAllocated), units.FormatSize(r.Report.After.PeakReserved), r.Fix.Keeps)
		}
		line = cut(line)
		if i == p.selected {
			line = s.Selected.Render(padRight(line, w))
			keep = len(lines)
		}
		lines = append(lines, line)
	}
	if b := p.before; b != nil && len(p.results) > 0 {
		for _, l := range wrapWords(verdictLegend(b.Worst.Capacity, b.Margin), w) {
			lines = append(lines, s.Muted.Render(l))
		}
	}
	if p.selected < len(p.results) && p.results[p.selected].Err != nil { // the reason in full, not cut to the row
		lines = append(lines, wrapWords("refused: "+refusal(p.results[p.selected]), w)...)
	}
	if sel := p.chosen(); sel != nil && sel.Verdict == whatif.VerdictEdge {
		lines = append(lines, cut("at the edge: fits if what a checkpointed block saved is released once its first reader returns, "+
			"not if held until the function that made it returns; the trace does not say which"))
	}
	if sel := p.chosen(); sel != nil && len(sel.Assumptions) > 0 {
		lines = append(lines, s.Muted.Render(cut("assumes: "+strings.Join(sel.Assumptions, "; "))))
	}
	return strings.Join(p.scroll.view(s, lines, w, h, keep), "\n")
}

// chosen is the selected fix's report; nil when there is none or the trace could not take it.
func (p *traceFixes) chosen() *whatif.Report {
	if p.selected < len(p.results) && p.results[p.selected].Err == nil {
		return p.results[p.selected].Report
	}
	return nil
}

// verdictWord is a what-if verdict in the pane's column: "?" where no capacity is known (verdictLegend says
// so under the list).
func verdictWord(v string) string {
	switch v {
	case whatif.VerdictUnknown:
		return "?"
	case whatif.VerdictOOM:
		return "OOM"
	}
	return v
}

// verdictLegend says what the verdict column means: the headroom rule on the capacity, or, without one, what
// "?" stands for.
func verdictLegend(capacity uint64, margin float64) string {
	if capacity == 0 {
		return "?: no capacity is known to judge against (a PyTorch snapshot does not record the card's); " +
			"oomdbg whatif --gpu-mem gives one"
	}
	return headroom.Rule(int64(capacity), margin)
}

// refusal says why the trace could not take a fix, without the fix's name the row already shows.
func refusal(r whatif.Outcome) string {
	why := strings.TrimPrefix(r.Err.Error(), r.Fix.Name+": ")
	if _, after, ok := strings.Cut(why, " needs "); ok && strings.HasPrefix(why, r.Fix.Name) {
		why = "needs " + after
	}
	return why
}

// wrapWords breaks text into lines of at most w cells at spaces (a word longer than w is cut).
func wrapWords(text string, w int) []string {
	var out []string
	line := ""
	for _, word := range strings.Fields(text) {
		switch {
		case line == "":
			line = word
		case ansi.StringWidth(line)+1+ansi.StringWidth(word) <= w:
			line += " " + word
		default:
			out = append(out, ansi.Truncate(line, w, "…"))
			line = word
		}
	}
	if line != "" {
		out = append(out, ansi.Truncate(line, w, "…"))
	}
	return out
}
