package fit_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// describe is everything a plan search reports, in order, as text to compare.
func describe(ps *fit.Plans) []string {
	var out []string
	line := func(kind string, p *fit.Plan) {
		out = append(out, fmt.Sprintf("%s %s: tried %v fits %v alloc %d reserved %d headroom %d cost %+v skipped %q",
			kind, p.Name(), p.Tried, p.Fits, p.PeakAllocated, p.PeakReserved, p.Headroom, p.Cost, p.Skipped))
	}
	for _, p := range ps.Fitting {
		line("fitting", p)
	}
	for _, p := range ps.Tried {
		line("tried", p)
	}
	for _, p := range ps.Skipped {
		line("skipped", p)
	}
	return append(out, fmt.Sprintf("considered %d pruned %d steps %d interrupted %v", ps.Considered, ps.Pruned, ps.Steps, ps.Interrupted))
}

// TestPlansSameOnAnyWorkers: a search simulating plans ahead on several goroutines finds what the search
// one trial at a time finds, in the same order, and tells Progress of the same trials in the same order.
func TestPlansSameOnAnyWorkers(t *testing.T) {
	g, err := fit.LookupGPU(fit.DefaultGPU)
	if err != nil {
		t.Fatal(err)
	}
	cases := map[string]struct {
		cfg   train.Config
		allow fit.Allow
		free  bool
		top   int
	}{
		"small GPT, every plan":          {cfg: small(t), top: 1000},
		"small GPT, three plans":         {cfg: small(t), top: 3},
		"small GPT, free batch":          {cfg: small(t), free: true},
		"gpt2-small on 2 GiB, none fits": {cfg: preset(t, "gpt2-small", 2, nil)},
		"llama-3.2-1b LoRA, QLoRA on 6 GiB": {cfg: preset(t, "llama-3.2-1b", 6, nil),
			allow: fit.Allow{LoRA: true, QLoRA: true}},
		"small GPT, ZeRO and offload on 2 GPUs": {cfg: smallDDP(t), allow: fit.Allow{ZeRO: true, Offload: true}, top: 4},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			search := func(workers int) ([]string, []string, *fit.Plans) {
				var heard []string
				ps, err := fit.FindPlans(context.Background(), tc.cfg, fit.PlanOptions{GPU: g, Allow: tc.allow, FreeBatch: tc.free, Top: tc.top,
					Options: fit.Options{Workers: workers, Progress: func(tr fit.Trial) {
						heard = append(heard, fmt.Sprintf("%+v %v %d %d", tr.Config, tr.Fits, tr.Result.PeakAllocated, tr.Result.PeakReserved))
					}}})
				if err != nil {
					t.Fatal(err)
				}
				return describe(ps), heard, ps
			}
			one, heardOne, ps1 := search(1)
			t.Logf("%d considered, %d tried, %d fit", ps1.Considered, len(ps1.Tried), len(ps1.Fitting))
			if ps1.Discarded != 0 {
				t.Errorf("one worker discarded %d trials", ps1.Discarded)
			}
			if len(heardOne) != len(ps1.Tried) {
				t.Errorf("Progress heard of %d trials, %d were tried", len(heardOne), len(ps1.Tried))
			}
			checkFailsAlike(t, ps1)
			for _, w := range []int{2, 5} {
				many, heardMany, ps := search(w)
				if d := firstDiff(one, many); d != "" {
					t.Errorf("%d workers: %s", w, d)
				}
				if !slices.Equal(heardOne, heardMany) {
					t.Errorf("%d workers: Progress heard of other trials, or in another order", w)
				}
				t.Logf("%d workers: %d trials discarded", w, ps.Discarded)
			}
		})
	}
}

// checkFailsAlike runs each plan skipped as failing alike with another: it fails, as that plan did, with
// the same peaks (the runs are the same until they end).
func checkFailsAlike(t *testing.T, ps *fit.Plans) {
	t.Helper()
	for _, p := range ps.Skipped {
		if p.Skipped != fit.SkippedFailsAlike {
			continue
		}
		cfg := p.Config
		cfg.Steps = fit.Steps(cfg)
		got, err := fit.Meta{}.Simulate(context.Background(), cfg, fit.Limit(cfg, fit.DefaultMargin))
		if err != nil {
			t.Fatal(err)
		}
		want := p.Because.Result
		if p.Because.Fits || got.OOM == nil && !got.OverLimit ||
			got.PeakAllocated != want.PeakAllocated || got.PeakReserved != want.PeakReserved || got.OverLimit != want.OverLimit {
			t.Errorf("%s, skipped as failing like %s (fits %v): run, OOM %v over the limit %v peaks %d %d; that plan's %d %d",
				p.Name(), p.Because.Name(), p.Because.Fits, got.OOM != nil, got.OverLimit, got.PeakAllocated, got.PeakReserved, want.PeakAllocated, want.PeakReserved)
		}
	}
}

func smallDDP(t testing.TB) train.Config {
	cfg := small(t)
	cfg.Parallel.GPUs, cfg.Parallel.Strategy = 2, dist.DDP
	return cfg
}

func firstDiff(a, b []string) string {
	for i := range max(len(a), len(b)) {
		switch {
		case i >= len(a):
			return "extra " + b[i]
		case i >= len(b):
			return "missing " + a[i]
		case a[i] != b[i]:
			return fmt.Sprintf("\n  one worker: %s\n  several:    %s", a[i], b[i])
		}
	}
	return ""
}

// TestPlansInterruptedWithWorkers: a search whose context ends while trials run ahead returns the plans
// taken so far, marked interrupted, and leaves no trial running.
func TestPlansInterruptedWithWorkers(t *testing.T) {
	g, err := fit.LookupGPU(fit.DefaultGPU)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	heard := 0
	ps, err := fit.FindPlans(ctx, small(t), fit.PlanOptions{GPU: g, Top: 1000, Options: fit.Options{Workers: 3, Progress: func(fit.Trial) {
		if heard++; heard == 3 {
			cancel()
		}
	}}})
	if err != nil {
		t.Fatal(err)
	}
	if !ps.Interrupted || len(ps.Tried) != 3 {
		t.Fatalf("interrupted %v after %d plans tried: want the search stopped at the third", ps.Interrupted, len(ps.Tried))
	}
}
