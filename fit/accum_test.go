package fit_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestAccumulationSimulatedByItsCycle: a trial runs the micro-batches of a step until the allocator's state
// repeats, and counts the whole cycles left rather than run them (train.Simulate). Its truth is the full
// simulation of every micro-batch: the verdict, the peaks of allocated and reserved memory and what was
// unallocated at the reserved peak are the same, and so is what a data-parallel rank moved in each step,
// which grows with the micro-batches. gpt2-medium's micro-batches of 8 with flash attention and 8-bit AdamW
// alternate between two states, so that an odd and an even number of them peak 1.5 GiB apart in reserved
// memory: a trial that ran three for any number would have missed that.
func TestAccumulationSimulatedByItsCycle(t *testing.T) {
	accum := func(c train.Config, k int, edit func(*train.Config)) train.Config {
		c.Batch, c.Accum = 2, k
		if edit != nil {
			edit(&c)
		}
		return c
	}
	cases := map[string]train.Config{
		"small GPT, accumulate 8": accum(small(t), 8, nil),
		"small GPT, bf16, checkpoint all, zero_grad zero, accumulate 7": accum(small(t), 7, func(c *train.Config) {
			c.AMP, c.Checkpoint, c.ZeroGrad = knob.AMPBF16, knob.CheckpointAll, knob.ZeroGradZero
		}),
		"small GPT, fp16 with loss scaling, accumulate 5":       accum(small(t), 5, func(c *train.Config) { c.AMP = knob.AMPFP16 }),
		"small GPT, micro-batch 8, accumulate 6 (does not fit)": accum(small(t), 6, func(c *train.Config) { c.Batch = 8 }),
		"small GPT, DDP on 2 GPUs, accumulate 6":                accum(smallDDP(t), 6, nil),
		"small GPT, ZeRO-2 on 2 GPUs, accumulate 6": accum(smallDDP(t), 6, func(c *train.Config) {
			c.Parallel.Strategy, c.Parallel.ReduceBucketSize, c.Parallel.AllgatherBucketSize = dist.ZeRO2, 1<<22, 1<<22
		}),
		"small GPT, FSDP on 2 GPUs, accumulate 5": accum(smallDDP(t), 5, func(c *train.Config) { c.Parallel.Strategy = dist.FSDPFull }),
	}
	for _, k := range []int{5, 6, 9} {
		cases[fmt.Sprintf("gpt2-medium, bf16, flash, 8-bit AdamW, micro-batch 8, accumulate %d", k)] = preset(t, "gpt2-medium", 24,
			func(c *train.Config) {
				c.Batch, c.Accum, c.AMP, c.Attention, c.Optimizer = 8, k, knob.AMPBF16, knob.AttentionFlash, knob.AdamW8bit
			})
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := fit.Options{}.Trial(context.Background(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			full := cfg
			full.Steps = fit.Steps(cfg)
			want := run(t, full)
			limit := fit.Limit(cfg, fit.DefaultMargin)
			wantFits := want.OOM == nil && want.PeakReserved <= limit
			if got.Fits != wantFits {
				t.Fatalf("fits %v; the full run of %d micro-batches a step says %v (peak reserved %d, limit %d)",
					got.Fits, cfg.Accum, wantFits, want.PeakReserved, limit)
			}
			if got.Config.Accum != cfg.Accum {
				t.Errorf("the trial reports accumulate %d, want the configuration's %d", got.Config.Accum, cfg.Accum)
			}
			t.Logf("fits %v: peak reserved %d of %d; %d steps of traffic", wantFits, want.PeakReserved, limit, len(want.Traffic))
			if !wantFits {
				return // both stopped: the peaks are what each reached by then
			}
			r := got.Result
			if r.PeakReserved != want.PeakReserved || r.PeakAllocated != want.PeakAllocated || r.UnallocatedAtPeak != want.UnallocatedAtPeak {
				t.Errorf("peaks reserved %d allocated %d unallocated %d; the full run's %d %d %d", r.PeakReserved, r.PeakAllocated,
					r.UnallocatedAtPeak, want.PeakReserved, want.PeakAllocated, want.UnallocatedAtPeak)
			}
			if len(r.Traffic) != len(want.Traffic) {
				t.Fatalf("traffic of %d steps, the full run's of %d", len(r.Traffic), len(want.Traffic))
			}
			for i := range r.Traffic {
				if r.Traffic[i] != want.Traffic[i] {
					t.Errorf("step %d moved %+v; the full run %+v", i, r.Traffic[i], want.Traffic[i])
				}
			}
		})
	}
}
