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
}
