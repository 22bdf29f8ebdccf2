package fit_test

import (
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// small is a GPT small enough that every combination of fixes can be run in a test: 4 blocks, d_model 256,
// sequence 512, batch 8, on a card where the configuration as given does not fit and some plans do.
func small(t testing.TB) train.Config {
	cfg := preset(t, "gpt2-small", 1, func(c *train.Config) {
		c.Layers, c.DModel, c.Heads, c.Seq, c.Vocab, c.Batch = 4, 256, 4, 512, 8192, 8
	})
	cfg.GPUMemory, cfg.ContextReserve = 900<<20, 0
	return cfg
}

// fitsRun is fitsByRun for a whole configuration.
func fitsRun(t *testing.T, cfg train.Config) bool {
	t.Helper()
	return fitsByRun(t, cfg, cfg.Batch)
}

// TestPlansHoldAgainstRuns: every plan reported to fit does when run, and each plan skipped is dominated by
// one that fits and costs no more.
func TestPlansHoldAgainstRuns(t *testing.T) {
	cfg := small(t)
	if fitsRun(t, cfg) {
		t.Fatal("the configuration fits as given: the test needs one that does not")
	}
	g, err := fit.LookupGPU("a100-80g")
	if err != nil {
		t.Fatal(err)
	}
	ps, err := fit.FindPlans(context.Background(), cfg, fit.PlanOptions{GPU: g, Top: 1000})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d combinations, %d tried, %d skipped, %d fit", ps.Considered, len(ps.Tried), len(ps.Skipped), len(ps.Fitting))
	if len(ps.Fitting) == 0 || len(ps.Skipped) == 0 {
		t.Fatalf("%d plans fit and %d were skipped: the test needs both", len(ps.Fitting), len(ps.Skipped))
	}
	for _, p := range ps.Fitting {
		if !fitsRun(t, p.Config) {
			t.Errorf("%s: reported to fit, does not when run", p.Name())
		}
	}
	// A skipped plan saves at least as much as a plan that fits and is estimated to cost at least as much.
	for _, p := range ps.Skipped {
		if p.Skipped == fit.SkippedFailsAlike {
			if fitsRun(t, p.Config) {
				t.Errorf("%s: skipped as failing like %s, fits when run", p.Name(), p.Because.Name())
			}
			continue
		}
		if p.Skipped != fit.SkippedDominated || p.Because == nil || !p.Because.Fits {
			t.Errorf("%s: skipped (%s) for %v", p.Name(), p.Skipped, p.Because)
			continue
		}
		if fit.Estimate(p.Config, g).Total() < fit.Estimate(p.Because.Config, g).Total() {
			t.Errorf("%s: skipped for %s, which is estimated to cost more", p.Name(), p.Because.Name())
		}
	}
	for i := 1; i < len(ps.Fitting); i++ {
		if ps.Fitting[i].StepTime() < ps.Fitting[i-1].StepTime() {
			t.Errorf("plan %d (%.4f s) is listed after plan %d (%.4f s)", i+1, ps.Fitting[i].StepTime(), i, ps.Fitting[i-1].StepTime())
		}
	}
	// Every plan keeps the effective batch.
	for _, p := range append(ps.Fitting, ps.Skipped...) {
		if p.Config.Batch*p.Config.Accum != cfg.Batch*cfg.Accum {
			t.Errorf("%s: effective batch %d x %d, want %d", p.Name(), p.Config.Batch, p.Config.Accum, cfg.Batch*cfg.Accum)
		}
		if p.Config.Device != device.Meta && p.Config.Device != cfg.Device {
			t.Errorf("%s: device %s", p.Name(), p.Config.Device)
		}
	}
}
