package main

import (
	"context"
	"encoding"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/oomdbg/oomdbg/leaks"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/tracer/nvml"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// sizeFlag is a pflag.Value for sizes in binary units ("24GiB", "24GB"), up to max bytes.
type sizeFlag struct {
	v   *uint64
	max uint64
}

// String prints the size exactly, so that setting it back gives the same bytes.
func (f sizeFlag) String() string {
	if f.v == nil {
		return ""
	}
	return units.FormatSizeExact(*f.v)
}

func (f sizeFlag) Set(s string) error {
	n, err := units.ParseSize(s)
	if err != nil {
		return err
	}
	if n > f.max {
		return fmt.Errorf("%s is more than %s", s, units.FormatSizeExact(f.max))
	}
	*f.v = n
	return nil
}

func (sizeFlag) Type() string { return "size" }

// maxSize bounds the sizes flags take: 1 PiB of device memory is the most a run simulates, and more than any
// machine has of anything else.
const maxSize = train.MaxGPUMemory

// textFlag is a pflag.Value for the settings a Config parses from words (knob.AMP, knob.Checkpoint,
// device.Kind, ...): a value is parsed once, when the flag is set, and a bad one is refused there.
type textFlag struct {
	v interface {
		encoding.TextMarshaler
		encoding.TextUnmarshaler
	}
}

func (f textFlag) String() string {
	if f.v == nil {
		return ""
	}
	b, _ := f.v.MarshalText()
	return string(b)
}

func (f textFlag) Set(s string) error { return f.v.UnmarshalText([]byte(s)) }

func (textFlag) Type() string { return "string" }

// seqDistFlag is --seq-dist. It is a textFlag but for file:PATH, which reads the file when the flag is set:
// configFromFlags copies the value it read instead of setting the flag again, so the file is read once (a
// FIFO or /dev/stdin could not be read twice).
type seqDistFlag struct{ v *train.SeqDist }

func (f seqDistFlag) String() string {
	if f.v == nil {
		return ""
	}
	return f.v.String()
}

func (f seqDistFlag) Set(s string) error { return f.v.UnmarshalText([]byte(s)) }

func (seqDistFlag) Type() string { return "string" }

// routingFlag is --routing, read once as --seq-dist is: file:PATH reads the file when the flag is set.
type routingFlag struct{ v *train.Routing }

func (f routingFlag) String() string {
	if f.v == nil {
		return ""
	}
	return f.v.String()
}

func (f routingFlag) Set(s string) error { return f.v.UnmarshalText([]byte(s)) }

func (routingFlag) Type() string { return "string" }

// addConfigFlags puts every knob of a training run on flags, with cfg's values as defaults.
func addConfigFlags(fs *pflag.FlagSet, cfg *train.Config) {
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model: mlp, gpt, llama (a Llama-family decoder: Llama, Mistral, Qwen2; Mixtral, Qwen-MoE, Gemma and Phi-3 from a preset or --hf-config) or bert")
	fs.IntVar(&cfg.Batch, "batch", cfg.Batch, "batch size (per micro-batch with --accum)")
	fs.IntVar(&cfg.InFeatures, "in-features", cfg.InFeatures, "mlp: input features")
	fs.IntVar(&cfg.Hidden, "hidden", cfg.Hidden, "mlp: hidden width")
	fs.IntVar(&cfg.Layers, "layers", cfg.Layers, "hidden layers (mlp) or transformer blocks (gpt, llama)")
	fs.IntVar(&cfg.Classes, "classes", cfg.Classes, "mlp: output classes")
	fs.IntVar(&cfg.Seq, "seq", cfg.Seq, "gpt, llama: sequence length (gpt: the block size)"+presetDefault(cfg))
	fs.IntVar(&cfg.DModel, "d-model", cfg.DModel, "gpt, llama: embedding width (hidden_size)"+presetDefault(cfg))
	fs.IntVar(&cfg.Heads, "heads", cfg.Heads, "gpt, llama: attention heads"+presetDefault(cfg))
	fs.IntVar(&cfg.Vocab, "vocab", cfg.Vocab, "gpt, llama: vocabulary size"+presetDefault(cfg))
	fs.Float32Var(&cfg.Dropout, "dropout", cfg.Dropout, "gpt: dropout probability; llama: attention dropout"+presetDefault(cfg))
	fs.IntVar(&cfg.KVHeads, "kv-heads", cfg.KVHeads, "llama: key-value heads (grouped-query attention; 0: as many as heads)")
	fs.IntVar(&cfg.FFN, "ffn", cfg.FFN, "llama: MLP width (intermediate_size)")
	fs.IntVar(&cfg.HeadDim, "head-dim", cfg.HeadDim, "llama: head size (0: d-model / heads)")
	fs.BoolVar(&cfg.Tied, "tied", cfg.Tied, "llama: lm_head shares the embedding's weight")
	fs.BoolVar(&cfg.QKVBias, "qkv-bias", cfg.QKVBias, "llama: biases on q, k and v (Qwen2)")
	fs.Var(textFlag{&cfg.Weights}, "weights", "llama: the parameters' dtype (from_pretrained's torch_dtype): f32, bf16 or fp16")
	fs.IntVar(&cfg.LoRA, "lora", cfg.LoRA, "llama: LoRA adapters of rank R on --lora-targets, the base frozen (0: full fine-tune)")
	fs.Float32Var(&cfg.LoRAAlpha, "lora-alpha", cfg.LoRAAlpha, "llama: LoRA alpha (scaling alpha/R; 0: peft's default 8)")
	fs.Float32Var(&cfg.LoRADropout, "lora-dropout", cfg.LoRADropout, "llama: LoRA dropout")
	fs.Var(textFlag{&cfg.LoRATargets}, "lora-targets", "llama, bert: projections adapted, some of q,k,v,o,gate,up,down (Phi-3: qkv,o,gate_up,down; none: peft's default for the model, q,v)")
	fs.BoolVar(&cfg.QLoRA, "qlora", cfg.QLoRA, "llama: QLoRA: the base's linear layers in bitsandbytes NF4 with double quantization, computing in bf16 (needs --lora)")
	fs.Var(routingFlag{&cfg.Routing}, "routing", "mixture of experts: the experts each token goes to on the meta and cuda devices: uniform, skewed:ALPHA (Zipf: an expert's share falls as 1/rank^ALPHA) or file:PATH (a line of each expert's load per layer)")
	fs.Float32Var(&cfg.Family.RouterAuxLoss, "router-aux-loss", cfg.Family.RouterAuxLoss, "mixture of experts: output the router logits and add this times the load-balancing loss (router_aux_loss_coef; 0: off)")
	fs.Var(textFlag{&cfg.Task}, "task", "bert: mlm (BertForMaskedLM) or classify (BertForSequenceClassification)")
	fs.Var(textFlag{&cfg.AMP}, "amp", "mixed precision: off, fp16 (with loss scaling) or bf16")
	fs.Var(textFlag{&cfg.Checkpoint}, "checkpoint", "activation checkpointing: off, all, every:N or attn (gpt only)")
	fs.Var(textFlag{&cfg.Attention}, "attention", "attention: naive (scores materialised; llama: HF's eager) or flash (llama: sdpa)")
	fs.IntVar(&cfg.Accum, "accum", cfg.Accum, "micro-batches per optimizer step (gradient accumulation)")
	fs.Var(seqDistFlag{&cfg.SeqDist}, "seq-dist", "gpt and llama sample lengths: fixed (every sample --seq long), uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX, or file:PATH (one length per line, e.g. a dataset's token counts; longer ones cut to --seq)")
	fs.Var(textFlag{&cfg.Padding}, "padding", "gpt and llama batch padding: none (to the batch's longest sample), max (to --seq) or multiple:N (the longest rounded up to a multiple of N)")
	fs.BoolVar(&cfg.SortByLength, "sort-by-length", cfg.SortByLength, "gpt and llama: group samples of similar length into batches (megabatches of 50 batches sorted longest first, as Trainer's group_by_length)")
	fs.Var(textFlag{&cfg.EmptyCache}, "empty-cache", "call torch.cuda.empty_cache(): never, every step or every phase")
	fs.StringVar(&cfg.Logits, "logits", cfg.Logits, "what the loop does with the logits: keep them alive through backward until the next forward (nanoGPT's train.py; the gpt presets' default) or drop them before backward (HF Trainer's compute_loss; the mlp's default)")
	fs.IntVar(&cfg.Steps, "steps", cfg.Steps, "training steps")
	fs.IntVar(&cfg.EvalEvery, "eval-every", cfg.EvalEvery, "evaluate after every N-th step (0: never)")
	fs.Var(textFlag{&cfg.Device}, "device", "device: meta (no math, any size in milliseconds), cpu (real float32 math) or cuda")
	fs.Var(sizeFlag{&cfg.GPUMemory, maxSize}, "gpu-mem", "device memory, e.g. 24GiB or 80GB (binary units)")
	fs.Var(sizeFlag{&cfg.ContextReserve, maxSize}, "context-reserve", "memory the CUDA context takes before the allocator")
	fs.Var(textFlag{&cfg.AllocConf}, "alloc-conf", "caching allocator settings, as PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True)")
	fs.Var(textFlag{&cfg.Optimizer}, "optimizer", "optimizer: sgd, momentum, adam, adamw, or bitsandbytes' adamw8bit, paged-adamw or paged-adamw8bit")
	fs.Var(textFlag{&cfg.OptimizerImpl}, "optimizer-impl", "how torch.optim runs adam and adamw: foreach (the default), fused or for-loop")
	fs.Float32Var(&cfg.LR, "lr", cfg.LR, "learning rate")
	fs.Float32Var(&cfg.WeightDecay, "weight-decay", cfg.WeightDecay, "weight decay (adamw defaults to 0.01)")
	fs.Var(textFlag{&cfg.ZeroGrad}, "zero-grad", "zero_grad: none (set_to_none) or zero (in place)")
	fs.Uint64Var(&cfg.Seed, "seed", cfg.Seed, "random seed")
	fs.StringVar(&cfg.Bug, "bug", cfg.Bug, "a leak bug to plant: "+strings.Join(train.Bugs, ", "))
	addParallelFlags(fs, &cfg.Parallel)
}

// presetDefault says where a model dimension comes from when the flag defaults are the MLP's, which has none.
func presetDefault(cfg *train.Config) string {
	if cfg.Model == "gpt" || cfg.Model == "llama" {
		return ""
	}
	return " (default: the preset's; " + train.DefaultPreset + "'s with --model gpt, " + train.DefaultLlamaPreset + "'s with --model llama)"
}

// configFromFlags returns the run configuration the command line describes: the preset, the config.json
// of --hf-config or the model's default first, then every flag the user set, in the order given.
func configFromFlags(fs *pflag.FlagSet, preset string) (train.Config, error) {
	base := train.DefaultMLP()
	hf, _ := fs.GetString("hf-config")
	model, _ := fs.GetString("model")
	switch {
	case hf != "" && preset != "":
		return base, fmt.Errorf("--hf-config and --preset both name a model: give one")
	case hf != "":
		f, err := os.Open(hf)
		if err != nil {
			return base, err
		}
		m, err := hfconfig.Read(f)
		f.Close()
		if err != nil {
			return base, fmt.Errorf("%s: %w", hf, err)
		}
		base = train.FromHF(m)
	case preset == "" && model == "gpt":
		preset = train.DefaultPreset
	case preset == "" && model == "llama":
		preset = train.DefaultLlamaPreset
	case preset == "" && model == "bert":
		preset = train.DefaultBertPreset
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
		to := replay.Lookup(f.Name)
		if to == nil || err != nil {
			return
		}
		if sd, ok := f.Value.(seqDistFlag); ok { // read once, when the flag was set
			*to.Value.(seqDistFlag).v = *sd.v
			return
		}
		if rf, ok := f.Value.(routingFlag); ok {
			*to.Value.(routingFlag).v = *rf.v
			return
		}
		err = replay.Set(f.Name, f.Value.String())
	})
	if p := &base.Parallel; p.GPUs > 1 && p.Strategy == dist.Single {
		p.Strategy = dist.DDP // --gpus N alone is data parallel, as torchrun with DDP
	}
	return base, err
}

func newRunCmd() *cobra.Command {
	cfg := train.DefaultMLP()
	var out, preset, ranks string
	var force bool
	var mem memory
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Record a training workload headless into a snapshot file",
		Long: `Run a training workload and record every allocation, with its stack, phase, iteration, module and
category, into a snapshot file; then print the peak, the phases and the OOM, if any.

Every dimension of the model and every setting of the run is a flag, so any shape can be recorded
without writing code. Without --preset it runs the MLP whose defaults are shown below; --preset starts
from a built-in workload instead (--model gpt from ` + train.DefaultPreset + `), and the flags given change it. The
gpt loop is nanoGPT's train.py: it keeps the logits alive through backward until the next forward returns
(--logits drop frees them before backward, as HF Trainer does). An OOM stops the run like it stops a
PyTorch job, with a complete snapshot; so do Ctrl-C, SIGTERM and SIGHUP (the exit code is then 130, 143
or 129, as shells expect). The exit code is 1 when the run ran out of memory.

The recording is written as it happens, a chunk at every phase end and at least every 200 ms, so a
run killed any other way (kill -9, the OOM killer) leaves a snapshot that reads up to its last 200 ms,
and oomdbg view --follow can watch it grow. -o - writes the snapshot to standard output and the
summary to standard error. An existing regular file is replaced; a symbolic link or a read-only file
only with --force; a directory, a socket or a block device never. A FIFO or a character device
(/dev/null) is written into like a pipe.

On the cpu device the tensors live in host memory: the run first measures what the model needs on the
meta device and refuses to start when that is more than --max-memory.`,
		Example: `  oomdbg run --preset gpt2-medium -o medium.oomdbg          # OOMs on a 24 GiB card
  oomdbg run --preset gpt2-medium --amp bf16 --attention flash --checkpoint all
  oomdbg run --preset llama-3.1-8b --lora 16 --lora-targets q,k,v,o,gate,up,down --qlora --checkpoint all
  oomdbg run --hf-config config.json --batch 2 --seq 4096 --optimizer paged-adamw8bit
  oomdbg run --hidden 4096 --layers 8 --batch 4096 --gpu-mem 8GiB -o big.oomdbg
  oomdbg run --bug retain-graph --steps 20 -o leak.oomdbg
  oomdbg run --preset llama-3.1-8b --gpus 8 --dp zero3 --offload optimizer --checkpoint all --gpu-mem 80GiB
  oomdbg run --preset buildalong --gpus 4 --dp zero2 --ranks uneven -o job.oomdbg && oomdbg report job.rank*.oomdbg
  oomdbg run --preset tiny --steps 2000 -o - | oomdbg view -`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := configFromFlags(cmd.Flags(), preset)
			if err != nil {
				return err
			}
			if err := cfg.Validate(); err != nil {
				return flagError(err)
			}
			if ranks == "uneven" {
				return recordRanks(cmd, cfg, recordTarget{path: out, force: force, mem: &mem})
			} else if ranks != "" {
				return fmt.Errorf("--ranks %q: the only choice is uneven (--rank N records one rank)", ranks)
			}
			return runRecord(cmd.Context(), cfg, recordTarget{path: out, force: force, mem: &mem}, cmd.OutOrStdout(), cmd.ErrOrStderr())
		},
	}
	addConfigFlags(cmd.Flags(), &cfg)
	cmd.Flags().StringVar(&ranks, "ranks", "", "uneven: record rank 0 and every rank whose memory differs, each into -o's name with .rankN before its extension")
	addModelSourceFlags(cmd.Flags(), &preset)
	cmd.Flags().StringVarP(&out, "output", "o", "run.oomdbg", "snapshot file to write ('-' for standard output)")
	cmd.Flags().BoolVar(&force, "force", false, "write through a symbolic link, or replace a read-only file")
	addMemoryFlag(cmd.Flags(), &mem)
	return cmd
}

// addModelSourceFlags adds the flags that name a whole model: --preset and --hf-config.
func addModelSourceFlags(fs *pflag.FlagSet, preset *string) {
	fs.StringVar(preset, "preset", "", "start from a built-in workload: "+strings.Join(train.PresetNames(), ", "))
	fs.String("hf-config", "", "start from a Hugging Face config.json ("+strings.Join(hfconfig.Architectures, ", ")+")")
}

// flagError names the flag of a configuration field that holds an impossible number: "--hidden 4611686018427387904:
// ...". Other errors pass unchanged.
func flagError(err error) error {
	var fe *train.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	field, _ := strings.CutPrefix(fe.Field, "parallel.") // a data-parallel setting: its flag drops DeepSpeed's stage3_
	field = strings.TrimPrefix(field, "stage3_")
	name := strings.ReplaceAll(field, "_", "-")
	switch {
	case fe.Field == "gpu_memory":
		name = "gpu-mem"
	case fe.Field == "family.router_aux_loss":
		name = "router-aux-loss"
	case fe.Field == "norm_eps", fe.Field == "rope_theta", strings.HasPrefix(fe.Field, "family."): // no flag: --hf-config or a preset
		return fmt.Errorf("%s %v: %s", fe.Field, fe.Value, fe.Reason)
	}
	return fmt.Errorf("--%s %v: %s", name, fe.Value, fe.Reason)
}

// recordTarget is where runRecord writes, and what it may do there.
type recordTarget struct {
	path  string
	force bool    // --force: through links, over read-only files
	mem   *memory // --max-memory, for the cpu device's host memory
}

// runRecord records cfg into the target and prints the summary, on standard output unless the snapshot goes
// there. SIGINT, SIGTERM and SIGHUP stop the run at the next step with the snapshot complete, and the error
// then carries the shell's exit code for the signal.
func runRecord(ctx context.Context, cfg train.Config, to recordTarget, stdout, stderr io.Writer) error {
	if ctx == nil {
		ctx = context.Background()
	}
	o, err := checkOutput(to.path, to.force, true)
	if err != nil {
		return err
	}
	summary := stdout
	if o.kind == outputStdout {
		summary = stderr
	}
	if cfg.Device == device.CPU && to.mem != nil {
		if err := checkHostMemory(ctx, cfg, to.mem, stderr); err != nil {
			return err
		}
	}
	w, closeOut, err := o.openStream(stdout)
	if err != nil {
		return err
	}
	ctx, caught, stopSignals := stopOnSignals(ctx)
	defer stopSignals()
	// No buffer between the recorder and the file: each chunk reaches the file (or pipe) when it is cut, so
	// a process killed at any moment leaves what it recorded until the last chunk.
	cw := &countingWriter{w: w}
	res, err := train.Record(ctx, cfg, cw, train.RecordOptions{ToolVersion: toolVersion(), OnStart: nvmlSamples(ctx, cfg, stderr),
		FlushEvery: train.DefaultFlushEvery})
	if cerr := closeOut(); err == nil {
		err = cerr
	}
	name := to.path
	if o.kind == outputStdout {
		name = "standard output"
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return fmt.Errorf("cannot write %s: %w", name, pe.Err)
	}
	if err != nil {
		return err
	}
	printRunSummary(summary, cfg, res, name, cw.n)
	if (o.kind == outputNew || o.kind == outputRegular) && res.OOM == nil {
		printLeakVerdict(summary, to.path)
	}
	if sig := caught(); sig != nil {
		return &signalError{sig: sig, path: name}
	}
	if res.OOM != nil {
		return &problemError{msg: fmt.Sprintf("out of memory in iteration %d, %s (snapshot %s)", res.OOM.Iteration, res.OOM.Phase, name)}
	}
	return nil
}

// printLeakVerdict says, under a run's summary, when the snapshot just written fails check's leak verdict
// (a leak, or gradients never cleared), so that a leak is named where the run is, not only when asked for.
// The snapshot is read back as check streams it, in the memory of a few pages.
func printLeakVerdict(w io.Writer, path string) {
	r, _, _, _, err := findLeaks(path, &memory{}, []leaks.Option{leaks.Warmup(leaks.DefaultWarmup)})
	if err != nil || r == nil {
		return
	}
	if c := checkResult(path, r, checkLimits{}); !c.Pass {
		fmt.Fprintf(w, "\nleak       %s\n           oomdbg check %s names what holds it; oomdbg view %s shows it\n", c.Reason, path, path)
	}
}

// countingWriter passes writes through and counts the bytes.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// stopSignals are the signals that end a run with its snapshot complete: Ctrl-C, kill's default and a
// closed terminal.
var stopSignals = []os.Signal{os.Interrupt, syscall.SIGTERM, syscall.SIGHUP}

// stopOnSignals returns a context cancelled by the first of stopSignals, and a function that says which came
// (nil when none did). After the first, the signals take their default action again, so a second Ctrl-C
// ends the process at once; what was recorded is on disk by then.
func stopOnSignals(parent context.Context) (ctx context.Context, caught func() os.Signal, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, stopSignals...)
	var mu sync.Mutex
	var got os.Signal
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			signal.Stop(ch)
			mu.Lock()
			got = sig
			mu.Unlock()
			cancel()
		case <-done:
		}
	}()
	caught = func() os.Signal {
		mu.Lock()
		defer mu.Unlock()
		return got
	}
	var once sync.Once
	stop = func() {
		once.Do(func() {
			signal.Stop(ch)
			close(done)
			cancel()
		})
	}
	return ctx, caught, stop
}

// signalError ends a run stopped by a signal: exit 128 + the signal's number (130 for SIGINT, 143 for
// SIGTERM, 129 for SIGHUP), as shells report a process the signal killed.
type signalError struct {
	sig  os.Signal
	path string
}

func (e *signalError) Error() string {
	return fmt.Sprintf("stopped by %s; the snapshot %s is complete up to then", signalName(e.sig), e.path)
}

// ExitCode is the process's exit status.
func (e *signalError) ExitCode() int {
	if s, ok := e.sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return exitProblem
}

func signalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	case syscall.SIGHUP:
		return "SIGHUP"
	}
	return sig.String()
}

// nvmlSamples returns, for a run on the cuda device, a function that feeds the recorder NVML's reading of
// the GPU's used memory every 100 ms (as sample events), so the snapshot shows what the driver saw next to
// what the allocator held. Simulated devices have nothing to read; without a driver it says so once.
func nvmlSamples(ctx context.Context, cfg train.Config, stderr io.Writer) func(*tracer.Recorder) func() {
	if cfg.Device != device.CUDA {
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
	params := humanCount(res.Parameters)
	if res.Trainable != res.Parameters {
		params = fmt.Sprintf("%s (%s trainable, %.2f%%)", params, humanCount(res.Trainable), 100*float64(res.Trainable)/float64(max(res.Parameters, 1)))
	}
	fmt.Fprintf(w, "model      %s, %s parameters, batch %d, %s, device %s with %s (%s CUDA context)\n",
		modelName(cfg), params, cfg.Batch, cfg.Optimizer, cfg.Device,
		units.FormatSize(int64(cfg.GPUMemory)), units.FormatSize(int64(cfg.ContextReserve)))
	fmt.Fprintf(w, "steps      %d of %d", res.Steps, cfg.Steps)
	if n := len(res.Losses); n > 0 && cfg.Device == device.CPU {
		fmt.Fprintf(w, ", loss %.4f -> %.4f", res.Losses[0], res.Losses[n-1])
	}
	if res.Interrupted {
		fmt.Fprint(w, " (interrupted)")
	}
	fmt.Fprintln(w)
	fmt.Fprintf(w, "peak       %s allocated, %s reserved\n", units.FormatSize(res.PeakAllocated), units.FormatSize(res.PeakReserved))
	if res.Paged > 0 {
		fmt.Fprintf(w, "paged      %s of optimizer state in unified memory, outside the allocator; %s of it evicted to host over the run\n",
			units.FormatSize(int64(res.Paged)), units.FormatSize(int64(res.PagedEvicted)))
	}
	if l := res.ExpertLoad; l.Routed > 0 {
		fmt.Fprintf(w, "experts    routing %s: the busiest expert took %d of %d routed tokens (layer %d), %.2fx an even share of %d\n",
			cfg.Routing, l.Tokens, l.Routed, l.Layer, l.Share(), l.Routed/l.Experts)
	}
	if !cfg.SeqDist.Fixed() || cfg.EmptyCache != train.EmptyCacheNever {
		printSteps(w, cfg, res)
	}
	fmt.Fprintln(w)

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

// modelName says what model a configuration trains: its preset or Hugging Face architecture, else its kind.
func modelName(cfg train.Config) string {
	name := cfg.Model
	if cfg.Architecture != "" {
		name += " (" + cfg.Architecture + ")"
	}
	if cfg.Preset != "" {
		name = cfg.Preset
	}
	var parts []string
	if cfg.LoRA > 0 {
		kind := "LoRA"
		if cfg.QLoRA {
			kind = "QLoRA"
		}
		parts = append(parts, fmt.Sprintf("%s r=%d", kind, cfg.LoRA))
	}
	if cfg.Weights != train.WeightsF32 {
		parts = append(parts, cfg.Weights.String()+" weights")
	}
	if len(parts) > 0 {
		name += " [" + strings.Join(parts, ", ") + "]"
	}
	return name
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

// printSteps says what each step's batch was (variable lengths) and what each step asked of the device: the
// first steps' padded lengths and cudaMalloc calls, and the cost after the first step.
func printSteps(w io.Writer, cfg train.Config, res *train.Result) {
	const shown = 8
	var lens, mallocs []string
	var tokens, padded int64
	for i, st := range res.StepStats {
		tokens, padded = tokens+st.Tokens, padded+st.PaddedTokens
		if i < shown {
			for _, t := range st.SeqLens {
				lens = append(lens, fmt.Sprint(t))
			}
			mallocs = append(mallocs, fmt.Sprint(st.DeviceAllocs))
		}
	}
	more := ""
	if len(res.StepStats) > shown {
		more = ", …"
	}
	if !cfg.SeqDist.Fixed() && padded > 0 {
		fmt.Fprintf(w, "lengths    %s, padding %s: batches of %s%s tokens; %.0f%% of the tokens on the device are padding\n",
			cfg.SeqDist, cfg.Padding, strings.Join(lens, ", "), more, 100*float64(padded-tokens)/float64(padded))
	}
	fmt.Fprintf(w, "cudaMalloc %s%s per step", strings.Join(mallocs, ", "), more)
	if c := res.SteadyCost(); c.Steps > 0 {
		fmt.Fprintf(w, "; after the first, %s cudaMalloc and %s cudaFree calls per step", triage.PerStep(c.Mallocs), triage.PerStep(c.Frees))
		if cfg.EmptyCache != train.EmptyCacheNever {
			fmt.Fprintf(w, ", empty_cache returning %s", units.FormatSize(int64(c.EmptyCacheReleased)))
		}
	}
	fmt.Fprintln(w)
}

// recordRanks records rank 0 and every rank of the job whose memory differs (train.DistinctRanks), each into
// the output's name with .rankN before its extension. The exit code is that of the last rank to fail.
func recordRanks(cmd *cobra.Command, cfg train.Config, to recordTarget) error {
	if to.path == "-" || to.path == "/dev/stdout" {
		return fmt.Errorf("--ranks uneven writes one file per rank: give -o a file name")
	}
	ranks, err := train.DistinctRanks(cfg)
	if err != nil {
		return err
	}
	ext := filepath.Ext(to.path)
	var last error
	for _, r := range ranks {
		c := cfg
		c.Parallel.Rank = r
		t := to
		t.path = fmt.Sprintf("%s.rank%d%s", strings.TrimSuffix(to.path, ext), r, ext)
		if err := runRecord(cmd.Context(), c, t, cmd.OutOrStdout(), cmd.ErrOrStderr()); err != nil {
			var pe *problemError
			if !errors.As(err, &pe) {
				return err
			}
			last = err
		}
	}
	return last
}
