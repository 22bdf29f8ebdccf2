package main

import (
	"errors"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// checked parses a number with parse and holds it to check: a fix's bound.
func checked[T any](parse func(string) (T, error), check func(T) error) func(string) (T, error) {
	return func(s string) (T, error) {
		v, err := parse(s)
		if err == nil {
			err = check(v)
		}
		return v, err
	}
}

// newWhatIfCmd is `oomdbg whatif FILE [fixes]`.
func newWhatIfCmd() *cobra.Command {
	var (
		r      whatif.Request
		amp    string
		gpuMem uint64
		asJSON bool
		mem    memory
	)
	cmd := &cobra.Command{
		Use:   "whatif FILE",
		Short: "Apply fixes to a recorded trace and replay it: would the run still run out of memory?",
		Long: `Change a recorded trace the way a fix would change the program's requests to the caching allocator,
replay it through oomdbg's model of the allocator, and print the peak allocated and reserved memory and
whether the run fits, before and after, with PyTorch's message where it does not.

The fixes read the trace's tags (phase, iteration, category, module scope); oomdbg's recordings carry them
all. A trace that lacks what a fix needs is refused, never guessed. Each fix says what it assumed, with
its figures. A trace that ends in an out-of-memory error is changed as far as it was recorded: what would
have come after was never recorded. Mixed precision cannot be read off a trace (dtypes are not recorded).

The device's capacity is --gpu-mem, else the recorded device's (less the CUDA context), else the memory
reserved at a recorded OOM plus what the device reported free. See docs/whatif.md.`,
		Example: `  oomdbg whatif run.oomdbg --batch-scale 0.5
  oomdbg whatif run.oomdbg --accum 4 --optimizer sgd
  oomdbg whatif run.oomdbg --checkpoint every:2 --alloc-conf expandable_segments:True --json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("amp") {
				return errors.New("--amp: mixed precision cannot be read off a trace: a trace records sizes, not " +
					"dtypes, so which tensors would halve is unknown; simulate the model instead (oomdbg run --amp bf16 ...)")
			}
			fix, err := r.Fix()
			if errors.Is(err, whatif.ErrNoFix) {
				return errors.New("no fix given: add --batch-scale, --accum, --optimizer, --optimizer-impl, --zero-grad, --checkpoint or --alloc-conf")
			}
			if err != nil {
				return err
			}
			rep, err := app.WhatIf(args[0], fix, gpuMem, &mem.Limit)
			if err != nil {
				return err
			}
			if asJSON {
				return rep.WriteJSON(cmd.OutOrStdout())
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.Var(optional(&r.BatchScale, checked(func(s string) (float64, error) { return strconv.ParseFloat(s, 64) }, transform.CheckBatchScale),
		"float", ""), "batch-scale", "multiply the batch by this factor, e.g. 0.5")
	f.Var(optional(&r.Accum, checked(strconv.Atoi, transform.CheckAccumulate), "int", ""), "accum",
		"accumulate gradients over K micro-batches of batch/K")
	f.Var(optional(&r.Optimizer, checked(knob.ParseOptimizer, transform.CheckOptimizer), "string", ""), "optimizer",
		"switch the optimizer: sgd, momentum, adam, adamw or adamw8bit (bitsandbytes)")
	f.Var(optional(&r.OptimizerImpl, knob.ParseOptimizerImpl, "string", ""), "optimizer-impl",
		"run Adam's step as foreach or for-loop (one parameter at a time)")
	f.Var(optional(&r.ZeroGrad, knob.ParseZeroGrad, "string", ""), "zero-grad", "zero_grad mode: none (set_to_none) or zero")
	f.Var(optional(&r.Checkpoint, checked(knob.ParseCheckpoint, transform.CheckCheckpoint), "string", ""), "checkpoint",
		"activation checkpointing of the repeated blocks: all or every:N")
	f.Var(optional(&r.AllocConf, allocator.ParseConfig, "string", ""), "alloc-conf",
		"allocator settings for the replay after, as PYTORCH_CUDA_ALLOC_CONF")
	f.StringVar(&amp, "amp", "", "mixed precision: refused, since a trace does not record dtypes")
	f.Var(sizeFlag{&gpuMem}, "gpu-mem", "device memory the allocator may use, e.g. 24GiB (binary units) (default: the recorded device's, less the CUDA context; else the memory reserved at a recorded OOM plus what the device reported free)")
	f.Lookup("gpu-mem").DefValue = "0" // not shown: the usage says what the default is
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	addMemoryFlag(f, &mem)
	return cmd
}
