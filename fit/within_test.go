package fit_test

import (
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestStopOverLimitKeepsVerdict: a trial that stops once its reserved memory passes the limit gives the
// verdict a full train.Run gives, and a run that stays within the limit is the full run's, peaks, OOM and
// steps alike.
func TestStopOverLimitKeepsVerdict(t *testing.T) {
	cases := map[string]train.Config{
		"small GPT":                   small(t),
		"small GPT, flash, ckpt attn": withCfg(small(t), func(c *train.Config) { c.Attention, c.Checkpoint = knob.AttentionFlash, knob.CheckpointAttention }),
		"small GPT, bf16, ckpt all, accumulate 4": withCfg(small(t), func(c *train.Config) {
			c.AMP, c.Checkpoint, c.Batch, c.Accum = knob.AMPBF16, knob.CheckpointAll, 2, 4
		}),
		"small GPT, ZeRO-2 on 2 GPUs": withCfg(smallDDP(t), func(c *train.Config) { c.Parallel.Strategy = dist.ZeRO2 }),
		"small GPT, ZeRO-3 offload":   withCfg(smallDDP(t), func(c *train.Config) { c.Parallel.Strategy, c.Parallel.Offload = dist.ZeRO3, dist.OffloadOptimizer }),
		"llama-3.2-1b LoRA":           preset(t, "llama-3.2-1b", 24, func(c *train.Config) { loraBF16(c); c.Batch = 2 }),
		"llama-3.2-1b QLoRA, ckpt, paged 8-bit AdamW": preset(t, "llama-3.2-1b", 24, func(c *train.Config) {
			loraBF16(c)
			c.QLoRA, c.Checkpoint, c.Optimizer, c.Batch = true, knob.CheckpointAll, knob.PagedAdamW8bit, 2
		}),
	}
	for name, cfg := range cases {
		t.Run(name, func(t *testing.T) {
			cfg.Steps, cfg.Device = 2, device.Meta
			cfg.GPUMemory = max(cfg.GPUMemory, 8<<30)
			full := run(t, cfg)
			if full.OOM != nil {
				t.Fatalf("the configuration OOMs with %s (%s): the test wants its peaks", fmtGiB(cfg.GPUMemory), full.OOM.Message)
			}
			// Limits: the peak (fits), one byte and a tenth under it (does not), and a card so small the
			// full run OOMs.
			peak, stops := full.PeakReserved, 0
			oomCfg := cfg
			oomCfg.GPUMemory = uint64(peak) * 7 / 10
			for _, tc := range []struct {
				cfg   train.Config
				limit int64
			}{{cfg, peak}, {cfg, peak - 1}, {cfg, peak * 9 / 10}, {oomCfg, peak}, {oomCfg, peak / 2}} {
				want := run(t, tc.cfg)
				wantFits := want.OOM == nil && want.PeakReserved <= tc.limit
				got, err := fit.Meta{}.Simulate(context.Background(), tc.cfg, tc.limit)
				if err != nil {
					t.Fatal(err)
				}
				gotFits := got.OOM == nil && !got.OverLimit && got.PeakReserved <= tc.limit
				if gotFits != wantFits {
					t.Errorf("memory %s, limit %d: fits %v, the full run says %v", fmtGiB(tc.cfg.GPUMemory), tc.limit, gotFits, wantFits)
				}
				if got.OverLimit {
					stops++
					if got.PeakReserved <= tc.limit {
						t.Errorf("limit %d: stopped over the limit at a peak of %d", tc.limit, got.PeakReserved)
					}
					continue
				}
				if got.PeakAllocated != want.PeakAllocated || got.PeakReserved != want.PeakReserved || got.Steps != want.Steps ||
					(got.OOM == nil) != (want.OOM == nil) || got.OOM != nil && got.OOM.Message != want.OOM.Message {
					t.Errorf("limit %d: not stopped, but allocated %d reserved %d steps %d OOM %v; the full run: %d %d %d %v",
						tc.limit, got.PeakAllocated, got.PeakReserved, got.Steps, got.OOM, want.PeakAllocated, want.PeakReserved, want.Steps, want.OOM)
				}
			}
			if stops == 0 {
				t.Error("no run stopped over its limit: the test checks nothing of the stop")
			}
		})
	}
}

func withCfg(c train.Config, edit func(*train.Config)) train.Config {
	edit(&c)
	return c
}

func run(t *testing.T, cfg train.Config) *train.Result {
	t.Helper()
	res, _, err := train.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

func fmtGiB(b uint64) string { return units.FormatSize(int64(b)) }
