package triage_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/triage"
)

// run is a hand-made report of a run's phases: each iteration's phases and their peaks, in bytes.
func run(complete int, oom *triage.OOM, iterations ...[]triage.Phase) *triage.Report {
	r := &triage.Report{OOM: oom, Leaks: triage.Leaks{Iterations: complete, Verdict: "inconclusive"}}
	for i, phases := range iterations {
		r.Iterations = append(r.Iterations, triage.Iteration{Iteration: int32(i - 1), Phases: phases})
	}
	return r
}

func phase(name string, peak int64) triage.Phase {
	return triage.Phase{Name: name, PeakAllocated: peak}
}

// TestDiffSaysOneRunDiedFirst: a run that ran out of memory in iteration 0 against one that finished: the
// diff says so before it compares phases, compares them over what both reached (setup and iteration 0:
// the data phase of iteration 1, which holds the optimizer state, is not set against iteration 0's), and
// calls a phase the first never reached not reached rather than 0 B.
func TestDiffSaysOneRunDiedFirst(t *testing.T) {
	died := run(0, &triage.OOM{Iteration: 0, Phase: "forward"},
		[]triage.Phase{phase("setup", 100)},
		[]triage.Phase{phase("data", 110), phase("forward", 1000)})
	finished := run(2, nil,
		[]triage.Phase{phase("setup", 100)},
		[]triage.Phase{phase("data", 110), phase("forward", 600), phase("backward", 700), phase("optimizer", 800)},
		[]triage.Phase{phase("data", 510), phase("forward", 900), phase("backward", 1000), phase("optimizer", 1000)})
	c := triage.Diff(died, finished)
	if c.Reached != 0 || !strings.Contains(c.Uneven, "a ran out of memory in iteration 0, forward, and never reached iteration 1 (0 complete)") ||
		!strings.Contains(c.Uneven, "b ran to iteration 1 (2 complete)") {
		t.Errorf("reached %d: %q", c.Reached, c.Uneven)
	}
	want := map[string]triage.Change{
		"setup":     {Name: "setup", A: 100, B: 100},
		"data":      {Name: "data", A: 110, B: 110},
		"forward":   {Name: "forward", A: 1000, B: 600},
		"backward":  {Name: "backward", B: 700, NotInA: true},
		"optimizer": {Name: "optimizer", B: 800, NotInA: true},
	}
	if len(c.Phases) != len(want) {
		t.Errorf("phases %+v", c.Phases)
	}
	for _, ch := range c.Phases {
		if ch != want[ch.Name] {
			t.Errorf("%s: %+v, want %+v", ch.Name, ch, want[ch.Name])
		}
	}
	var text bytes.Buffer
	if err := c.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	out := text.String()
	if i, j := strings.Index(out, "NOT ALIKE: a ran out of memory"), strings.Index(out, "PHASES"); i < 0 || j < i ||
		!strings.Contains(out, "backward   not reached") {
		t.Errorf("the diff does not say it before the phases:\n%s", out)
	}
	// Runs that reached the same iteration are compared over all of them, without a word.
	if c := triage.Diff(finished, finished); c.Uneven != "" || c.Phases[1].A != 510 {
		t.Errorf("alike: %q, %+v", c.Uneven, c.Phases)
	}
}
