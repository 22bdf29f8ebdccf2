package fit_test

import (
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
)

// TestExplainFinders: on gpt2-small, whose largest batch on 24 GiB is no power of two, halving from 64 settles
// below it, on a batch that fits while twice it does not (checked by runs), and doubling then bisecting finds
// the maximum in more trials than fit takes from the configured batch.
func TestExplainFinders(t *testing.T) {
	cfg := preset(t, "gpt2-small", 24, nil)
	s, err := fit.MaxBatch(context.Background(), cfg, fit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	e, err := fit.Explain(context.Background(), cfg, fit.Options{})
	if err != nil {
		t.Fatal(err)
	}
	h := e.Halving.Batch
	t.Logf("max %d in %d trials (%d steps); halving %d in %d; doubling %d in %d (%d steps)", s.MaxBatch, len(s.Trials), s.Steps,
		h, e.Halving.Trials, e.Doubling.Batch, e.Doubling.Trials, e.Doubling.Steps)
	if s.MaxBatch&(s.MaxBatch-1) == 0 {
		t.Fatalf("the maximum %d is a power of two: the comparison shows nothing", s.MaxBatch)
	}
	if h >= s.MaxBatch || h&(h-1) != 0 || !fitsByRun(t, cfg, h) || fitsByRun(t, cfg, 2*h) {
		t.Errorf("halving settled on %d: want the power of two that fits while twice it does not, below %d", h, s.MaxBatch)
	}
	if e.Doubling.Batch != s.MaxBatch || e.Doubling.Trials < len(s.Trials) || e.Doubling.Steps != 3*e.Doubling.Trials {
		t.Errorf("doubling found %d in %d trials (%d steps); fit %d in %d", e.Doubling.Batch, e.Doubling.Trials, e.Doubling.Steps, s.MaxBatch, len(s.Trials))
	}
	if len(e.Savings) != 3 {
		t.Fatalf("%d savings, want bf16, checkpointing and accumulation", len(e.Savings))
	}
	for _, sv := range e.Savings {
		if sv.SavedShare <= 0 || sv.SavedShare >= 1 {
			t.Errorf("%s saves %.2f of the memory", sv.Fix, sv.SavedShare)
		}
	}
}
