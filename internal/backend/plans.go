package backend

import (
	"context"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// Plans implements tui.Backend with fit.FindPlans: the plans that fit w's card, cheapest first on the
// default GPU profile, with the adapters the fixes pane offers allowed for a Llama and ZeRO and FSDP for a
// rank of a job.
func (Backend) Plans(ctx context.Context, w tui.Workload) ([]tui.FitPlan, error) {
	cfg, err := configOf(w)
	if err != nil {
		return nil, err
	}
	cfg.Device = device.Meta
	gpu, err := fit.LookupGPU(fit.DefaultGPU)
	if err != nil {
		return nil, err
	}
	llama := cfg.Model == "llama"
	ps, err := fit.FindPlans(ctx, cfg, fit.PlanOptions{GPU: gpu,
		Allow: fit.Allow{LoRA: llama, QLoRA: llama, ZeRO: cfg.Parallel.World() > 1}})
	if err != nil {
		return nil, err
	}
	var out []tui.FitPlan
	for _, p := range ps.Fitting {
		pw, err := Workload(p.Config)
		if err != nil {
			return nil, err
		}
		out = append(out, tui.FitPlan{Name: p.Name(), Fixes: pw.Fixes, PeakReserved: p.PeakReserved, StepTime: p.StepTime()})
	}
	return out, nil
}

// CanPlan implements tui.Backend: the planner is there.
func (Backend) CanPlan() bool { return true }
