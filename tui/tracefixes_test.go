package tui

import (
	"context"
	"strings"
	"testing"

	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// The what-if pane replays every fix and ranks them: those that fit first, by what they keep, then the
// others; a fix the trace lacks the tags for is listed as refused, never guessed.
func TestTraceFixesRanksWhatFits(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	// 3 MiB for the allocator: the trace as recorded reserves 4 MiB; SGD and momentum, without Adam's
	// second state and step temporaries, need 2, and so does 8-bit AdamW, its states a quarter the size.
	d := &s.Meta.Devices[0]
	d.Capacity = d.ContextReserve + 3<<20
	msg := runTraceFixes(context.Background(), s)().(traceFixesMsg)
	if msg.err != nil {
		t.Fatal(msg.err)
	}
	if len(msg.results) != len(traceFixOptions()) {
		t.Fatalf("%d results for %d fixes", len(msg.results), len(traceFixOptions()))
	}
	var replayed int
	for i, r := range msg.results {
		if r.err == nil {
			replayed++
		}
		if i == 0 {
			continue
		}
		prev := msg.results[i-1]
		if checkpoint := strings.HasPrefix(r.fix.name, "checkpoint"); r.err == nil && (r.held != nil) != checkpoint {
			t.Errorf("%s: a replay held late %v; want one for checkpointing only", r.fix.name, r.held != nil)
		}
		switch {
		case r.fits() && !prev.fits():
			t.Errorf("%s fits but comes after %s, which does not", r.fix.name, prev.fix.name)
		case r.fits() && prev.fits() && r.fix.rank < prev.fix.rank:
			t.Errorf("%s keeps more than %s but comes after it", r.fix.name, prev.fix.name)
		}
	}
	if replayed == 0 {
		t.Fatal("no fix was replayed on a trace with every tag")
	}
	if got := msg.results[0].fix.name + ", " + msg.results[1].fix.name + ", " + msg.results[2].fix.name; got != "adamw8bit, momentum, sgd" ||
		!msg.results[2].fits() || msg.results[3].fits() {
		t.Errorf("ranked first: %s; want adamw8bit, momentum, sgd, the only fixes that fit", got)
	}
	p := traceFixes{snap: s}
	p.onResult(msg)
	view := p.view(DefaultStyles(colorprofile.Ascii), 160, 30)
	for _, f := range traceFixOptions() {
		if !strings.Contains(view, f.name) {
			t.Errorf("the pane does not show %s:\n%s", f.name, view)
		}
	}
	// A fix at the edge says so, and why, when chosen.
	for i := range p.results {
		if p.results[i].fix.name == "checkpoint all" {
			p.results[i].edge, p.selected = true, i
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
