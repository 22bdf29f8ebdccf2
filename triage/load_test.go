package triage

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestLoadAdvice: a peak set in the load phase gets the fix of loading a checkpoint already quantized, saving
// the peak less the highest of the other phases; a peak set elsewhere, or a load that no other phase stays
// under, gets none.
func TestLoadAdvice(t *testing.T) {
	its := []Iteration{
		{Iteration: -1, Phases: []Phase{{Name: "load", PeakAllocated: 900}, {Name: "setup", PeakAllocated: 500}}},
		{Iteration: 0, Phases: []Phase{{Name: "forward", PeakAllocated: 700}, {Name: "backward", PeakAllocated: 650}}},
	}
	r := &Report{Peak: Peak{Allocated: 900, Phase: "load", Iteration: -1}, Iterations: its}
	a, ok := loadAdvice(r)
	if !ok || a.Saving != 200 || !strings.Contains(a.Why, "--load none") {
		t.Errorf("load peak: %+v, %v", a, ok)
	}
	r.Peak.Phase = "forward"
	if _, ok := loadAdvice(r); ok {
		t.Error("advice for a peak in forward")
	}
	r.Peak.Phase, its[1].Phases[0].PeakAllocated = "load", 900
	if _, ok := loadAdvice(r); ok {
		t.Error("advice for a load no lower than the training's peak")
	}
	if got := Where(-1, snapshot.PhaseLoad); got != "load" {
		t.Errorf("Where(-1, load) = %q", got)
	}
}
