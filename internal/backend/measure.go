package backend

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/fixes"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// MeasureFixes implements tui.Backend as oomdbg fixes measures: w without its leak bug, then with each of
// train.AdviceFixesFor it (a rank's own strategy first), on the meta device, on its device's capacity and
// with unlimited memory.
func (Backend) MeasureFixes(ctx context.Context, w tui.Workload) ([]tui.Measured, error) {
	cfg, err := configOf(w)
	if err != nil {
		return nil, err
	}
	rows, err := train.Sweep(ctx, cfg, train.AdviceFixesFor(cfg))
	if err != nil {
		return nil, err
	}
	gpu, err := fit.LookupGPU(fit.DefaultGPU)
	if err != nil {
		return nil, err
	}
	out := make([]tui.Measured, 0, len(rows))
	for _, row := range rows {
		fw, err := Workload(row.Config)
		if err != nil {
			return nil, err
		}
		m := tui.Measured{Fix: row.Fix, Fixes: fw.Fixes, Needs: row.NeedsAllocated, Peak: row.PeakAllocated, OOM: row.OOM != nil,
			Reserved: row.PeakReserved, Usable: fit.Usable(row.Config),
			// The planner's cost of a trial, so that a measured fix and a plan rank on one scale.
			StepTime: fit.Measure(fit.Estimate(row.Config, gpu), row.Result, gpu).Total()}
		if row.OOM != nil {
			m.OOMPhase = row.OOM.Phase.String()
		}
		out = append(out, m)
	}
	return out, nil
}

// Measure implements triage.Measurer the way oomdbg fixes measures: it re-runs the workload a snapshot
// recorded with each of train.AdviceFixesFor its configuration (a rank's own strategy first) on the meta
// device, on the configured device's capacity and with unlimited memory, then with each of
// train.SettingsFixesFor it over the steps the snapshot recorded. The re-runs stop at MeasureTimeout.
func (b Backend) Measure(ctx context.Context, s *snapshot.Snapshot) (*triage.Measurements, error) {
	cfg, err := workloadOf(s)
	if err != nil {
		return nil, err
	}
	if ctx == nil {
		ctx = context.Background()
	}
	if b.MeasureTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, b.MeasureTimeout)
		defer cancel()
	}
	rows, err := train.Sweep(ctx, cfg, train.AdviceFixesFor(cfg))
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("the re-runs took longer than the %v --measure-timeout allows", b.MeasureTimeout)
	}
	if err != nil {
		return nil, err
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: no fix applies to it", triage.ErrNotMeasurable)
	}
	m := &triage.Measurements{
		Note: fmt.Sprintf("the workload re-run with each fix on the meta device, %d steps each, without its leak bug", rows[0].MeasuredOnSteps),
	}
	for _, r := range rows {
		m.Rows = append(m.Rows, fixes.Measurement(r))
	}
	// The allocator settings, empty_cache and the data's shapes act over steps: they are measured over the
	// steps the snapshot recorded.
	settings, err := train.SweepSettings(ctx, cfg, train.SettingsFixesFor(cfg))
	if errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("the re-runs took longer than the %v --measure-timeout allows", b.MeasureTimeout)
	}
	if err != nil {
		return nil, err
	}
	if len(settings) > 0 {
		m.SettingsNote = fmt.Sprintf("the workload re-run with each on the meta device, %d steps each", settings[0].MeasuredOnSteps)
		for _, r := range settings {
			m.Settings = append(m.Settings, fixes.Measurement(r))
		}
	}
	return m, nil
}

// workloadOf returns the configuration of the oomdbg workload a snapshot recorded.
func workloadOf(s *snapshot.Snapshot) (train.Config, error) {
	var cfg train.Config
	if s.Meta.Source != "oomdbg" || len(s.Meta.Workload) == 0 {
		return cfg, fmt.Errorf("%w: it was not recorded from oomdbg's workload", triage.ErrNotMeasurable)
	}
	if err := json.Unmarshal(s.Meta.Workload, &cfg); err != nil {
		return cfg, fmt.Errorf("%w: its workload configuration does not read: %v", triage.ErrNotMeasurable, err)
	}
	if err := cfg.Validate(); err != nil {
		return cfg, fmt.Errorf("%w: its workload configuration is not one oomdbg runs: %v", triage.ErrNotMeasurable, err)
	}
	return cfg, nil
}
