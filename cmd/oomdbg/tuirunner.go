package main

import (
	"context"
	"encoding/json"
	"io"

	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// tuiRunner is the TUI's backend (tui.Backend): it records workloads and measures their fixes with
// workloads/train and finds the plans that fit with fit, as sweepMeasurer measures fixes for triage.
type tuiRunner struct {
	version string // written into the snapshots it records
}

// Parse implements tui.Backend: it reads a train.Config from a snapshot's Meta.Workload.
func (tuiRunner) Parse(spec json.RawMessage) (tui.Workload, error) {
	var cfg train.Config
	if err := json.Unmarshal(spec, &cfg); err != nil {
		return tui.Workload{}, err
	}
	if err := cfg.Validate(); err != nil {
		return tui.Workload{}, err
	}
	return tuiWorkload(cfg)
}

// Record implements tui.Backend: it records w's configuration with its device and fixes applied.
func (r tuiRunner) Record(ctx context.Context, w tui.Workload, out io.Writer) error {
	cfg, err := configOf(w)
	if err != nil {
		return err
	}
	_, err = train.Record(ctx, cfg, out, train.RecordOptions{ToolVersion: r.version, FlushEvery: train.DefaultFlushEvery})
	return err
}

// MeasureFixes implements tui.Backend as oomdbg fixes measures: w without its leak bug, then with each of
// train.FixesFor it, on the meta device, on its device's capacity and with unlimited memory.
func (tuiRunner) MeasureFixes(ctx context.Context, w tui.Workload) ([]tui.Measured, error) {
	cfg, err := configOf(w)
	if err != nil {
		return nil, err
	}
	rows, err := train.Sweep(ctx, cfg, train.FixesFor(cfg))
	if err != nil {
		return nil, err
	}
	out := make([]tui.Measured, 0, len(rows))
	for _, row := range rows {
		fw, err := tuiWorkload(row.Config)
		if err != nil {
			return nil, err
		}
		m := tui.Measured{Fix: row.Fix, Fixes: fw.Fixes, Needs: row.NeedsAllocated, Peak: row.PeakAllocated, OOM: row.OOM != nil}
		if row.OOM != nil {
			m.OOMPhase = row.OOM.Phase.String()
		}
		out = append(out, m)
	}
	return out, nil
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

// tuiWorkload is cfg as the TUI sees it.
func tuiWorkload(cfg train.Config) (tui.Workload, error) {
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

var _ tui.Backend = tuiRunner{}
