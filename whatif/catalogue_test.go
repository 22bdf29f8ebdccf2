package whatif_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/whatif"
)

// EvaluateAll replays every fix of the catalogue and ranks them: those that fit first, by what they keep,
// then the others; a fix the trace lacks the tags for is listed as refused, never guessed.
func TestEvaluateAllRanksWhatFits(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	// 3 MiB for the allocator: the trace as recorded reserves 4 MiB; SGD and momentum, without Adam's
	// second state and step temporaries, need 2, and so does 8-bit AdamW, its states a quarter the size.
	d := &s.Meta.Devices[0]
	d.Capacity = d.ContextReserve + 3<<20
	_, results, err := whatif.EvaluateAll(context.Background(), s, whatif.Catalogue(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(results) != len(whatif.Catalogue()) {
		t.Fatalf("%d results for %d fixes", len(results), len(whatif.Catalogue()))
	}
	var replayed int
	for i, r := range results {
		if r.Err == nil {
			replayed++
		}
		if i == 0 {
			continue
		}
		prev := results[i-1]
		if checkpoint := strings.HasPrefix(r.Fix.Name, "checkpoint"); r.Err == nil && (r.Report.AfterHeld != nil) != checkpoint {
			t.Errorf("%s: a replay held late %v; want one for checkpointing only", r.Fix.Name, r.Report.AfterHeld != nil)
		}
		switch {
		case r.Fits() && !prev.Fits():
			t.Errorf("%s fits but comes after %s, which does not", r.Fix.Name, prev.Fix.Name)
		case r.Fits() && prev.Fits() && r.Fix.Cost < prev.Fix.Cost:
			t.Errorf("%s keeps more than %s but comes after it", r.Fix.Name, prev.Fix.Name)
		}
	}
	if replayed == 0 {
		t.Fatal("no fix was replayed on a trace with every tag")
	}
	if got := results[0].Fix.Name + ", " + results[1].Fix.Name + ", " + results[2].Fix.Name; got != "adamw8bit, momentum, sgd" ||
		!results[2].Fits() || results[3].Fits() {
		t.Errorf("ranked first: %s; want adamw8bit, momentum, sgd, the only fixes that fit", got)
	}
}

// TestCatalogueRefusesWhatIsAlreadySet: on a trace recorded with expandable segments the catalogue's
// "expandable segments" is refused as already set, not ranked as a fix that keeps everything and saves
// nothing.
func TestCatalogueRefusesWhatIsAlreadySet(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	s.Meta.AllocatorSettings = "expandable_segments:True"
	_, results, err := whatif.EvaluateAll(context.Background(), s, whatif.Catalogue(), 0)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range results {
		if r.Fix.Name != "expandable segments" {
			continue
		}
		var set *whatif.AlreadySetError
		if !errors.As(r.Err, &set) || !strings.Contains(r.Err.Error(), "already set: the trace was recorded with expandable_segments:True") {
			t.Errorf("expandable segments on a trace recorded with them: %v (report %+v)", r.Err, r.Report)
		}
		// Asked for alone, as oomdbg whatif --alloc-conf asks, it is refused too.
		if _, err := whatif.Evaluate(s, whatif.Fix{AllocConf: r.Fix.AllocConf}, 0); !errors.As(err, &set) {
			t.Errorf("--alloc-conf expandable_segments:True on a trace recorded with it: %v", err)
		}
		return
	}
	t.Fatal("the catalogue has no expandable segments")
}
