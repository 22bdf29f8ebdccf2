// Package backend is the runtime behind oomdbg's TUI and reports: it records oomdbg's own training
// workloads (workloads/train), measures their fixes, finds the plans that fit their card (fit), and replays
// a trace up to its OOM under other allocator settings (allocator/replay). One Backend is the TUI's
// tui.Backend and the report's triage.Measurer and triage.Replayer, so that the command line hands the same
// one to both, and neither the TUI nor triage drives the runtime itself.
package backend

import (
	"context"
	"encoding/json"
	"io"
	"time"

	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Backend records, measures, plans and replays. The zero value works: it writes no tool version, and sets
// no limit on the re-runs' time or on the memory a replay may take.
type Backend struct {
	// Version is oomdbg's, written into the snapshots it records.
	Version string
	// MeasureTimeout is the time Measure's re-runs may take, in all (report --measure-timeout); 0: no limit.
	// The workload comes from a file, perhaps someone else's.
	MeasureTimeout time.Duration
	// ReplayBudget is the memory a replay may take, at PerEvent bytes an event of the trace (--max-memory);
	// ServeOOM refuses a trace that needs more. The zero value sets no limit.
	ReplayBudget load.Budget
}

var (
	_ tui.Backend     = Backend{}
	_ triage.Measurer = Backend{}
	_ triage.Replayer = Backend{}
)

// Parse implements tui.Backend: it reads a train.Config from a snapshot's Meta.Workload.
func (Backend) Parse(spec json.RawMessage) (tui.Workload, error) {
	var cfg train.Config
	if err := json.Unmarshal(spec, &cfg); err != nil {
		return tui.Workload{}, err
	}
	if err := cfg.Validate(); err != nil {
		return tui.Workload{}, err
	}
	return Workload(cfg)
}

// Record implements tui.Backend: it records w's configuration with its device and fixes applied.
func (b Backend) Record(ctx context.Context, w tui.Workload, out io.Writer) error {
	cfg, err := configOf(w)
	if err != nil {
		return err
	}
	_, err = train.Record(ctx, cfg, out, train.RecordOptions{ToolVersion: b.Version, FlushEvery: train.DefaultFlushEvery})
	return err
}

// configOf is w's configuration with its device and fixes applied.
func configOf(w tui.Workload) (train.Config, error) {
	var cfg train.Config
	if err := json.Unmarshal(w.Spec, &cfg); err != nil {
		return cfg, err
	}
	f := w.Fixes
	cfg.Device, cfg.AMP, cfg.Attention, cfg.Checkpoint = w.Device, f.AMP, f.Attention, f.Checkpoint
	cfg.Optimizer, cfg.OptimizerImpl, cfg.ZeroGrad = f.Optimizer, f.OptimizerImpl, f.ZeroGrad
	cfg.Batch, cfg.Accum, cfg.Bug = f.Batch, f.Accum, f.Bug
	cfg.Weights, cfg.LoRA, cfg.QLoRA, cfg.LoRATargets = f.Weights, f.LoRA, f.QLoRA, f.LoRATargets
	cfg.Parallel.Strategy, cfg.Parallel.Offload = f.Parallel, f.Offload
	if cfg.LoRA == 0 { // a full fine-tune has no adapter to scale or drop out
		cfg.LoRAAlpha, cfg.LoRADropout = 0, 0
	}
	return cfg, nil
}

// Workload is cfg as the TUI shows and re-runs it.
func Workload(cfg train.Config) (tui.Workload, error) {
	spec, err := json.Marshal(cfg)
	if err != nil {
		return tui.Workload{}, err
	}
	name := cfg.Preset
	if name == "" {
		name = cfg.Model
	}
	return tui.Workload{
		Name:   name + " on " + string(cfg.Device),
		GPT:    cfg.Model == "gpt",
		Llama:  cfg.Model == "llama",
		GPUs:   cfg.Parallel.World(),
		Device: cfg.Device,
		Fixes: tui.Fixes{AMP: cfg.AMP, Attention: cfg.Attention, Checkpoint: cfg.Checkpoint,
			Batch: cfg.Batch, Accum: cfg.Accum, Optimizer: cfg.Optimizer, OptimizerImpl: cfg.OptimizerImpl,
			ZeroGrad: cfg.ZeroGrad, Bug: cfg.Bug,
			Weights: cfg.Weights, LoRA: cfg.LoRA, QLoRA: cfg.QLoRA, LoRATargets: cfg.LoRATargets,
			Parallel: cfg.Parallel.Strategy, Offload: cfg.Parallel.Offload},
		Spec: spec,
	}, nil
}
