package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/tracer/nvml"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// sizeFlag is a pflag.Value for sizes in binary units ("24GiB", "24GB").
type sizeFlag struct{ v *uint64 }

func (f sizeFlag) String() string {
	if f.v == nil {
		return ""
	}
	return strings.ReplaceAll(units.FormatSize(int64(*f.v)), " ", "")
}

func (f sizeFlag) Set(s string) error {
	n, err := units.ParseSize(s)
	if err != nil {
		return err
	}
	*f.v = n
	return nil
}

func (sizeFlag) Type() string { return "size" }

// addConfigFlags puts every knob of a training run on flags, with cfg's values as defaults.
func addConfigFlags(fs *pflag.FlagSet, cfg *train.Config) {
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model: mlp or gpt")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "batch size (per micro-batch with --accum)")
	fs.IntVar(&cfg.InFeatures, "in-features", cfg.InFeatures, "mlp: input features")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "mlp: hidden width")
	fs.IntVar(&cfg.Layers, "layers", cfg.Layers, "hidden layers (mlp) or transformer blocks (gpt)")
	fs.IntVar(&cfg.Classes, "classes", cfg.Classes, "mlp: output classes")
	fs.IntVar(&cfg.Seq, "seq", cfg.Seq, "gpt: sequence length (the block size)")
	fs.IntVar(&cfg.DModel, "d-model", cfg.DModel, "gpt: embedding width")
	fs.IntVar(&cfg.Heads, "heads", cfg.Heads, "gpt: attention heads")
	fs.IntVar(&cfg.Vocab, "vocab", cfg.Vocab, "gpt: vocabulary size")
	fs.Float32Var(&cfg.Dropout, "dropout", cfg.Dropout, "gpt: dropout probability")
	fs.StringVar(&cfg.AMP, "amp", cfg.AMP, "mixed precision: off, fp16 (with loss scaling) or bf16")
	fs.StringVar(&cfg.Checkpoint, "checkpoint", cfg.Checkpoint, "gpt activation checkpointing: off, all, every:N or attn")
	fs.StringVar(&cfg.Attention, "attention", cfg.Attention, "gpt attention: naive (scores materialised) or flash")
	fs.IntVar(&cfg.Accum, "accum", cfg.Accum, "micro-batches per optimizer step (gradient accumulation)")
	fs.StringVar(&cfg.Logits, "logits", cfg.Logits, "what the loop does with the logits: keep them alive through backward until the next forward (nanoGPT's train.py; the gpt presets' default) or drop them before backward (HF Trainer's compute_loss; the mlp's default)")
	fs.IntVar(&cfg.Steps, "steps", cfg.Steps, "training steps")
	fs.IntVar(&cfg.EvalEvery, "eval-every", cfg.EvalEvery, "evaluate after every N-th step (0: never)")
	fs.StringVar(&cfg.Device, "device", cfg.Device, "device: meta (no math, any size in milliseconds), cpu (real float32 math) or cuda")
	fs.Var(sizeFlag{&cfg.GPUMemory}, "gpu-mem", "device memory, e.g. 24GiB or 80GB (binary units)")
	fs.Var(sizeFlag{&cfg.ContextReserve}, "context-reserve", "memory the CUDA context takes before the allocator")
	fs.StringVar(&cfg.AllocConf, "alloc-conf", cfg.AllocConf, "caching allocator settings, as PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True)")
	fs.StringVar(&cfg.Optimizer, "optimizer", cfg.Optimizer, "optimizer: sgd, momentum, adam or adamw")
	fs.Float32Var(&cfg.LR, "lr", cfg.LR, "learning rate")
	fs.Float32Var(&cfg.WeightDecay, "weight-decay", cfg.WeightDecay, "weight decay (adamw defaults to 0.01)")
	fs.StringVar(&cfg.ZeroGrad, "zero-grad", cfg.ZeroGrad, "zero_grad: none (set_to_none) or zero (in place)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	fs.StringVar(&cfg.Bug, "bug", cfg.Bug, "a leak bug to plant: "+strings.Join(train.Bugs, ", "))
}

// configFromFlags returns the run configuration the command line describes: the preset (or the model's
// default) first, then every flag the user set, in the order given.
func configFromFlags(fs *pflag.FlagSet, preset string) (train.Config, error) {
	base := train.DefaultMLP()
	if model, _ := fs.GetString("model"); preset == "" && model == "gpt" {
		preset = train.DefaultPreset
	}
	if preset != "" {
		var err error
		if base, err = train.PresetConfig(preset); err != nil {
			return base, err
		}
	}
	replay := pflag.NewFlagSet("", pflag.ContinueOnError)
	addConfigFlags(replay, &base)
	var err error
	fs.Visit(func(f *pflag.Flag) {
		if replay.Lookup(f.Name) != nil && err == nil {
			err = replay.Set(f.Name, f.Value.String())
		}
	})
	return base, err
}

func newRunCmd() *cobra.Command {
	cfg := train.DefaultMLP()
	var out, preset string
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Record a training workload headless into a snapshot file",
		Long: `Run a training workload and record every allocation, with its stack, phase, iteration, module and
category, into a snapshot file; then print the peak, the phases and the OOM, if any.

Every dimension of the model and every setting of the run is a flag, so any shape can be recorded
without writing code. The gpt loop is nanoGPT's train.py: it keeps the logits alive through backward
until the next forward returns (--logits drop frees them before backward, as HF Trainer does). An OOM
stops the run like it stops a PyTorch job, with a complete snapshot; so does Ctrl-C. The exit code is 1 when the run ran out of memory.`,
		Example: `  oomdbg run --preset gpt2-medium -o medium.oomdbg          # OOMs on a 24 GiB card
  oomdbg run --preset gpt2-medium --amp bf16 --attention flash --checkpoint all
  oomdbg run --hidden 4096 --layers 8 --batch 4096 --gpu-mem 8GiB -o big.oomdbg
  oomdbg run --bug retain-graph --steps 20 -o leak.oomdbg`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := configFromFlags(cmd.Flags(), preset)
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			return runRecord(cmd.Context(), cfg, out, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	addConfigFlags(cmd.Flags(), &cfg)
	cmd.Flags().StringVar(&preset, "preset", "", "start from a built-in workload: "+strings.Join(train.PresetNames(), ", "))
	cmd.Flags().StringVarP(&out, "output", "o", "run.oomdbg", "snapshot file to write")
	return cmd
}

// runRecord records cfg into the file out and prints the summary.
func runRecord(ctx context.Context, cfg train.Config, out string, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt)
	defer stop()
	f, err := os.Create(out)
	if err != nil {
		return err
	}
	w := bufio.NewWriterSize(f, 1<<20)
	res, err := train.Record(ctx, cfg, w, train.RecordOptions{ToolVersion: toolVersion(), OnStart: nvmlSamples(ctx, cfg, stderr)})
	if ferr := w.Flush(); err == nil {
		err = ferr
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	info, _ := os.Stat(out)
	printRunSummary(stdout, cfg, res, out, info.Size())
	if res.OOM != nil {
		return &problemError{msg: fmt.Sprintf("out of memory in iteration %d, %s (snapshot %s)", res.OOM.Iteration, res.OOM.Phase, out)}
	}
	return nil
}

// nvmlSamples returns, for a run on the cuda device, a function that feeds the recorder NVML's reading of
// the GPU's used memory every 100 ms (as sample events), so the snapshot shows what the driver saw next to
// what the allocator held. Simulated devices have nothing to read; without a driver it says so once.
func nvmlSamples(ctx context.Context, cfg train.Config, stderr io.Writer) func(*tracer.Recorder) func() {
	if cfg.Device != "cuda" {
		return nil
	}
	return func(rec *tracer.Recorder) func() {
		s, err := nvml.Open()
		if err != nil {
			fmt.Fprintf(stderr, "oomdbg: %v; recording without device readings\n", err)
			return func() {}
		}
		sampler := nvml.StartSampler(ctx, s, 0, nvml.DefaultInterval, func(dev int, used, _ uint64, _ time.Time) {
			rec.Sample(dev, "nvml.used", int64(used))
		})
		return func() {
			sampler.Stop()
			s.Close()
		}
	}
}

// printRunSummary prints what a run did: the model, the peak, each phase of the first and last iterations,
// and the OOM.
func printRunSummary(w io.Writer, cfg train.Config, res *train.Result, path string, size int64) {
	fmt.Fprintf(w, "snapshot   %s (%s)\n", path, units.FormatSize(size))
	fmt.Fprintf(w, "model      %s, %s parameters, batch %d, %s, device %s with %s (%s CUDA context)\n",
		cfg.Model, humanCount(res.Parameters), cfg.Batch, cfg.Optimizer, cfg.Device,
		units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
	fmt.Fprintf(w, "steps      %d of %d", res.Steps, cfg.Steps)
	if n := len(res.Losses); n > 0 && cfg.Device == "cpu" {
		fmt.Fprintf(w, ", loss %.4f -> %.4f", res.Losses[0], res.Losses[n-1])
	}
	if res.Interrupted {
		fmt.Fprint(w, " (interrupted)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "peak       %s allocated, %s reserved\n\n", units.FormatSize(res.PeakAllocated), units.FormatSize(res.PeakReserved))

	last := -1
	for _, p := range res.Phases {
		last = max(last, p.Iteration)
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "iteration\tphase\tpeak\tat end\t")
	for _, p := range res.Phases {
		if p.Iteration > 0 && p.Iteration != last {
			continue
		}
		it := fmt.Sprint(p.Iteration)
		if p.Iteration < 0 {
			it = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t\n", it, p.Phase, units.FormatSize(p.Peak), units.FormatSize(p.End))
	}
	tw.Flush()
	if res.OOM != nil {
		fmt.Fprintf(w, "\nOOM in iteration %d, %s, allocating %s:\n%s\n", res.OOM.Iteration, res.OOM.Phase, res.OOM.Tensor, res.OOM.Message)
	}
}

// humanCount prints a parameter count: 1.3B, 355M, 12.5K.
func humanCount(n int) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
