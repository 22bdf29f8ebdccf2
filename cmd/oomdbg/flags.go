package main

import (
	"encoding"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// maxSize bounds the sizes flags take: 1 PiB of device memory is the most a run simulates, and more than any
// machine has of anything else.
const maxSize = train.MaxGPUMemory

// sizeFlag is a pflag.Value for sizes in binary units ("24GiB", "24GB"), up to maxSize bytes.
type sizeFlag struct{ v *uint64 }

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
	if n > maxSize {
		return fmt.Errorf("%s is more than %s", s, units.FormatSizeExact(maxSize))
	}
	*f.v = n
	return nil
}

func (sizeFlag) Type() string { return "size" }

// textFlag is a pflag.Value for the settings a Config parses from words (knob.AMP, knob.Checkpoint,
// device.Kind, train.SeqDist, ...): a value is parsed once, when the flag is set, and a bad one is refused
// there (--seq-dist file:PATH reads the file then, once, so that a FIFO or /dev/stdin works).
type textFlag struct{ v textValue }

// textValue is what a Config's word settings are: text in, text out.
type textValue interface {
	encoding.TextMarshaler
	encoding.TextUnmarshaler
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

// elementsFlag is an element count, as DeepSpeed's config writes them (5e8 or 500000000).
type elementsFlag struct{ v *int64 }

func (f elementsFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatInt(*f.v, 10)
}

func (f elementsFlag) Set(s string) error {
	n, err := dist.ParseElements(s)
	if err != nil {
		return err
	}
	*f.v = n
	return nil
}

func (elementsFlag) Type() string { return "elements" }

// memory is --max-memory (hostmem.Limit, which parses it).
type memory struct{ hostmem.Limit }

// addMemoryFlag puts --max-memory on fs.
func addMemoryFlag(fs *pflag.FlagSet, m *memory) {
	fs.Var(m, "max-memory", "memory a command may use; a snapshot that needs more is refused (exit 2) "+
		"before it is analysed (default: half the physical memory, or what is available when that is less)")
}

// resolve and costReplay are what oomReplayer (report_replay.go) reads of the limit.
func (m *memory) resolve() uint64 { return m.Resolve() }

const costReplay = load.CostReplay

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

// addConfigFlags puts every knob of a training run on flags, with cfg's values as defaults.
func addConfigFlags(fs *pflag.FlagSet, cfg *train.Config) {
	fs.StringVar(&cfg.Model, "model", cfg.Model, "model: mlp, gpt or llama (a Llama-family decoder: Llama, Mistral, Qwen2)")
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
	fs.Var(textFlag{&cfg.LoRATargets}, "lora-targets", "llama: projections adapted, some of q,k,v,o,gate,up,down (none: peft's default q,v)")
	fs.BoolVar(&cfg.QLoRA, "qlora", cfg.QLoRA, "llama: QLoRA: the base's linear layers in bitsandbytes NF4 with double quantization, computing in bf16 (needs --lora)")
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
	fs.Var(sizeFlag{&cfg.GPUMemory}, "gpu-mem", "device memory, e.g. 24GiB or 80GB (binary units)")
	fs.Var(sizeFlag{&cfg.ContextReserve}, "context-reserve", "memory the CUDA context takes before the allocator")
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

// addParallelFlags puts the data-parallel settings on flags, with s's values as defaults.
func addParallelFlags(fs *pflag.FlagSet, s *dist.Settings) {
	fs.IntVar(&s.GPUs, "gpus", s.GPUs, "GPUs in the job, every node's together (the world size; more than 1 without --dp is ddp)")
	fs.IntVar(&s.Nodes, "nodes", s.Nodes, "nodes the GPUs are on (hsdp shards within a node, replicates across)")
	fs.Var(textFlag{&s.Strategy}, "dp", "data-parallel strategy: none, ddp, zero1, zero2, zero3 (DeepSpeed), fsdp-full, fsdp-grad-op or hsdp (FSDP)")
	fs.IntVar(&s.Rank, "rank", s.Rank, "the rank simulated (zero1 and zero2 ranks differ where their partitions cut parameters)")
	fs.Var(textFlag{&s.Offload}, "offload", "what goes to host memory: none, optimizer (zero1-3) or optimizer+params (zero3, fsdp)")
	fs.BoolVar(&s.OffloadPageable, "offload-pageable", s.OffloadPageable, "deepspeed: keep offloaded buffers in pageable memory (pin_memory false; pinned by default)")
	fs.Float64Var(&s.BucketCapMB, "bucket-cap-mb", s.BucketCapMB, "ddp: gradient bucket size in MiB (0: 25, with a first bucket of 1 MiB)")
	fs.BoolVar(&s.GradientAsBucketView, "gradient-as-bucket-view", s.GradientAsBucketView, "ddp: gradients are views of their buckets, not copies")
	for _, e := range []struct {
		name string
		v    *int64
		def  int64
		doc  string
	}{
		{"reduce-bucket-size", &s.ReduceBucketSize, dist.DefaultReduceBucketSize, "deepspeed: elements reduced at a time (reduce_bucket_size)"},
		{"allgather-bucket-size", &s.AllgatherBucketSize, dist.DefaultAllgatherBucketSize, "deepspeed: elements all-gathered at a time (allgather_bucket_size)"},
		{"prefetch-bucket-size", &s.PrefetchBucketSize, dist.DefaultPrefetchBucketSize, "zero3: parameter elements fetched ahead of use (stage3_prefetch_bucket_size)"},
		{"max-live-parameters", &s.MaxLiveParameters, dist.DefaultMaxLiveParameters, "zero3: most parameter elements gathered at once (stage3_max_live_parameters)"},
		{"max-reuse-distance", &s.MaxReuseDistance, dist.DefaultMaxReuseDistance, "zero3: keep a parameter used again within this many elements (stage3_max_reuse_distance)"},
		{"param-persistence-threshold", &s.ParamPersistenceThreshold, dist.DefaultParamPersistenceThreshold, "zero3: parameters this small stay gathered (stage3_param_persistence_threshold)"},
	} {
		fs.Var(elementsFlag{e.v}, e.name, e.doc+" (0: "+strconv.FormatInt(e.def, 10)+")")
	}
	fs.Var(textFlag{&s.Wrap}, "fsdp-wrap", "fsdp: units: block (each transformer block, decoder layer or linear layer; the rest is the root) or model (one unit)")
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
		err = replay.Set(f.Name, f.Value.String())
	})
	if p := &base.Parallel; p.GPUs > 1 && p.Strategy == dist.Single {
		p.Strategy = dist.DDP // --gpus N alone is data parallel, as torchrun with DDP
	}
	return base, err
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
	switch fe.Field {
	case "gpu_memory":
		name = "gpu-mem"
	case "norm_eps", "rope_theta": // no flag: they come from --hf-config or a preset
		return fmt.Errorf("%s %v: %s", fe.Field, fe.Value, fe.Reason)
	}
	return fmt.Errorf("--%s %v: %s", name, fe.Value, fe.Reason)
}
