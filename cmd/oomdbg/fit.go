package main

import (
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/fit/layouts"
	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/outfile"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
	"github.com/oomdbg/oomdbg/workloads/train"
)

func newFitCmd() *cobra.Command {
	cfg, err := train.PresetConfig(train.DefaultPreset)
	if err != nil {
		panic(err) // the default preset is built in
	}
	var gpu, allow string
	var keepBatch, asJSON, explain, markdown bool
	var margin float64
	var top int
	var flags *configFlags
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
the run flags that reproduce it. Ctrl-C prints what was found so far. With --gpus 2 or more, a dense
decoder trained whole is also laid out as Megatron-LM would lay it out: the text ends with the fastest
model-parallel layouts that fit by the memory formulas (oomdbg layouts), which run cannot simulate.

Exit codes: 0 a plan fits, 1 no plan fits (a line on stderr says so), 2 bad usage, 130 interrupted.`,
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
			cfg, err := flags.config()
			if err != nil {
				return err
			}
			flags.writeSource(cmd.ErrOrStderr())
			req := fit.Request{FreeBatch: !keepBatch, Top: top, Margin: margin / 100, Explain: explain}
			if req.GPU, err = fit.LookupGPU(gpu); err != nil {
				return err
			}
			if cmd.Flags().Changed("gpu") && !cmd.Flags().Changed("gpu-mem") {
				cfg.GPUMemory = req.GPU.Memory
			}
			if req.Allow, err = fit.ParseAllow(allow); err != nil {
				return err
			}
			if margin < 0 || margin >= 100 || margin != margin {
				return fmt.Errorf("--margin %v: want a percentage in [0, 100)", margin)
			}
			if top < 1 || top > 1000 {
				return fmt.Errorf("--plans %d: want 1 to 1000", top)
			}
			req.Base = flags.runFlags(cfg)
			if outfile.IsTerminal(cmd.ErrOrStderr()) {
				req.Progress = cmd.ErrOrStderr()
			}
			ctx, caught, stop := app.StopOnSignals(cmd.Context())
			defer stop()
			rep, err := fit.Search(ctx, cfg, req)
			if err != nil {
				return flags.explain(err)
			}
			write := rep.WriteText
			switch {
			case asJSON:
				write = rep.WriteJSON
			case markdown:
				write = rep.WriteMarkdown
			}
			out := &checkedWriter{w: cmd.OutOrStdout()}
			if err := write(out); err != nil {
				return err
			}
			sig := caught()
			var mp *layouts.Report
			if sig == nil && !asJSON && !markdown {
				var runs layoutRuns
				if mp, runs = modelParallel(cmd.Context(), flags, cfg, req); mp != nil {
					fmt.Fprintf(out, "\nModel-parallel layouts of the %d GPUs as Megatron-LM trains the model\n"+
						"(bf16 mixed precision, Adam): searched with its memory formulas, then each\n"+
						"layout's ranks simulated (oomdbg layouts searches with more options).\n", cfg.Parallel.World())
					if err := mp.WriteText(out); err != nil {
						return err
					}
					runs.write(out, mp.Job.Usable)
				}
			}
			if err := out.Err(); err != nil {
				return err
			}
			if sig != nil {
				return &app.SignalError{Sig: sig, Then: "what is printed is what was found until then"}
			}
			if len(rep.Plans.Fitting) == 0 {
				msg := fmt.Sprintf("no plan fits %s within %s of its %s", cfg.ModelName(),
					units.FormatSize(fit.Limit(cfg, req.Margin)), units.FormatSize(int64(cfg.GPUMemory)))
				if mp != nil && mp.Fitting > 0 {
					msg += fmt.Sprintf(" (%d model-parallel layouts fit by the formulas: above)", mp.Fitting)
				}
				return &app.ProblemError{Msg: msg}
			}
			return nil
		},
	}
	flags = addConfigFlags(cmd.Flags(), cfg).addHFConfig()
	flags.defaultPreset = train.DefaultPreset
	for _, name := range []string{"device", "bug"} {
		cmd.Flags().MarkHidden(name)
	}
	flags.showDefaults()
	cmd.Flags().StringVar(&gpu, "gpu", fit.DefaultGPU, "the card whose published peaks the step times use: "+strings.Join(gpuNames(), ", ")+
		"; when given, --gpu-mem is its memory unless given too (default: "+fit.DefaultGPU+"'s step times, on the workload's --gpu-mem)")
	cmd.Flags().Lookup("gpu").DefValue = ""
	cmd.Flags().StringVar(&allow, "allow", "", "changes beyond the loop's settings a plan may make: some of lora, qlora, offload, zero")
	cmd.Flags().BoolVar(&keepBatch, "keep-batch", true, "keep the effective batch (micro-batch x accumulation); false lets plans shrink the micro-batch without accumulating, ranked by time per sample")
	cmd.Flags().Float64Var(&margin, "margin", 100*fit.DefaultMargin, "percent of the allocator's memory a plan must leave unreserved")
	cmd.Flags().IntVar(&top, "plans", fit.DefaultTop, "how many fitting plans to find")
	cmd.Flags().BoolVar(&asJSON, "json", false, "print JSON (docs/fit.md)")
	cmd.Flags().BoolVar(&markdown, "markdown", false, "print the plans as a markdown table")
	cmd.Flags().BoolVar(&explain, "explain", false, "also compare with halving and doubling finders, and measure what each fix saves")
	return cmd
}

// modelParallelPlans is how many layouts fit prints.
const modelParallelPlans = 5

// modelParallel searches the Megatron layouts (DP x TP x PP x CP) of a job of more than one GPU whose model
// the layouts' formulas describe: a dense decoder (--preset or --hf-config), trained whole. It returns nil
// where that does not apply: one GPU, adapters, another model, or a job the search refuses.
func modelParallel(ctx context.Context, flags *configFlags, cfg train.Config, req fit.Request) (*layouts.Report, layoutRuns) {
	var runs layoutRuns
	world := cfg.Parallel.World()
	if world < 2 || cfg.LoRA > 0 || cfg.QLoRA || flags.configFile != "" || flags.preset == "" && flags.hfConfig == "" {
		return nil, runs
	}
	model, name, err := layoutsModel(flags.preset, flags.hfConfig, cfg.Seq)
	if err != nil {
		return nil, runs
	}
	job := layouts.Job{Name: name, Model: model, GPUs: world, Nodes: cfg.Parallel.NodeCount(),
		GlobalBatch: max(cfg.Batch, 1) * max(cfg.Accum, 1) * world, GPU: req.GPU,
		Usable: int64(cfg.GPUMemory) - int64(cfg.ContextReserve), Margin: req.Margin, Top: layoutCandidates}
	rep, err := layouts.Search(job)
	if err != nil {
		return nil, runs
	}
	// The formulas pruned; each candidate, fastest first, now runs through run's own flags on the meta
	// device, every rank that differs, until modelParallelPlans fit.
	var base []string
	for _, f := range flags.runFlags(cfg) {
		if !strings.HasPrefix(f, "--gpus=") && !strings.HasPrefix(f, "--nodes=") { // the layout's flags give them
			base = append(base, f)
		}
	}
	limit := fit.Limit(cfg, req.Margin)
	var kept []layouts.Plan
	seen := map[string]bool{} // layouts that differ only where the runtime does not (selective and no recompute under flash attention)
	for _, p := range rep.Plans {
		if len(kept) == modelParallelPlans || ctx.Err() != nil {
			break
		}
		lr := layoutRun{flags: append(slices.Clone(base), layoutFlags(p, world, cfg.Parallel.NodeCount(), cfg.Seq)...)}
		key := strings.Join(lr.flags, " ")
		if seen[key] {
			continue
		}
		seen[key] = true
		if err := lr.simulate(ctx, limit); err != nil { // the workload's own flags refuse a split (e.g. --eval-every)
			runs.err = err
			break
		}
		runs.simulated++
		if lr.fits {
			kept = append(kept, p)
			runs.listed = append(runs.listed, lr)
		}
	}
	rep.Plans = kept
	return rep, runs
}

// layoutRuns is what simulating the formulas' layouts found: the runs listed, how many were simulated, and
// the error that stopped them.
type layoutRuns struct {
	listed    []layoutRun
	simulated int
	err       error
}

// layoutCandidates is how many of the formulas' fastest layouts fit may simulate to find modelParallelPlans.
const layoutCandidates = 40 * modelParallelPlans

// layoutRun is a layout as run's flags, and what simulating its ranks found.
type layoutRun struct {
	flags    []string
	peak     int64 // the highest peak reserved of its ranks
	peakRank int
	fits     bool
}

// layoutFlags are the run flags of plan p on a job of world GPUs on nodes, Megatron's mixed precision as the
// runtime has it: with the distributed optimizer DeepSpeed's bf16 ZeRO-1 (bf16 weights, fp32 master weights
// and Adam sharded over the data-parallel ranks), else autocast to bf16 over fp32 weights; selective
// recompute is flash attention (the scores are never stored), full recompute checkpoints every layer.
func layoutFlags(p layouts.Plan, world, nodes, seq int) []string {
	l := p.Layout
	f := []string{"--gpus", strconv.Itoa(world), "--nodes", strconv.Itoa(nodes), "--tp", strconv.Itoa(l.TP),
		"--pp", strconv.Itoa(l.PP), "--cp", strconv.Itoa(l.CP), "--batch", strconv.Itoa(p.MicroBatch),
		"--accum", strconv.Itoa(l.MicroBatches), "--seq", strconv.Itoa(seq), "--attention", "flash", "--optimizer", "adamw"}
	if l.SequenceParallel {
		f = append(f, "--sp")
	}
	if l.PP > 1 {
		f = append(f, "--pp-schedule", l.Schedule.String())
	}
	checkpoint := "off"
	if l.Recompute == layout.RecomputeFull {
		checkpoint = "all"
	}
	f = append(f, "--checkpoint", checkpoint)
	if l.DistributedOptimizer && l.DP*l.CP > 1 {
		return append(f, "--dp", "zero1", "--weights", "bf16", "--amp", "off")
	}
	return append(f, "--dp", "ddp", "--weights", "f32", "--amp", "bf16")
}

// simulate parses the flags as run does and runs each rank that differs for two steps on the meta device.
func (lr *layoutRun) simulate(ctx context.Context, limit int64) error {
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	flags := addConfigFlags(fs, train.DefaultMLP()).addHFConfig()
	if err := fs.Parse(lr.flags); err != nil {
		return err
	}
	cfg, err := flags.config()
	if err != nil {
		return err
	}
	cfg.Device, cfg.Steps = device.Meta, 2
	cfg.Accum = peakMicroBatches(cfg)
	ranks, err := train.DistinctRanks(cfg)
	if err != nil {
		return err
	}
	if len(ranks) > 2 {
		// The pipeline's first and last stages: a middle stage holds the first's layers without its
		// embeddings, and fewer micro-batches in flight.
		ranks = []int{ranks[0], ranks[len(ranks)-1]}
	}
	lr.fits = true
	for _, r := range ranks {
		cfg.Parallel.Rank = r
		res, err := train.RunWithin(ctx, cfg, limit)
		if err != nil {
			return err
		}
		if res.PeakReserved > lr.peak {
			lr.peak, lr.peakRank = res.PeakReserved, r
		}
		if res.OOM != nil || res.OverLimit || res.PeakReserved > limit {
			lr.fits = false
			return nil
		}
	}
	return nil
}

// peakMicroBatches is how many of a pipelined step's micro-batches fit simulates: every stage reaches its
// peak within the first 2*PP (1F1B and interleaved, whose steady state then repeats one forward and one
// backward), so more add only what the allocator caches of repeated passes; GPipe holds every one.
func peakMicroBatches(cfg train.Config) int {
	_, pp, _ := cfg.Split.Sizes()
	if pp == 1 || cfg.Split.Schedule.Kind == layout.GPipe || cfg.Accum <= 2*pp {
		return cfg.Accum
	}
	return 2 * pp
}

// write prints how many layouts were simulated and each listed one's run command with what its simulation
// found.
func (rs layoutRuns) write(w io.Writer, usable int64) {
	if rs.err != nil {
		fmt.Fprintf(w, "\nThe layouts could not be run: %v\n", rs.err)
		return
	}
	fmt.Fprintf(w, "\n%d of the fastest layouts simulated (each as run takes it; a pipeline's first and last stages over\n"+
		"its first 2 x PP micro-batches, where they peak); %d fit when run.\n", rs.simulated, len(rs.listed))
	if len(rs.listed) == 0 {
		return
	}
	fmt.Fprintf(w, "To run a layout (the peak reserved of its fullest rank, of %s usable):\n", units.FormatSize(usable))
	for i, lr := range rs.listed {
		fmt.Fprintf(w, "  %d  oomdbg run %s   (rank %d: %s)\n", i+1, strings.Join(lr.flags, " "), lr.peakRank, units.FormatSize(lr.peak))
	}
}

func gpuNames() []string {
	var names []string
	for _, g := range fit.GPUs {
		names = append(names, g.Name)
	}
	return names
}

// runFlags returns the run flags that describe the workload as given, less those a plan sets: the model's
// source, every workload flag the user set, and the card's memory.
func (f *configFlags) runFlags(cfg train.Config) []string {
	var out []string
	if f.preset != "" {
		out = append(out, "--preset="+f.preset)
	}
	f.fs.Visit(func(fl *pflag.Flag) {
		_, workload := f.copies[fl.Name]
		if (workload || fl.Name == "hf-config") && fl.Name != "gpu-mem" && !slices.Contains(fit.PlanFlagNames, fl.Name) {
			out = append(out, "--"+fl.Name+"="+fl.Value.String())
		}
	})
	return append(out, "--gpu-mem="+units.FormatSizeExact(cfg.GPUMemory))
}
