// Package fixes reports what the memory fixes do to a workload, measured by re-running it on the meta device
// (train.Sweep): the tables of oomdbg fixes (each fix's peaks and fit; each allocator setting's
// fragmentation and cost, held against the empty_cache rule of thumb; each data-parallel strategy's peak
// per rank and what it is made of) and of oomdbg bugs (each leak bug and the fixed loop, recorded and
// checked as oomdbg check checks them).
package fixes

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/headroom"
	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// workloadName is what a table's title calls cfg's workload: its preset, else its model.
func workloadName(cfg train.Config) string {
	if cfg.Preset != "" {
		return cfg.Preset
	}
	return cfg.Model
}

// Write writes a sweep of the fixes (train.Sweep of train.FixesFor cfg) as an aligned table, or as markdown:
// each fix's peaks, whether it fits and what it needs with unlimited memory; for a data-parallel job, each
// strategy's (WriteStrategies).
func Write(w io.Writer, cfg train.Config, rows []train.SweepRow, markdown bool) {
	if cfg.Parallel.World() > 1 {
		WriteStrategies(w, cfg, rows, markdown)
		return
	}
	fmt.Fprintf(w, "%s, batch %d, on %s (%s taken by the CUDA context), meta device, 2 steps:\n\n",
		workloadName(cfg), cfg.Batch, units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
	if cfg.Model == "llama" {
		fmt.Fprintf(w, "sequence %d, AdamW unless named, LoRA and QLoRA of rank 16 (alpha 32) on every projection under bf16 autocast, attention %s\n\n",
			cfg.Seq, map[knob.Attention]string{knob.AttentionFlash: "sdpa (flash)", knob.AttentionNaive: "eager"}[cfg.Attention])
	}
	header := []string{"fix", "peak allocated", "peak reserved", "fits", "needs (allocated)"}
	paged := slices.ContainsFunc(rows, func(r train.SweepRow) bool { return r.Paged > 0 })
	if paged { // unified memory is outside the allocator's figures: say it apart
		header = append(header, "paged state (evicted)")
	}
	var cells [][]string
	for _, r := range rows {
		fits := Fits(cfg, r)
		if r.OOM != nil {
			fits = fmt.Sprintf("OOM in %s", r.OOM.Phase)
		}
		row := []string{r.Fix, units.FormatSize(r.PeakAllocated), units.FormatSize(r.PeakReserved), fits,
			units.FormatSize(r.NeedsAllocated)}
		if paged {
			cell := ""
			if r.Paged > 0 {
				cell = fmt.Sprintf("%s (%s)", units.FormatSize(int64(r.Paged)), units.FormatSize(int64(r.PagedEvicted)))
			}
			row = append(row, cell)
		}
		cells = append(cells, row)
	}
	table.Write(w, header, cells, markdown, 1)
	writeRule(w, cfg, markdown)
}

// Fits says whether a sweep's row fits cfg's card by the headroom rule, in a table's cell: "yes", "tight:
// 12.00 MiB left" (it ran, inside the margin), "OOM".
func Fits(cfg train.Config, r train.SweepRow) string {
	v := headroom.Judge(r.PeakReserved, r.OOM != nil, int64(cfg.GPUMemory)-int64(cfg.ContextReserve), headroom.DefaultMargin)
	if v.Word == headroom.Fits {
		return "yes"
	}
	return v.Short()
}

// writeRule states the rule the fits column follows, under a table.
func writeRule(w io.Writer, cfg train.Config, markdown bool) {
	rule := headroom.Rule(int64(cfg.GPUMemory)-int64(cfg.ContextReserve), headroom.DefaultMargin)
	if markdown {
		fmt.Fprintf(w, "\nFits: %s.\n", strings.TrimPrefix(rule, "fits: "))
		return
	}
	fmt.Fprintf(w, "\n%s\n", rule)
}

// Title says what a sweep ran: the workload, its shape and data, and the card.
func Title(cfg train.Config) string {
	name := workloadName(cfg)
	var parts []string
	for _, p := range []struct{ val, off string }{{cfg.AMP.String(), "off"}, {cfg.Attention.String(), "naive"}} {
		if p.val != p.off {
			parts = append(parts, p.val)
		}
	}
	if cfg.Checkpoint != knob.CheckpointOff {
		parts = append(parts, "checkpoint "+cfg.Checkpoint.String())
	}
	shape := fmt.Sprintf("batch %d", cfg.Batch)
	if !cfg.SeqDist.Fixed() {
		shape += ", lengths " + cfg.SeqDist.String() + " (context " + fmt.Sprint(cfg.Seq) + "), padding " + cfg.Padding.String()
		if cfg.SortByLength {
			shape += ", sorted by length"
		}
	}
	if s := cfg.AllocConf.String(); s != "" {
		parts = append(parts, "PYTORCH_CUDA_ALLOC_CONF="+s)
	}
	if len(parts) > 0 {
		name += " (" + strings.Join(parts, ", ") + ")"
	}
	return fmt.Sprintf("%s, %s, on %s (%s taken by the CUDA context)", name, shape,
		units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
}

// Measurement is a sweep row as triage reads it.
func Measurement(r train.SweepRow) triage.Measurement {
	row := triage.Measurement{Fix: r.Fix, PeakAllocated: r.PeakAllocated, PeakReserved: r.PeakReserved,
		NeedsAllocated: r.NeedsAllocated, NeedsReserved: r.NeedsReserved, Fragmentation: r.Fragmentation()}
	if r.OOM != nil {
		row.OOM, row.OOMPhase = true, r.OOM.Phase.String()
	}
	if r.Result != nil {
		c := r.Result.SteadyCost()
		row.CostSteps, row.MallocsPerStep, row.FreesPerStep, row.ReleasedPerStep = c.Steps, c.Mallocs, c.Frees, int64(c.EmptyCacheReleased)
	}
	return row
}

// WriteSettings writes a sweep of the allocator settings, empty_cache and the data's shapes
// (train.SweepSettings of train.SettingsFixesFor cfg): each setting's peaks, fragmentation, fit and cost,
// then the rule of thumb held against it.
func WriteSettings(w io.Writer, cfg train.Config, rows []train.SweepRow, markdown bool) {
	steps := 0
	if len(rows) > 0 {
		steps = rows[0].MeasuredOnSteps
	}
	fmt.Fprintf(w, "%s, meta device, %d steps:\n\n", Title(cfg), steps)
	header := []string{"setting", "peak allocated", "peak reserved", "fragmentation", "fits", "cudaMalloc per step", "cudaFree per step", "empty_cache returns per step"}
	var cells [][]string
	var ms []triage.Measurement
	for _, r := range rows {
		m := Measurement(r)
		ms = append(ms, m)
		fits := Fits(cfg, r)
		if o := r.OOM; o != nil {
			kind := triage.OOMKind(o.Request, o.Reserved-o.Allocated, o.DeviceFree)
			fits = fmt.Sprintf("OOM in step %d, %s (%s)", o.Iteration, o.Phase, kind)
		}
		mallocs, frees, released := "-", "-", "-"
		if m.CostSteps > 0 {
			mallocs, frees = triage.PerStep(m.MallocsPerStep), triage.PerStep(m.FreesPerStep)
			if r.Config.EmptyCache != train.EmptyCacheNever {
				released = units.FormatSize(m.ReleasedPerStep)
			}
		}
		cells = append(cells, []string{r.Fix, units.FormatSize(r.PeakAllocated), units.FormatSize(r.PeakReserved),
			fmt.Sprintf("%.1f%%", 100*m.Fragmentation), fits, mallocs, frees, released})
	}
	table.Write(w, header, cells, markdown, 1)
	fmt.Fprintf(w, "\nFragmentation is (reserved - allocated) / reserved when reserved memory peaked; the costs are the means\n"+
		"of the completed steps after the first, which fills the cache (- when none completed, or for empty_cache\n"+
		"when the setting does not call it).\n")
	writeRule(w, cfg, false)
	if rc := triage.CheckFragmentationRule(ms); rc != nil {
		fmt.Fprintf(w, "\nThe %.0f%% rule (call empty_cache when more than %.0f%% of reserved memory is unallocated): %s.\n",
			100*rc.Threshold, 100*rc.Threshold, rc.Verdict)
	}
}

// WriteStrategies writes a sweep of a data-parallel job's strategies: each rank's peak and what it is made
// of at the peak, its host memory and what it sends per step.
func WriteStrategies(w io.Writer, cfg train.Config, rows []train.SweepRow, markdown bool) {
	p := cfg.Parallel
	nodes := ""
	if p.NodeCount() > 1 {
		nodes = fmt.Sprintf(" on %d nodes", p.NodeCount())
	}
	fmt.Fprintf(w, "%s, micro-batch %d per rank, %d x %s%s (%s taken by the CUDA context), meta device, 2 steps, rank %d:\n",
		workloadName(cfg), cfg.Batch, p.World(), units.FormatSize(int64(cfg.GPUMemory)), nodes, units.FormatSize(int64(cfg.ContextReserve)), p.Rank)
	fmt.Fprintf(w, "mixed-precision AdamW (bf16), checkpoint %s, attention %s; the peak's parts are those of the run with unlimited memory where the rank ran out\n\n",
		cfg.Checkpoint, cfg.Attention)
	header := []string{"strategy", "peak per rank", "fits", "parameters", "gradients", "optimizer state", "activations", "other", "host", "sent per step"}
	var cells [][]string
	for _, r := range rows {
		fits := Fits(cfg, r)
		if r.OOM != nil {
			fits = fmt.Sprintf("OOM in %s (needs %s)", r.OOM.Phase, units.FormatSize(r.NeedsAllocated))
		}
		c := r.Composition
		other := c[snapshot.CategoryTemporary] + c[snapshot.CategoryAutogradDetail] + c[snapshot.CategoryAMPCache] +
			c[snapshot.CategoryInput] + c[snapshot.CategoryUnknown]
		host := "-"
		if r.Host.PeakAllocated > 0 {
			host = units.FormatSize(int64(r.Host.PeakAllocated))
		}
		cells = append(cells, []string{r.Fix, units.FormatSize(r.PeakAllocated), fits,
			units.FormatSize(c[snapshot.CategoryParameter]), units.FormatSize(c[snapshot.CategoryGradient]),
			units.FormatSize(c[snapshot.CategoryOptimizerState]), units.FormatSize(c[snapshot.CategoryActivation]),
			units.FormatSize(other), host, units.FormatSize(r.Traffic.Sent)})
	}
	table.Write(w, header, cells, markdown, 1)
	writeRule(w, cfg, markdown)
}

// Measure sweeps cfg on the meta device: with each fix (train.Sweep of train.FixesFor cfg), or, with
// settings, with each allocator setting, empty_cache and shape of the data for cfg.Steps steps
// (train.SweepSettings of train.SettingsFixesFor cfg). A fix that does not apply to cfg is left out; cfg
// itself must be valid.
func Measure(ctx context.Context, cfg train.Config, settings bool) ([]train.SweepRow, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if settings {
		return train.SweepSettings(ctx, cfg, train.SettingsFixesFor(cfg))
	}
	return train.Sweep(ctx, cfg, train.FixesFor(cfg))
}
