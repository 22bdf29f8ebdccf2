package fit_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/cputime"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// BenchmarkFitMaxBatch is the search for the largest micro-batch (target: at most 2 s), with the trials and
// simulated steps it took.
func BenchmarkFitMaxBatch(b *testing.B) {
	for _, name := range []string{"gpt2-medium", "llama-3.1-8b"} {
		cfg := preset(b, name, 24, nil)
		if name == "llama-3.1-8b" {
			loraBF16(&cfg) // a full fine-tune, or LoRA without checkpointing, fits no batch on 24 GiB
			cfg.Checkpoint = knob.CheckpointAll
			name += "-lora-checkpoint"
		}
		b.Run(name, func(b *testing.B) {
			var s *fit.BatchSearch
			for b.Loop() {
				var err error
				if s, err = fit.MaxBatch(context.Background(), cfg, fit.Options{}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(s.Trials)), "trials")
			b.ReportMetric(float64(s.Steps), "steps")
			b.ReportMetric(float64(s.MaxBatch), "batch")
		})
	}
}

// BenchmarkFitPlans is the search for the eight cheapest plans (target: at most 2 s), with the plans
// simulated, their steps and the trials simulated ahead on spare cores and then not needed.
func BenchmarkFitPlans(b *testing.B) {
	g, _ := fit.LookupGPU(fit.DefaultGPU)
	for _, name := range []string{"gpt2-medium", "llama-3.1-8b"} {
		cfg := preset(b, name, 24, nil)
		b.Run(name, func(b *testing.B) {
			var ps *fit.Plans
			for b.Loop() {
				var err error
				ps, err = fit.FindPlans(context.Background(), cfg, fit.PlanOptions{GPU: g, Allow: fit.Allow{LoRA: true, QLoRA: true}})
				if err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(len(ps.Tried)), "trials")
			b.ReportMetric(float64(ps.Steps), "steps")
			b.ReportMetric(float64(ps.Discarded), "discarded")
		})
	}
}

// BenchmarkFitPlansLargeBatch is the plan search on gpt2-medium with an effective batch of 4096 and 65536
// (fit --batch): its plans accumulate up to thousands of micro-batches a step, and a trial's time must not
// grow with them (target: as long as the batch of 16's). cpu-s/op is the CPU time an op takes, which a shared
// machine does not inflate as it does the wall time.
func BenchmarkFitPlansLargeBatch(b *testing.B) {
	g, _ := fit.LookupGPU(fit.DefaultGPU)
	for _, batch := range []int{16, 4096, 65536} {
		cfg := preset(b, "gpt2-medium", 24, func(c *train.Config) { c.Batch = batch })
		b.Run(fmt.Sprintf("batch=%d", batch), func(b *testing.B) {
			var ps *fit.Plans
			cpu := cputime.Process()
			for b.Loop() {
				var err error
				if ps, err = fit.FindPlans(context.Background(), cfg, fit.PlanOptions{GPU: g}); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric((cputime.Process()-cpu).Seconds()/float64(b.N), "cpu-s/op")
			b.ReportMetric(float64(len(ps.Tried)), "trials")
			b.ReportMetric(float64(ps.Steps), "steps")
		})
	}
}
