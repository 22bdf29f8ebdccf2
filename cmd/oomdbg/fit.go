package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/outfile"
	"github.com/oomdbg/oomdbg/internal/table"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// fitFlags are fit's own flags, beside the workload's.
type fitFlags struct {
	gpu, allow                 string
	keepBatch, asJSON, explain bool
	markdown                   bool
	margin                     float64
	top                        int
}

func newFitCmd() *cobra.Command {
	cfg, err := train.PresetConfig(train.DefaultPreset)
	if err != nil {
		panic(err) // the default preset is built in
	}
	var preset string
	var ff fitFlags
	cmd := &cobra.Command{
		Use:   "fit [workload flags] [--gpu-mem SIZE] [--gpu NAME] [--allow lora,qlora,offload,zero]",
		Short: "Find the largest batch and the cheapest fixes that fit a card",
		Long: `Simulate the workload on the meta device with the caching allocator's rules to find, in seconds:

  - the largest micro-batch that fits as configured: from the configured batch it doubles (or halves)
    until the answer changes, then bisects; the batch found fits and the next one does not;
  - the cheapest plans that fit: combinations of bf16 autocast (fp16 on a card without bf16), bf16
    weights (llama), flash attention, activation checkpointing (attn, every 4th or 2nd block, all),
    a smaller micro-batch with the accumulation that keeps the effective batch, 8-bit and paged 8-bit
    AdamW, zero_grad(set_to_none=True), and where --allow names them LoRA and QLoRA (rank 16 on every
    projection), ZeRO-1/2/3 and FSDP (with --gpus 2 or more) and CPU offload (ZeRO-Offload).

A configuration fits when its simulated steps end without an OOM and its peak reserved memory is at
most (--gpu-mem - --context-reserve) x (1 - --margin/100): the margin is for what the simulation does not
see (other shapes, a long run's fragmentation, library workspaces). Two steps are simulated (the
second carries the optimizer state), --steps when --seq-dist varies the lengths.

Plans are tried cheapest first by estimated step time on --gpu's published peaks (docs/fit.md states the
cost model); a plan that saves at least as much memory on every axis as one that fits, and so costs at
least as much, is skipped, as is one that saves no more than a plan that does not fit. Each plan prints
the run flags that reproduce it. Ctrl-C prints what was found so far.`,
		Example: `  oomdbg fit                                          # gpt2-medium on 24 GiB
  oomdbg fit --preset llama-3.1-8b --gpu-mem 24GiB --allow lora,qlora
  oomdbg fit --preset llama-3.1-8b --gpu h100 --gpus 8 --allow zero,offload
  oomdbg fit --preset gpt2-large --keep-batch=false --json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			for _, name := range []string{"device", "bug"} {
				if cmd.Flags().Changed(name) {
					return fmt.Errorf("--%s does not apply: fit simulates on the meta device, without leak bugs", name)
				}
			}
			if preset == "" && !cmd.Flags().Changed("model") && !cmd.Flags().Changed("hf-config") {
				preset = train.DefaultPreset
			}
			cfg, err := configFromFlags(cmd.Flags(), preset)
			if err != nil {
				return err
			}
			gpu, err := fit.LookupGPU(ff.gpu)
			if err != nil {
				return err
			}
			if cmd.Flags().Changed("gpu") && !cmd.Flags().Changed("gpu-mem") {
				cfg.GPUMemory = gpu.Memory
			}
			allow, err := fit.ParseAllow(ff.allow)
			if err != nil {
				return err
			}
			if ff.margin < 0 || ff.margin >= 100 || ff.margin != ff.margin {
				return fmt.Errorf("--margin %v: want a percentage in [0, 100)", ff.margin)
			}
			if ff.top < 1 || ff.top > 1000 {
				return fmt.Errorf("--plans %d: want 1 to 1000", ff.top)
			}
			if err := cfg.Validate(); err != nil {
				return flagError(err)
			}
			margin := ff.margin / 100
			if margin == 0 {
				margin = -1 // fit.Options: none
			}
			ctx, caught, stop := stopOnSignals(cmd.Context())
			defer stop()
			rep, err := runFit(ctx, cfg, fitRequest{gpu: gpu, allow: allow, free: !ff.keepBatch, top: ff.top, margin: margin,
				base: workloadFlags(cmd.Flags(), preset, cfg), explain: ff.explain}, cmd.ErrOrStderr())
			if err != nil {
				return err
			}
			switch {
			case ff.asJSON:
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(rep.JSON()); err != nil {
					return err
				}
			default:
				rep.print(cmd.OutOrStdout(), ff.markdown)
			}
			if sig := caught(); sig != nil {
				return &fitStopped{signalError{sig: sig}}
			}
			return nil
		},
	}
	addConfigFlags(cmd.Flags(), &cfg)
	for _, name := range []string{"device", "bug"} {
		cmd.Flags().MarkHidden(name)
	}
	addModelSourceFlags(cmd.Flags(), &preset)
	cmd.Flags().StringVar(&ff.gpu, "gpu", fit.DefaultGPU, "the card whose published peaks the step times use: "+strings.Join(gpuNames(), ", ")+" (sets --gpu-mem to its memory unless given)")
	cmd.Flags().StringVar(&ff.allow, "allow", "", "changes beyond the loop's settings a plan may make: some of lora, qlora, offload, zero")
	cmd.Flags().BoolVar(&ff.keepBatch, "keep-batch", true, "keep the effective batch (micro-batch x accumulation); false lets plans shrink the micro-batch without accumulating, ranked by time per sample")
	cmd.Flags().Float64Var(&ff.margin, "margin", 100*fit.DefaultMargin, "percent of the allocator's memory a plan must leave unreserved")
	cmd.Flags().IntVar(&ff.top, "plans", fit.DefaultTop, "how many fitting plans to find")
	cmd.Flags().BoolVar(&ff.asJSON, "json", false, "print JSON (docs/fit.md)")
	cmd.Flags().BoolVar(&ff.markdown, "markdown", false, "print the plans as a markdown table")
	cmd.Flags().BoolVar(&ff.explain, "explain", false, "also compare with halving and doubling finders, and measure what each fix saves")
	return cmd
}

// fitStopped ends a search stopped by a signal, with the shell's exit code for it (signalError's).
type fitStopped struct{ signalError }

func (e *fitStopped) Error() string {
	return fmt.Sprintf("stopped by %s; what is printed is what was found until then", signalName(e.sig))
}

func gpuNames() []string {
	var names []string
	for _, g := range fit.GPUs {
		names = append(names, g.Name)
	}
	return names
}

// workloadFlags returns the run flags that describe the workload as given, less those a plan sets: the
// model's source, every workload flag the user set, and the card's memory.
func workloadFlags(fs *pflag.FlagSet, preset string, cfg train.Config) []string {
	var out []string
	if preset != "" {
		out = append(out, "--preset="+preset)
	}
	fs.Visit(func(f *pflag.Flag) {
		switch {
		case f.Name == "preset" || f.Name == "gpu-mem" || slices.Contains(fit.PlanFlagNames, f.Name):
		case fitOnly[f.Name]:
		default:
			out = append(out, "--"+f.Name+"="+f.Value.String())
		}
	})
	return append(out, "--gpu-mem="+units.FormatSizeExact(cfg.GPUMemory))
}

// fitOnly are fit's flags that are not run's.
var fitOnly = map[string]bool{"gpu": true, "allow": true, "keep-batch": true, "margin": true, "plans": true,
	"json": true, "markdown": true, "explain": true}

// fitRequest is what runFit searches for.
type fitRequest struct {
	gpu    fit.GPU
	allow  fit.Allow
	free   bool
	top    int
	margin float64
	base   []string // the workload's run flags
	// explain compares with other batch finders and measures what the common fixes save.
	explain bool
}

// fitReport is what fit found.
type fitReport struct {
	cfg    train.Config
	req    fitRequest
	batch  *fit.BatchSearch
	plans  *fit.Plans
	margin float64
	why    *fit.Explanation // with --explain
}

// runFit searches for the largest batch, then for plans, telling stderr how it goes when it is a terminal.
func runFit(ctx context.Context, cfg train.Config, req fitRequest, stderr io.Writer) (*fitReport, error) {
	progress := func(string) {}
	if outfile.IsTerminal(stderr) {
		progress = func(s string) { fmt.Fprintf(stderr, "\r\x1b[K%s", s) }
		defer fmt.Fprint(stderr, "\r\x1b[K")
	}
	n := 0
	opts := fit.Options{Margin: req.margin, Progress: func(t fit.Trial) {
		n++
		verdict := "does not fit"
		if t.Fits {
			verdict = "fits"
		}
		progress(fmt.Sprintf("fit: trial %d, micro-batch %d x %d: %s", n, t.Config.Batch, t.Config.Accum, verdict))
	}}
	rep := &fitReport{cfg: cfg, req: req, margin: req.margin}
	if rep.margin < 0 {
		rep.margin = 0
	}
	var err error
	if rep.batch, err = fit.MaxBatch(ctx, cfg, opts); err != nil {
		return nil, err
	}
	if rep.batch.Interrupted {
		rep.plans = &fit.Plans{Interrupted: true}
		return rep, nil
	}
	rep.plans, err = fit.FindPlans(ctx, cfg, fit.PlanOptions{Options: opts, GPU: req.gpu, Allow: req.allow, FreeBatch: req.free, Top: req.top})
	if err != nil || !req.explain || rep.plans.Interrupted {
		return rep, err
	}
	opts.Progress = nil
	if rep.why, err = fit.Explain(ctx, cfg, opts); err != nil && ctx.Err() != nil {
		return rep, nil // interrupted: the rest stands
	}
	return rep, err
}

// flags returns the run flags that reproduce plan p.
func (r *fitReport) flags(p *fit.Plan) string {
	return fit.JoinFlags(append(slices.Clip(r.req.base), fit.Flags(p.Config)...))
}

// fitJSON is fit --json's document (docs/fit.md).
type fitJSON struct {
	MaxBatch       int              `json:"max_batch"`
	Capped         bool             `json:"max_batch_capped,omitempty"`
	SimulatedSteps int              `json:"simulated_steps"`
	Trials         int              `json:"trials"`
	GPU            string           `json:"gpu"`
	GPUMemory      uint64           `json:"gpu_memory"`
	Limit          int64            `json:"limit"`
	Margin         float64          `json:"margin"`
	Considered     int              `json:"plans_considered"`
	Pruned         int              `json:"plans_pruned"`
	Interrupted    bool             `json:"interrupted,omitempty"`
	Plans          []planJSON       `json:"plans"`
	Explain        *fit.Explanation `json:"explain,omitempty"`
}

type planJSON struct {
	Plan          string  `json:"plan"`
	Flags         string  `json:"flags"`
	PeakAllocated int64   `json:"peak_allocated"`
	PeakReserved  int64   `json:"peak_reserved"`
	Headroom      int64   `json:"headroom"`
	Fits          bool    `json:"fits"`
	StepTime      float64 `json:"step_time_s"`
	Cost          struct {
		Compute   float64 `json:"compute_s"`
		Attention float64 `json:"attention_s"`
		Optimizer float64 `json:"optimizer_s"`
		Host      float64 `json:"host_s"`
		Comm      float64 `json:"comm_s"`
		FLOPs     float64 `json:"flops"`
	} `json:"cost"`
}

// JSON returns the report as fit --json prints it.
func (r *fitReport) JSON() fitJSON {
	j := fitJSON{MaxBatch: r.batch.MaxBatch, Capped: r.batch.Capped, SimulatedSteps: r.batch.Steps + r.plans.Steps,
		Trials: len(r.batch.Trials) + len(r.plans.Tried), GPU: r.req.gpu.Name, GPUMemory: r.cfg.GPUMemory,
		Limit: fit.Limit(r.cfg, r.margin), Margin: r.margin, Considered: r.plans.Considered, Pruned: r.plans.Pruned,
		Interrupted: r.batch.Interrupted || r.plans.Interrupted, Plans: []planJSON{}, Explain: r.why}
	for _, p := range r.plans.Fitting {
		pj := planJSON{Plan: p.Name(), Flags: r.flags(p), PeakAllocated: p.PeakAllocated, PeakReserved: p.PeakReserved,
			Headroom: p.Headroom, Fits: p.Fits, StepTime: p.StepTime()}
		c := p.Cost
		pj.Cost.Compute, pj.Cost.Attention, pj.Cost.Optimizer, pj.Cost.Host, pj.Cost.Comm, pj.Cost.FLOPs =
			c.Compute, c.Attention, c.Optimizer, c.Host, c.Comm, c.FLOPs
		j.Plans = append(j.Plans, pj)
	}
	return j
}

// print writes the report for a terminal, or its plans as a markdown table.
func (r *fitReport) print(w io.Writer, markdown bool) {
	cfg := r.cfg
	limit := fit.Limit(cfg, r.margin)
	if !markdown {
		fmt.Fprintf(w, "%s, micro-batch %d x accumulate %d, on %s (%s taken by the CUDA context), step times for %s\n",
			cfg.ModelName(), cfg.Batch, cfg.Accum, units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)), r.req.gpu.Name)
		fmt.Fprintf(w, "fits: no OOM in %d simulated steps and peak reserved <= %s (%.0f%% of what the context leaves)\n\n",
			fit.Steps(cfg), units.FormatSize(limit), 100*(1-r.margin))
		fmt.Fprintf(w, "%s.\n", capitalize(r.batch.String()))
		if r.batch.Interrupted {
			fmt.Fprintln(w, "Interrupted: the search for the largest batch stopped there.")
			return
		}
		alike := 0
		for _, p := range r.plans.Skipped {
			if p.Skipped == fit.SkippedFailsAlike {
				alike++
			}
		}
		fmt.Fprintf(w, "\nPlans that fit, cheapest first: %d combinations, %d simulated (%d steps), %d skipped by dominance, %d as failing alike:\n\n",
			r.plans.Considered, len(r.plans.Tried), r.plans.Steps, r.plans.Pruned-alike, alike)
	}
	header := []string{"#", "plan", "peak allocated", "peak reserved", "headroom", "step time"}
	if r.req.free {
		header = append(header, "per sample")
	}
	var rows [][]string
	for i, p := range r.plans.Fitting {
		row := []string{fmt.Sprint(i + 1), p.Name(), units.FormatSize(p.PeakAllocated), units.FormatSize(p.PeakReserved),
			units.FormatSize(p.Headroom), fmt.Sprintf("%.3f s", p.StepTime())}
		if r.req.free {
			row = append(row, fmt.Sprintf("%.2f ms", 1e3*p.PerSample()))
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		fmt.Fprintln(w, "No plan fits: allow more (--allow lora,qlora,offload,zero), or a larger card.")
	} else {
		table.Write(w, header, rows, markdown, 2)
	}
	if r.plans.Interrupted {
		fmt.Fprintln(w, "\nInterrupted: more plans were left to try.")
	}
	if markdown {
		return
	}
	if len(rows) > 0 {
		fmt.Fprintln(w, "\nTo run a plan:")
	}
	for i, p := range r.plans.Fitting {
		fmt.Fprintf(w, "%3d  oomdbg run %s\n", i+1, r.flags(p))
	}
	if r.why != nil {
		r.printExplain(w)
	}
}

// printExplain prints --explain's comparisons.
func (r *fitReport) printExplain(w io.Writer) {
	e := r.why
	fmt.Fprintf(w, "\nBatch finders, each trial judged by the rule above (on a GPU each trial is real steps):\n\n")
	batch := func(b int) string {
		if b == 0 {
			return "none"
		}
		return fmt.Sprint(b)
	}
	rows := [][]string{
		{e.Halving.Name, batch(e.Halving.Batch), fmt.Sprint(e.Halving.Trials), fmt.Sprint(e.Halving.Steps)},
		{e.Doubling.Name, batch(e.Doubling.Batch), fmt.Sprint(e.Doubling.Trials), fmt.Sprint(e.Doubling.Steps)},
		{"oomdbg fit (simulated)", batch(r.batch.MaxBatch), fmt.Sprint(len(r.batch.Trials)), fmt.Sprint(r.batch.Steps)},
	}
	table.Write(w, []string{"finder", "batch", "trials", "steps"}, rows, false, 1)
	fmt.Fprintf(w, "\nHalving takes the first power of two below %d that fits; the largest that fits is %s. Doubling counts\n"+
		"%d steps a trial (Lightning's steps_per_trial), halving one step for each OOM and the trial that fits.\n",
		fit.HalvingStart, batch(r.batch.MaxBatch), fit.LightningStepsPerTrial)
	if len(e.Savings) == 0 {
		return
	}
	fmt.Fprintf(w, "\nWhat each fix saves of the memory a step needs (peak allocated with unlimited memory, %d steps):\n\n", fit.Steps(r.cfg))
	rows = [][]string{{"as configured", units.FormatSize(e.Savings[0].Base), "-"}}
	for _, s := range e.Savings {
		rows = append(rows, []string{s.Fix, units.FormatSize(s.Needs), fmt.Sprintf("%.0f%%", 100*s.SavedShare)})
	}
	table.Write(w, []string{"fix", "needs", "saves"}, rows, false, 1)
}

func capitalize(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}
