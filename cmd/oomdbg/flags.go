package main

import (
	"encoding"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/fit"
	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/train"
	"github.com/oomdbg/oomdbg/workloads/train/frameworks"
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

// parseLimit parses a size limit as sizeFlag does, as the int64 a limit is held in.
func parseLimit(s string) (int64, error) {
	var n uint64
	err := sizeFlag{&n}.Set(s)
	return int64(n), err
}

// addGPUMemFlag adds --gpu-mem to view and report: the GPU's memory, for a snapshot that does not record it.
func addGPUMemFlag(f *pflag.FlagSet, v *uint64) {
	f.Var(sizeFlag{v}, "gpu-mem", "the GPU's memory where the snapshot does not record it (PyTorch's), e.g. 24GiB (binary units) (default: the snapshot's own)")
	f.Lookup("gpu-mem").DefValue = "" // none: the snapshot's capacity, not "0B"
}

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

// optionalFlag is a flag for a choice that is asked for only when given: its value is parsed when the flag
// is set, into a T made then; *v stays nil otherwise. def is what help shows as the default.
type optionalFlag[T any] struct {
	v        **T
	parse    func(string) (T, error)
	typ, def string
}

func optional[T any](v **T, parse func(string) (T, error), typ, def string) optionalFlag[T] {
	return optionalFlag[T]{v: v, parse: parse, typ: typ, def: def}
}

func (f optionalFlag[T]) String() string {
	if f.v == nil || *f.v == nil {
		return f.def
	}
	if n, ok := any(**f.v).(int64); ok && f.typ == "size" {
		return units.FormatSizeExact(uint64(n))
	}
	return fmt.Sprint(**f.v)
}

func (f optionalFlag[T]) Set(s string) error {
	x, err := f.parse(s)
	if err != nil {
		return err
	}
	*f.v = &x
	return nil
}

func (f optionalFlag[T]) Type() string { return f.typ }

// offloadFlag is --offload: train.ParseOffload's list, which sets two fields of a Config (the data-parallel
// offload and the activations').
type offloadFlag struct{ c *train.Config }

func (f offloadFlag) String() string {
	if f.c == nil {
		return ""
	}
	return f.c.Offload().String()
}

func (f offloadFlag) Set(s string) error {
	o, err := train.ParseOffload(s)
	if err != nil {
		return err
	}
	f.c.SetOffload(o)
	return nil
}

func (offloadFlag) Type() string { return "string" }

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

// configFlags are the flags of a training run: --preset or --hf-config, which name a whole model, and a flag
// for every knob. Each knob's flag parses once, when it is set, into the field of given it is bound to
// (whose values are the defaults --help shows); config starts from the configuration the model's source
// names and copies onto it the typed value of every flag the user set.
type configFlags struct {
	fs               *pflag.FlagSet
	given            *train.Config
	copies           map[string]func(to *train.Config)        // by flag name: copies the flag's field from given
	differ           map[string]func(a, b *train.Config) bool // by flag name: whether a's field differs from b's
	preset, hfConfig string
	base             train.Config // what config started from: the model's source, before the flags
	// defaultPreset is the model without --preset, --model or --hf-config ("": the MLP); owned are the flags
	// whose default, given's, the command sets whatever the model (bugs' 8 steps).
	defaultPreset string
	owned         map[string]bool
	versionsFrom  *versions.Set // --versions-from's releases, when given
	// configFile is --config, a framework's configuration file; mapping is what config read of it.
	configFile string
	mapping    *frameworks.Mapping
}

// presetValue is --preset: it belongs to the configFlags it sets, which is how a test finds them.
type presetValue struct{ f *configFlags }

func (p presetValue) String() string {
	if p.f == nil {
		return ""
	}
	return p.f.preset
}
func (p presetValue) Set(s string) error { p.f.preset = s; return nil }
func (presetValue) Type() string         { return "string" }

// field binds the flag name to the field of a Config that at returns: a flag of T's kind, or of value's
// when given, parsing into given's field, and a copy of that field onto another Config.
func field[T any](f *configFlags, name string, at func(*train.Config) *T, usage string, value ...func(*T) pflag.Value) {
	p := at(f.given)
	if len(value) > 0 {
		f.fs.Var(value[0](p), name, usage)
	} else {
		switch v := any(p).(type) {
		case *string:
			f.fs.StringVar(v, name, *v, usage)
		case *int:
			f.fs.IntVar(v, name, *v, usage)
		case *uint64:
			f.fs.Uint64Var(v, name, *v, usage)
		case *float32:
			f.fs.Float32Var(v, name, *v, usage)
		case *float64:
			f.fs.Float64Var(v, name, *v, usage)
		case *bool:
			f.fs.BoolVar(v, name, *v, usage)
		default:
			f.fs.Var(textFlag{v.(textValue)}, name, usage)
		}
	}
	f.copies[name] = func(to *train.Config) { *at(to) = *at(f.given) }
	f.differ[name] = func(a, b *train.Config) bool { return !reflect.DeepEqual(*at(a), *at(b)) }
}

// sizeValue and elementsValue are field's value for sizes and element counts.
func sizeValue(p *uint64) pflag.Value    { return sizeFlag{p} }
func elementsValue(p *int64) pflag.Value { return elementsFlag{p} }

// addConfigFlags puts every knob of a training run on fs, with defaults' values as the defaults shown, and
// --preset.
func addConfigFlags(fs *pflag.FlagSet, defaults train.Config) *configFlags {
	f := &configFlags{fs: fs, given: &defaults, copies: map[string]func(*train.Config){},
		differ: map[string]func(a, b *train.Config) bool{}, owned: map[string]bool{}}
	type cfg = train.Config
	field(f, "model", func(c *cfg) *string { return &c.Model }, "model: mlp, gpt, llama (a Llama-family decoder: Llama, Mistral, Qwen2; Mixtral, Qwen-MoE, Gemma and Phi-3 from a preset or --hf-config) or bert")
	field(f, "batch", func(c *cfg) *int { return &c.Batch }, "batch size (per micro-batch with --accum)")
	field(f, "in-features", func(c *cfg) *int { return &c.InFeatures }, "mlp: input features")
	field(f, "hidden", func(c *cfg) *int { return &c.Hidden }, "mlp: hidden width")
	field(f, "layers", func(c *cfg) *int { return &c.Layers }, "hidden layers (mlp) or transformer blocks (gpt, llama)")
	field(f, "classes", func(c *cfg) *int { return &c.Classes }, "mlp: output classes")
	field(f, "seq", func(c *cfg) *int { return &c.Seq }, "gpt, llama: sequence length (gpt: the block size)")
	field(f, "d-model", func(c *cfg) *int { return &c.DModel }, "gpt, llama: embedding width (hidden_size)")
	field(f, "heads", func(c *cfg) *int { return &c.Heads }, "gpt, llama: attention heads")
	field(f, "vocab", func(c *cfg) *int { return &c.Vocab }, "gpt, llama: vocabulary size")
	field(f, "dropout", func(c *cfg) *float32 { return &c.Dropout }, "gpt: dropout probability; llama: attention dropout")
	field(f, "kv-heads", func(c *cfg) *int { return &c.KVHeads }, "llama: key-value heads (grouped-query attention; 0: as many as heads)")
	field(f, "ffn", func(c *cfg) *int { return &c.FFN }, "llama: MLP width (intermediate_size)")
	field(f, "head-dim", func(c *cfg) *int { return &c.HeadDim }, "llama: head size (0: d-model / heads)")
	field(f, "tied", func(c *cfg) *bool { return &c.Tied }, "llama: lm_head shares the embedding's weight")
	field(f, "qkv-bias", func(c *cfg) *bool { return &c.QKVBias }, "llama: biases on q, k and v (Qwen2)")
	field(f, "weights", func(c *cfg) *train.Weights { return &c.Weights }, "llama: the parameters' dtype (from_pretrained's torch_dtype): f32, bf16 or fp16")
	field(f, "lora", func(c *cfg) *int { return &c.LoRA }, "llama: LoRA adapters of rank R on --lora-targets, the base frozen (0: full fine-tune)")
	field(f, "lora-alpha", func(c *cfg) *float32 { return &c.LoRAAlpha }, "llama: LoRA alpha (scaling alpha/R; 0: peft's default 8)")
	field(f, "lora-dropout", func(c *cfg) *float32 { return &c.LoRADropout }, "llama: LoRA dropout")
	field(f, "lora-targets", func(c *cfg) *train.LoRATargets { return &c.LoRATargets }, "llama, bert: projections adapted, some of q,k,v,o,gate,up,down (Phi-3: qkv,o,gate_up,down; none: peft's default for the model, q,v)")
	field(f, "qlora", func(c *cfg) *bool { return &c.QLoRA }, "llama: QLoRA: the base's linear layers in bitsandbytes NF4 with double quantization, computing in bf16 (needs --lora)")
	field(f, "qlora-double-quant", func(c *cfg) *train.Toggle { return &c.QLoRADoubleQuant }, "llama: quantize QLoRA's absmax values again (bnb_4bit_use_double_quant; default true)")
	field(f, "qlora-storage", func(c *cfg) *train.QuantStorage { return &c.QLoRAStorage }, "llama: the dtype QLoRA's packed weights are stored in (bnb_4bit_quant_storage): uint8, bf16 or f32")
	field(f, "qlora-half", func(c *cfg) *train.Toggle { return &c.QLoRAHalf }, "llama: quantize a float16 copy of each weight, so that each dequantization is float16, copied to bf16 (default: true with bitsandbytes before 0.43.0; Lightning's BitsandbytesPrecision, LitGPT's --quantize, always does)")
	field(f, "qlora-head", func(c *cfg) *bool { return &c.QLoRAHead }, "llama: store lm_head in 4 bits too, as LitGPT's --quantize (Lightning's BitsandbytesPrecision) does; transformers leaves it in 16 bits")
	field(f, "kbit-prep", func(c *cfg) *train.Toggle { return &c.KbitPrep }, "llama: peft's prepare_model_for_kbit_training, which upcasts the 16-bit parameters that are not 4-bit (norms, embeddings, lm_head) to float32 (default: true with --qlora, but under FSDP and ZeRO, as TRL and DeepSpeed leave it)")
	field(f, "lora-dtype", func(c *cfg) *train.AdapterDType { return &c.LoRADType }, "llama: the LoRA weights' dtype: peft (float32 from peft 0.12, the base's dtype before), f32 or bf16 (torchtune's)")
	field(f, "loss", func(c *cfg) *train.LossSetting { return &c.Loss }, "llama: the loss: full (lm_head over every position, the causal-LM loss of --versions' transformers), chunked:T (torchtune's chunked output and cross-entropy, T tokens a chunk), linear-ce:N (torchtune's LinearCrossEntropyLoss, the sequence in N chunks: num_output_chunks), fused-linear-ce (Liger's, the logits never whole) or litgpt-chunked:T (LitGPT's loop under Fabric: T tokens a chunk, every chunk's logits converted to float32 and held until the next forward)")
	field(f, "load", func(c *cfg) *train.Load { return &c.Load }, "llama, bert: how the model reaches the device: none (made there in its final form) or hf (from_pretrained as its own phase: each weight in the checkpoint's dtype, 4-bit ones quantized on the device)")
	field(f, "versions", func(c *cfg) *versions.Set { return &c.Versions }, "the library releases the run assumes, any of torch, transformers, bitsandbytes, peft, accelerate: e.g. torch=2.3.1,bitsandbytes=0.42.0 (docs/versions.md; default: "+versions.Set{}.Describe()+")")
	for _, name := range []string{"qlora-double-quant", "qlora-half", "kbit-prep"} {
		fs.Lookup(name).NoOptDefVal = "true"
	}
	fs.Var(requirementsFlag{&f.versionsFrom}, "versions-from", "read the library releases from a pip freeze (name==version lines); --versions overrides them")
	field(f, "routing", func(c *cfg) *train.Routing { return &c.Routing }, "mixture of experts: the experts each token goes to on the meta and cuda devices: uniform, skewed:ALPHA (Zipf: an expert's share falls as 1/rank^ALPHA) or file:PATH (a line of each expert's load per layer)")
	field(f, "router-aux-loss", func(c *cfg) *float32 { return &c.Family.RouterAuxLoss }, "mixture of experts: output the router logits and add this times the load-balancing loss (router_aux_loss_coef; 0: off)")
	field(f, "task", func(c *cfg) *train.Task { return &c.Task }, "bert: mlm (BertForMaskedLM) or classify (BertForSequenceClassification)")
	field(f, "amp", func(c *cfg) *knob.AMP { return &c.AMP }, "mixed precision: off, fp16 (with loss scaling) or bf16")
	field(f, "checkpoint", func(c *cfg) *knob.Checkpoint { return &c.Checkpoint }, "activation checkpointing: off, all, every:N, attn (gpt only) or selective:ops (every block, keeping the outputs of its matrix products and attention kernels and recomputing the rest, as torch's selective activation checkpointing)")
	field(f, "attention", func(c *cfg) *knob.Attention { return &c.Attention }, "attention: naive (scores materialised; llama: HF's eager) or flash (llama: sdpa)")
	field(f, "accum", func(c *cfg) *int { return &c.Accum }, "micro-batches per optimizer step (gradient accumulation)")
	field(f, "seq-dist", func(c *cfg) *train.SeqDist { return &c.SeqDist }, "gpt and llama sample lengths: fixed (every sample --seq long), uniform:MIN:MAX, lognormal:MEDIAN:SIGMA:MAX, or file:PATH (one length per line, e.g. a dataset's token counts; longer ones cut to --seq)")
	field(f, "padding", func(c *cfg) *train.Padding { return &c.Padding }, "gpt and llama batch padding: none (to the batch's longest sample), max (to --seq) or multiple:N (the longest rounded up to a multiple of N)")
	field(f, "sort-by-length", func(c *cfg) *bool { return &c.SortByLength }, "gpt and llama: group samples of similar length into batches (megabatches of 50 batches sorted longest first, as Trainer's group_by_length)")
	field(f, "empty-cache", func(c *cfg) *train.EmptyCache { return &c.EmptyCache }, "call torch.cuda.empty_cache(): never, every step or every phase")
	field(f, "logits", func(c *cfg) *string { return &c.Logits }, "what the loop does with the logits: keep them alive through backward until the next forward (nanoGPT's train.py; the gpt presets' default) or drop them before backward (HF Trainer's compute_loss; the mlp's default)")
	field(f, "steps", func(c *cfg) *int { return &c.Steps }, "training steps")
	field(f, "eval-every", func(c *cfg) *int { return &c.EvalEvery }, "evaluate after every N-th step (0: never)")
	field(f, "device", func(c *cfg) *device.Kind { return &c.Device }, "device: meta (no math, any size in milliseconds), cpu (real float32 math) or cuda")
	field(f, "gpu-mem", func(c *cfg) *uint64 { return &c.GPUMemory }, "device memory, e.g. 24GiB or 80GB (binary units)", sizeValue)
	field(f, "context-reserve", func(c *cfg) *uint64 { return &c.ContextReserve }, "memory the CUDA context takes before the allocator", sizeValue)
	field(f, "alloc-conf", func(c *cfg) *train.AllocConf { return &c.AllocConf }, "caching allocator settings, as PYTORCH_CUDA_ALLOC_CONF (e.g. expandable_segments:True)")
	field(f, "optimizer", func(c *cfg) *knob.Optimizer { return &c.Optimizer }, "optimizer: sgd, momentum, adam, adamw, or bitsandbytes' adamw8bit, paged-adamw or paged-adamw8bit")
	field(f, "optimizer-impl", func(c *cfg) *knob.OptimizerImpl { return &c.OptimizerImpl }, "how torch.optim runs adam and adamw: foreach (the default), fused or for-loop")
	field(f, "compile", func(c *cfg) *bool { return &c.Compile }, "torch.compile the model: refused, with the reason (what its partitioner saves is not modelled)")
	field(f, "optimizer-in-backward", func(c *cfg) *bool { return &c.OptimizerInBackward }, "step each parameter in backward as soon as its gradient is accumulated and free the gradient right after (torchtune's optimizer_in_bwd: an optimizer per parameter, stepped by its post-accumulate-grad hook; no --accum, no fp16)")
	field(f, "lr", func(c *cfg) *float32 { return &c.LR }, "learning rate")
	field(f, "weight-decay", func(c *cfg) *float32 { return &c.WeightDecay }, "weight decay (adamw defaults to 0.01)")
	field(f, "zero-grad", func(c *cfg) *knob.ZeroGrad { return &c.ZeroGrad }, "zero_grad: none (set_to_none) or zero (in place)")
	field(f, "seed", func(c *cfg) *uint64 { return &c.Seed }, "random seed")
	field(f, "bug", func(c *cfg) *string { return &c.Bug }, "a leak bug to plant: "+strings.Join(train.Bugs, ", "))
	addParallelFlags(f)
	fs.Var(presetValue{f}, "preset", "start from a built-in workload: "+strings.Join(train.PresetNames(), ", "))
	return f
}

// showDefaults makes --help show each workload flag's default as it is, once the command has set its
// flags' usage: a default every model shares as pflag shows it; one that depends on the model (a preset's,
// config.json's, the MLP's) with the model it is for; none for a flag the model decides alone. A flag the
// command owns shows its own default.
func (f *configFlags) showDefaults() {
	models := []train.Config{train.DefaultMLP()}
	for _, p := range train.Presets {
		models = append(models, p.Config)
	}
	source := "the mlp"
	if f.defaultPreset != "" {
		source = f.defaultPreset
	}
	f.fs.VisitAll(func(fl *pflag.Flag) {
		differs := f.differ[fl.Name]
		if differs == nil || fl.Hidden || f.owned[fl.Name] {
			return
		}
		if !slices.ContainsFunc(models, func(m train.Config) bool { return differs(&m, f.given) }) {
			return
		}
		shown := fl.DefValue
		if fl.Value.Type() == "string" {
			shown = strconv.Quote(shown)
		}
		switch {
		case fl.Name == "model":
			fl.Usage += fmt.Sprintf(" (default %s; with --preset or --hf-config, theirs)", shown)
		case isZeroDefault(fl.DefValue):
			fl.Usage += " (default: the model's, from --preset, --model or --hf-config)"
		default:
			fl.Usage += fmt.Sprintf(" (default %s for %s; the model's with --preset, --model or --hf-config)", shown, source)
		}
		// A zero default, which pflag does not show: the usage says it.
		switch fl.Value.Type() {
		case "string":
			fl.DefValue = ""
		case "bool":
			fl.DefValue = "false"
		default:
			fl.DefValue = "0"
		}
	})
}

// isZeroDefault reports whether a flag's default is its type's zero value, which pflag does not show.
func isZeroDefault(v string) bool {
	switch v {
	case "", "0", "false", "0B", "0s", "[]", "<nil>":
		return true
	}
	return false
}

// own makes the flags named the command's: their default is given's whatever the model.
func (f *configFlags) own(names ...string) {
	for _, n := range names {
		f.owned[n] = true
	}
}

// addHFConfig adds --hf-config, the other flag that names a whole model, and --config, a trainer's
// configuration file.
func (f *configFlags) addHFConfig() *configFlags {
	f.fs.StringVar(&f.hfConfig, "hf-config", "", "start from a Hugging Face config.json ("+strings.Join(hfconfig.Architectures, ", ")+")")
	f.fs.StringVar(&f.configFile, "config", "", "start from a trainer's configuration file: a torchtune recipe, a LitGPT finetune YAML, an axolotl YAML, "+
		"or Hugging Face TrainingArguments JSON beside the model's config.json (and a peft adapter_config.json); the flags it comes to and "+
		"the fields it ignores are printed on standard error, and flags given with it change it (--hf-config replaces its model)")
	return f
}

// writeSource says on w what --config read: the equivalent flags and the fields ignored.
func (f *configFlags) writeSource(w io.Writer) {
	if f.mapping != nil {
		f.mapping.Write(w, fit.JoinFlags)
	}
}

// addParallelFlags puts the data-parallel settings on flags.
func addParallelFlags(f *configFlags) {
	p := func(c *train.Config) *dist.Settings { return &c.Parallel }
	field(f, "gpus", func(c *train.Config) *int { return &p(c).GPUs }, "GPUs in the job, every node's together (the world size; more than 1 without --dp is ddp)")
	field(f, "nodes", func(c *train.Config) *int { return &p(c).Nodes }, "nodes the GPUs are on (hsdp shards within a node, replicates across)")
	field(f, "dp", func(c *train.Config) *dist.Strategy { return &p(c).Strategy }, "data-parallel strategy: none, ddp, zero1, zero2, zero3 (DeepSpeed), fsdp-full, fsdp-grad-op, hsdp (FSDP) or fsdp2 (fully_shard)")
	field(f, "rank", func(c *train.Config) *int { return &p(c).Rank }, "the rank simulated (zero1 and zero2 ranks differ where their partitions cut parameters)")
	f.fs.Var(offloadFlag{f.given}, "offload", "what goes to host memory, joined by +: optimizer (zero1-3) or optimizer+params (zero3, fsdp), "+
		"and activations (gpt, llama: what the model's forward saves for backward, to pinned host memory through saved_tensors_hooks as torchtune's "+
		"OffloadActivations does, with a copy stream; activations:sync without one); none")
	f.copies["offload"] = func(to *train.Config) { to.SetOffload(f.given.Offload()) }
	field(f, "offload-pageable", func(c *train.Config) *bool { return &p(c).OffloadPageable }, "deepspeed: keep offloaded buffers in pageable memory (pin_memory false; pinned by default)")
	field(f, "bucket-cap-mb", func(c *train.Config) *float64 { return &p(c).BucketCapMB }, "ddp: gradient bucket size in MiB (0: 25, with a first bucket of 1 MiB)")
	field(f, "gradient-as-bucket-view", func(c *train.Config) *bool { return &p(c).GradientAsBucketView }, "ddp: gradients are views of their buckets, not copies")
	for _, e := range []struct {
		name string
		at   func(*train.Config) *int64
		def  int64
		doc  string
	}{
		{"reduce-bucket-size", func(c *train.Config) *int64 { return &p(c).ReduceBucketSize }, dist.DefaultReduceBucketSize, "deepspeed: elements reduced at a time (reduce_bucket_size)"},
		{"allgather-bucket-size", func(c *train.Config) *int64 { return &p(c).AllgatherBucketSize }, dist.DefaultAllgatherBucketSize, "deepspeed: elements all-gathered at a time (allgather_bucket_size)"},
		{"prefetch-bucket-size", func(c *train.Config) *int64 { return &p(c).PrefetchBucketSize }, dist.DefaultPrefetchBucketSize, "zero3: parameter elements fetched ahead of use (stage3_prefetch_bucket_size)"},
		{"max-live-parameters", func(c *train.Config) *int64 { return &p(c).MaxLiveParameters }, dist.DefaultMaxLiveParameters, "zero3: most parameter elements gathered at once (stage3_max_live_parameters)"},
		{"max-reuse-distance", func(c *train.Config) *int64 { return &p(c).MaxReuseDistance }, dist.DefaultMaxReuseDistance, "zero3: keep a parameter used again within this many elements (stage3_max_reuse_distance)"},
		{"param-persistence-threshold", func(c *train.Config) *int64 { return &p(c).ParamPersistenceThreshold }, dist.DefaultParamPersistenceThreshold, "zero3: parameters this small stay gathered (stage3_param_persistence_threshold)"},
	} {
		field(f, e.name, e.at, e.doc+" (0: "+strconv.FormatInt(e.def, 10)+")", elementsValue)
	}
	field(f, "fsdp-wrap", func(c *train.Config) *dist.Wrap { return &p(c).Wrap }, "fsdp: units: block (each transformer block, decoder layer or linear layer; the rest is the root) or model (one unit)")
	field(f, "reshard-after-forward", func(c *train.Config) *dist.Reshard { return &p(c).ReshardAfterForward }, "fsdp2: free each module's gathered parameters after its forward (true) or keep them to its backward (false); the root module's are kept")
	sp := func(c *train.Config) *train.Split { return &c.Split }
	field(f, "tp", func(c *train.Config) *int { return &sp(c).TP }, "tensor-parallel ranks (Megatron's column- and row-parallel linears; a llama model): heads, FFN and vocabulary split over them")
	field(f, "sp", func(c *train.Config) *bool { return &sp(c).SP }, "sequence parallelism over the tensor-parallel ranks: norms and residuals hold 1/TP of the tokens")
	field(f, "pp", func(c *train.Config) *int { return &sp(c).PP }, "pipeline stages; --accum is the micro-batches per step, and --rank picks the stage simulated (ranks: TP innermost, then CP, DP, PP)")
	field(f, "pp-schedule", func(c *train.Config) *layout.Schedule { return &sp(c).Schedule }, "pipeline schedule: 1f1b (default), gpipe or interleaved:V (V model chunks per stage)")
	field(f, "cp", func(c *train.Config) *int { return &sp(c).CP }, "context-parallel ranks, each holding 1/CP of every sequence (ring attention; flash attention)")
	field(f, "one-stream", func(c *train.Config) *bool { return &p(c).OneStream }, "communicate on the default stream, as the model did before streams (to compare; by default each implementation's collectives run on its own streams)")
}

// config returns the run configuration the command line describes: the configuration of the model's source
// (app.BaseConfig), with every flag the user set. It is validated where it runs, once.
func (f *configFlags) config() (train.Config, error) {
	if f.preset == "" && f.hfConfig == "" && f.configFile == "" && !f.fs.Changed("model") {
		f.preset = f.defaultPreset
	}
	cfg, err := f.baseConfig()
	if err != nil {
		return cfg, err
	}
	f.base = cfg
	for name := range f.owned {
		f.copies[name](&cfg)
	}
	f.fs.Visit(func(fl *pflag.Flag) {
		if copyField, ok := f.copies[fl.Name]; ok {
			copyField(&cfg)
		}
	})
	if from := f.versionsFrom; from != nil { // --versions overrides what the file says
		for _, l := range versions.Libraries {
			if from.Given(l) && !cfg.Versions.Given(l) {
				cfg.Versions = cfg.Versions.With(l, from.Of(l))
			}
		}
	}
	if p := &cfg.Parallel; p.GPUs > 1 && p.Strategy == dist.Single {
		p.Strategy = dist.DDP // --gpus N alone is data parallel, as torchrun with DDP
	}
	return cfg, nil
}

// baseConfig is the configuration the flags start from: a preset's, a config.json's, or what --config's file
// maps to (on --hf-config's model, when both are given).
func (f *configFlags) baseConfig() (train.Config, error) {
	if f.configFile == "" {
		return app.BaseConfig(f.preset, f.hfConfig, f.given.Model)
	}
	if f.preset != "" {
		return train.Config{}, fmt.Errorf("--config and --preset both name a model: give one (--hf-config replaces the file's model)")
	}
	var model *train.Config
	if f.hfConfig != "" {
		m, err := app.BaseConfig("", f.hfConfig, "")
		if err != nil {
			return m, err
		}
		model = &m
	}
	m, err := frameworks.ReadFile(f.configFile, model)
	if err != nil {
		return train.Config{}, err
	}
	f.mapping = m
	return m.Config, nil
}

// explain names what the user gave for a configuration field that holds an impossible number (a
// *train.FieldError): the flag, "--hidden 4611686018427387904: ...", when the user set it; the config.json
// field when --hf-config gave it, "llama.json: vocab_size 4194304: ..."; else where it came from, and the
// flag that sets it. Other errors pass unchanged.
func (f *configFlags) explain(err error) error {
	var fe *train.FieldError
	if !errors.As(err, &fe) {
		return err
	}
	field, _ := strings.CutPrefix(fe.Field, "parallel.") // a data-parallel setting: its flag drops DeepSpeed's stage3_
	field = strings.TrimPrefix(field, "stage3_")
	name := strings.ReplaceAll(field, "_", "-")
	value := fmt.Sprint(fe.Value)
	switch fe.Field {
	case "gpu_memory", "context_reserve":
		if fe.Field == "gpu_memory" {
			name = "gpu-mem"
		}
		if n, ok := fe.Value.(uint64); ok {
			value = units.FormatSizeExact(n)
		}
	case "family.router_aux_loss":
		name = "router-aux-loss"
	}
	given := func(flag string) bool { fl := f.fs.Lookup(flag); return fl != nil && fl.Changed }
	switch {
	case given(name):
		return fmt.Errorf("--%s %s: %s", name, value, fe.Reason)
	case fe.Field == "context_reserve" && given("gpu-mem"):
		return fmt.Errorf("--gpu-mem %s: leaves nothing to the allocator after the %s the CUDA context takes (--context-reserve)",
			units.FormatSizeExact(f.given.GPUMemory), value)
	case f.hfConfig != "" && f.base.Model == modelOf(f) && train.HFKey(f.base.Architecture, fe.Field) != "":
		return fmt.Errorf("%s: %s %s: %s", f.hfConfig, train.HFKey(f.base.Architecture, fe.Field), value, fe.Reason)
	case f.hfConfig != "" && f.base.Model != modelOf(f):
		return fmt.Errorf("%s %s: %s; %s describes a %s, and --model %s needs --%s", fe.Field, value, fe.Reason, f.hfConfig,
			f.base.Architecture, modelOf(f), name)
	case f.fs.Lookup(name) == nil:
		return fmt.Errorf("%s %s: %s", fe.Field, value, fe.Reason) // no flag sets it: it came from the preset or config.json
	case f.preset != "":
		return fmt.Errorf("%s %s (the preset %s's; --%s sets it): %s", fe.Field, value, f.preset, name, fe.Reason)
	}
	return fmt.Errorf("%s %s (the default; --%s sets it): %s", fe.Field, value, name, fe.Reason)
}

// modelOf is the model the flags ask for: --model's when given, else the source's.
func modelOf(f *configFlags) string {
	if fl := f.fs.Lookup("model"); fl != nil && fl.Changed {
		return f.given.Model
	}
	return f.base.Model
}

// requirementsFlag is --versions-from: a pip freeze, read once when the flag is set (so a FIFO or
// /dev/stdin works), at most versions.MaxRequirements bytes.
type requirementsFlag struct{ v **versions.Set }

func (f requirementsFlag) String() string { return "" }

func (f requirementsFlag) Set(path string) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	s, err := versions.ParseRequirements(file)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	*f.v = &s
	return nil
}

func (requirementsFlag) Type() string { return "file" }
