package main

import (
	"fmt"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/outfile"
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
			req := fit.Request{FreeBatch: !ff.keepBatch, Top: ff.top, Margin: ff.margin / 100, Explain: ff.explain}
			if req.GPU, err = fit.LookupGPU(ff.gpu); err != nil {
				return err
			}
			if cmd.Flags().Changed("gpu") && !cmd.Flags().Changed("gpu-mem") {
				cfg.GPUMemory = req.GPU.Memory
			}
			if req.Allow, err = fit.ParseAllow(ff.allow); err != nil {
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
			req.Base = workloadFlags(cmd.Flags(), preset, cfg)
			if outfile.IsTerminal(cmd.ErrOrStderr()) {
				req.Progress = cmd.ErrOrStderr()
			}
			ctx, caught, stop := stopOnSignals(cmd.Context())
			defer stop()
			rep, err := fit.Search(ctx, cfg, req)
			if err != nil {
				return err
			}
			write := rep.WriteText
			switch {
			case ff.asJSON:
				write = rep.WriteJSON
			case ff.markdown:
				write = rep.WriteMarkdown
			}
			if err := write(cmd.OutOrStdout()); err != nil {
				return err
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
