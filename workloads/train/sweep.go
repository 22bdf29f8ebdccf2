package train

import (
	"context"
	"fmt"

	"github.com/oomdbg/oomdbg/workloads/optim"
)

// A Fix is a named change to a configuration: one of the memory fixes or a combination of them.
type Fix struct {
	Name  string
	Apply func(c *Config)
}

// Fixes are the combinations a sweep tries, from none to all, as a user would try them.
var Fixes = []Fix{
	{"as configured", func(*Config) {}},
	{"flash attention", func(c *Config) { c.Attention = AttentionFlash }},
	{"bf16 autocast", func(c *Config) { c.AMP = AMPBF16 }},
	{"bf16 + flash", func(c *Config) { c.AMP, c.Attention = AMPBF16, AttentionFlash }},
	{"checkpoint every block", func(c *Config) { c.Checkpoint = CheckpointAll }},
	{"bf16 + flash + checkpoint attention", func(c *Config) { c.AMP, c.Attention, c.Checkpoint = AMPBF16, AttentionFlash, CheckpointAttention }},
	{"bf16 + flash + checkpoint every 2nd block", func(c *Config) { c.AMP, c.Attention, c.Checkpoint = AMPBF16, AttentionFlash, CheckpointEvery(2) }},
	{"bf16 + flash + checkpoint every block", func(c *Config) { c.AMP, c.Attention, c.Checkpoint = AMPBF16, AttentionFlash, CheckpointAll }},
	{"fp16 + flash + checkpoint every block", func(c *Config) { c.AMP, c.Attention, c.Checkpoint = AMPFP16, AttentionFlash, CheckpointAll }},
	{"batch / 4, accumulate 4", quarterBatch},
	{"bf16 + flash + batch / 4, accumulate 4", func(c *Config) { c.AMP, c.Attention = AMPBF16, AttentionFlash; quarterBatch(c) }},
	{"bf16 + flash + checkpoint every block + SGD", func(c *Config) {
		c.AMP, c.Attention, c.Checkpoint, c.Optimizer = AMPBF16, AttentionFlash, CheckpointAll, optim.SGD
	}},
}

func quarterBatch(c *Config) {
	if c.Batch >= 4 {
		c.Batch, c.Accum = c.Batch/4, c.Accum*4
	}
}

// SweepRow is what one fix does: the peak on the configured device, or where it ran out, and the peak it
// needs when given all the memory it wants.
type SweepRow struct {
	Fix             string
	Config          Config
	PeakAllocated   int64 // on the configured device (up to the OOM when it ran out)
	PeakReserved    int64
	OOM             *OOM
	NeedsAllocated  int64 // with unlimited memory: what the run needs
	NeedsReserved   int64
	MeasuredOnSteps int
}

// Sweep runs cfg with each fix on the meta device, once on the configured device and once with unlimited
// memory, two steps each (the second step carries the optimizer state). It takes a fraction of a second per
// fix for a GPT-2-medium-sized model.
func Sweep(ctx context.Context, cfg Config, fixes []Fix) ([]SweepRow, error) {
	base := cfg
	base.Device, base.Steps, base.Bug = "meta", 2, ""
	var rows []SweepRow
	for _, f := range fixes {
		c := base
		f.Apply(&c)
		if err := c.Validate(); err != nil {
			continue // the fix does not apply to this model (e.g. attention on an MLP)
		}
		res, _, err := Run(ctx, c, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		unlimited := c
		unlimited.GPUMemory = 1 << 50
		need, _, err := Run(ctx, unlimited, nil)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name, err)
		}
		rows = append(rows, SweepRow{Fix: f.Name, Config: c, PeakAllocated: res.PeakAllocated, PeakReserved: res.PeakReserved,
			OOM: res.OOM, NeedsAllocated: need.PeakAllocated, NeedsReserved: need.PeakReserved, MeasuredOnSteps: c.Steps})
		if ctx.Err() != nil {
			return rows, ctx.Err()
		}
	}
	return rows, nil
}
