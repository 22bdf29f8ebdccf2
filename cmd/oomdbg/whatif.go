package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// whatIfOptions are the fixes `oomdbg whatif` applies, as its flags give them.
type whatIfOptions struct {
	batchScale float64
	accum      int
	optimizer  string
	optImpl    string
	zeroGrad   string
	checkpoint string
	allocConf  string
	amp        string
	gpuMem     uint64
	changed    func(string) bool
}

// fix parses the flags into the fix they ask for.
func (o whatIfOptions) fix() (whatif.Fix, error) {
	var r whatif.Request
	if o.changed("amp") {
		return whatif.Fix{}, errors.New("--amp: mixed precision cannot be read off a trace: a trace records sizes, not " +
			"dtypes, so which tensors would halve is unknown; simulate the model instead (oomdbg run --amp bf16 ...)")
	}
	if o.changed("checkpoint") {
		c, err := knob.ParseCheckpoint(o.checkpoint)
		if err != nil {
			return whatif.Fix{}, fmt.Errorf("--checkpoint: %w", err)
		}
		r.Checkpoint = &c
	}
	if o.changed("batch-scale") {
		if err := transform.CheckBatchScale(o.batchScale); err != nil {
			return whatif.Fix{}, fmt.Errorf("--batch-scale %g: %w", o.batchScale, err)
		}
		r.BatchScale = &o.batchScale
	}
	if o.changed("accum") {
		if err := transform.CheckAccumulate(o.accum); err != nil {
			return whatif.Fix{}, fmt.Errorf("--accum %d: %w", o.accum, err)
		}
		r.Accum = &o.accum
	}
	if o.changed("zero-grad") {
		m, err := knob.ParseZeroGrad(o.zeroGrad)
		if err != nil {
			return whatif.Fix{}, fmt.Errorf("--zero-grad: %w", err)
		}
		r.ZeroGrad = &m
	}
	if o.changed("optimizer-impl") {
		impl, err := knob.ParseOptimizerImpl(o.optImpl)
		if err != nil {
			return whatif.Fix{}, fmt.Errorf("--optimizer-impl: %w", err)
		}
		r.OptimizerImpl = &impl
	}
	if o.changed("optimizer") {
		opt, err := knob.ParseOptimizer(o.optimizer)
		if err != nil {
			return whatif.Fix{}, fmt.Errorf("--optimizer: %w", err)
		}
		r.Optimizer = &opt
	}
	if o.changed("alloc-conf") {
		c, err := allocator.ParseConfig(o.allocConf)
		if err != nil {
			return whatif.Fix{}, fmt.Errorf("--alloc-conf %q: %w", o.allocConf, err)
		}
		r.AllocConf = &c
	}
	f, err := r.Fix()
	if errors.Is(err, whatif.ErrNoFix) {
		return f, errors.New("no fix given: add --batch-scale, --accum, --optimizer, --optimizer-impl, --zero-grad, --checkpoint or --alloc-conf")
	}
	return f, err
}

// newWhatIfCmd is `oomdbg whatif FILE [fixes]`.
func newWhatIfCmd() *cobra.Command {
	var (
		o      whatIfOptions
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
			o.changed = cmd.Flags().Changed
			fix, err := o.fix()
			if err != nil {
				return err
			}
			rep, err := app.WhatIf(args[0], fix, o.gpuMem, &mem.Limit)
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
	f.Float64Var(&o.batchScale, "batch-scale", 1, "multiply the batch by this factor, e.g. 0.5")
	f.IntVar(&o.accum, "accum", 1, "accumulate gradients over K micro-batches of batch/K")
	f.StringVar(&o.optimizer, "optimizer", "", "switch the optimizer: sgd, momentum, adam, adamw or adamw8bit (bitsandbytes)")
	f.StringVar(&o.optImpl, "optimizer-impl", "", "run Adam's step as foreach or for-loop (one parameter at a time)")
	f.StringVar(&o.zeroGrad, "zero-grad", "", "zero_grad mode: none (set_to_none) or zero")
	f.StringVar(&o.checkpoint, "checkpoint", "", "activation checkpointing of the repeated blocks: all or every:N")
	f.StringVar(&o.allocConf, "alloc-conf", "", "allocator settings for the replay after, as PYTORCH_CUDA_ALLOC_CONF")
	f.StringVar(&o.amp, "amp", "", "mixed precision: refused, since a trace does not record dtypes")
	f.Var(sizeFlag{&o.gpuMem}, "gpu-mem", "device memory the allocator may use, e.g. 24GiB (binary units)")
	f.BoolVar(&asJSON, "json", false, "print the result as JSON")
	addMemoryFlag(f, &mem)
	return cmd
}
