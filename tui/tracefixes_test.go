package tui

import (
	"context"
	"strings"
	"testing"

	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/whatif"
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
