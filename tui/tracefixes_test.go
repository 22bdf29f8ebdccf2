package tui

import (
	"context"
	"strings"
	"testing"

	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// The what-if pane shows every fix of the catalogue, and a fix at the edge says so, and why, when chosen.
func TestTraceFixesShowsEachFix(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	// 3 MiB for the allocator: the trace as recorded reserves 4 MiB; SGD and momentum, without Adam's
	// second state and step temporaries, need 2, and so does 8-bit AdamW, its states a quarter the size.
	d := &s.Meta.Devices[0]
	d.Capacity = d.ContextReserve + 3<<20
	msg := runTraceFixes(context.Background(), s)().(traceFixesMsg)
	if msg.err != nil {
		t.Fatal(msg.err)
	}
	p := traceFixes{snap: s}
	p.onResult(msg)
	view := p.view(DefaultStyles(colorprofile.Ascii), 160, 30)
	for _, f := range whatif.Catalogue() {
		if !strings.Contains(view, f.Name) {
			t.Errorf("the pane does not show %s:\n%s", f.Name, view)
		}
	}
	// A fix at the edge says so, and why, when chosen.
	for i := range p.results {
		if p.results[i].Fix.Name == "checkpoint all" {
			p.results[i].Report.Verdict, p.selected = whatif.VerdictEdge, i
		}
	}
	view = p.view(DefaultStyles(colorprofile.Ascii), 160, 30)
	var row []string
	for _, line := range strings.Split(view, "\n") {
		if strings.Contains(line, "checkpoint all") && row == nil {
			row = strings.Fields(line)
		}
	}
	if len(row) < 3 || row[2] != "edge" || !strings.Contains(view, "at the edge: fits if") {
		t.Errorf("a fix at the edge is not shown as such:\n%s", view)
	}
}

// TestTraceFixesExplainTheirVerdicts: the verdict column is explained under the list (the headroom rule
// with its margin, or what "?" means without a capacity), and a fix the trace cannot take (checkpointing an
// inference trace) is refused with its whole reason, not listed as a fix that saves nothing.
func TestTraceFixesExplainTheirVerdicts(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	msg := runTraceFixes(context.Background(), s)().(traceFixesMsg)
	if msg.err != nil {
		t.Fatal(msg.err)
	}
	p := traceFixes{snap: s}
	p.onResult(msg)
	view := p.view(DefaultStyles(colorprofile.Ascii), 80, 40)
	if !strings.Contains(view, "(a 5% margin") {
		t.Errorf("the pane does not state the rule its verdicts follow:\n%s", view)
	}
	// Without a capacity every verdict is "?", and the pane says why.
	s.Meta.Devices[0].Capacity = 0
	msg = runTraceFixes(context.Background(), s)().(traceFixesMsg)
	p = traceFixes{snap: s}
	p.onResult(msg)
	view = p.view(DefaultStyles(colorprofile.Ascii), 80, 40)
	if !strings.Contains(view, "?: no capacity is known") {
		t.Errorf("the pane shows ? without saying what it means:\n%s", view)
	}
	// Checkpointing an inference trace is refused (whatif/transform holds when); the pane says why in full
	// when the row is chosen, at 80 columns.
	for i := range p.results {
		if p.results[i].Fix.Name == "checkpoint all" {
			p.results[i].Report, p.selected = nil, i
			p.results[i].Err = &transform.NothingToCheckpointError{Transform: "checkpoint all", Passes: 2}
		}
	}
	view = p.view(DefaultStyles(colorprofile.Ascii), 80, 40)
	flat := strings.Join(strings.Fields(view), " ")
	if !strings.Contains(flat, "refused: nothing to checkpoint: no backward pass follows the trace's 2 forward passes") ||
		!strings.Contains(flat, "so here it would save nothing") {
		t.Errorf("the refusal is not given in full:\n%s", view)
	}
}
