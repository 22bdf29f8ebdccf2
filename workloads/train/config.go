// Package train is oomdbg's traced training workload: a Config that describes a model, its data, the device
// and the fixes and bugs to apply, and Run, the training loop that records everything through a
// tracer.Recorder.
//
// The loop is what a PyTorch user writes: load a batch, forward and loss, backward, optimizer step,
// zero_grad, an occasional evaluation. Each phase is announced to the recorder, a heap dump of who retains
// each live tensor is taken at every iteration end and at an OOM, and the leak bugs are the real mistakes
// people make, each next to its fixed code path.
package train

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Config describes one training run. Its JSON form is stored in every snapshot the run records, so a
// snapshot says exactly how to reproduce it.
type Config struct {
	Model  string `json:"model"`            // "mlp", "gpt", "llama" (the decoders of Llama's lineage) or "bert"
	Preset string `json:"preset,omitempty"` // the preset the configuration started from, if any

	// MLP shape (and Layers for the GPT).
	InFeatures int `json:"in_features,omitempty"`
	Hidden     int `json:"hidden,omitempty"`
	Layers     int `json:"layers,omitempty"`
	Classes    int `json:"classes,omitempty"`

	// GPT shape (and the Llama's, with the section below).
	Seq     int     `json:"seq,omitempty"`
	DModel  int     `json:"d_model,omitempty"`
	Heads   int     `json:"heads,omitempty"`
	Vocab   int     `json:"vocab,omitempty"`
	Dropout float32 `json:"dropout,omitempty"`
	Bias    bool    `json:"bias,omitempty"`

	// Llama-family shape (model llama: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM).
	KVHeads   int     `json:"kv_heads,omitempty"` // key-value heads (0: as many as heads)
	HeadDim   int     `json:"head_dim,omitempty"` // 0: d_model / heads
	FFN       int     `json:"ffn,omitempty"`      // intermediate_size
	Tied      bool    `json:"tied,omitempty"`     // lm_head shares the embedding's weight
	QKVBias   bool    `json:"qkv_bias,omitempty"` // biases on q, k and v (Qwen2)
	NormEps   float32 `json:"norm_eps,omitempty"`
	RopeTheta float64 `json:"rope_theta,omitempty"`
	// Architecture is the Hugging Face architecture the shape came from (a preset's or --hf-config's); for
	// model llama it picks the family: Llama, Mistral, Qwen2, or Mixtral, Qwen2-MoE, Qwen3-MoE, Gemma 2, Gemma
	// 3 and Phi-3, whose shape beyond Llama's is Family's (families.go).
	Architecture string      `json:"architecture,omitempty"`
	Family       FamilyShape `json:"family,omitzero"`
	// Routing is how a mixture of experts routes its tokens where the device computes no router scores.
	Routing Routing `json:"routing,omitzero"`
	// Task is what a BERT trains for: mlm or classify.
	Task Task `json:"task,omitzero"`
	// Weights is the parameters' dtype, from_pretrained's torch_dtype: f32 (the zero value), bf16 or fp16
	// (llama).
	Weights Weights `json:"weights,omitzero"`

	// Adapters (llama): LoRA of rank LoRA on LoRATargets (some of q,k,v,o,gate,up,down; none: peft's default
	// q,v), and QLoRA's 4-bit base.
	LoRA        int         `json:"lora,omitempty"`
	LoRAAlpha   float32     `json:"lora_alpha,omitempty"`
	LoRADropout float32     `json:"lora_dropout,omitempty"`
	LoRATargets LoRATargets `json:"lora_targets,omitzero"`
	QLoRA       bool        `json:"qlora,omitempty"`
	// QLoRA's BitsAndBytesConfig: double quantization (bnb_4bit_use_double_quant; on unless turned off) and
	// the packed weights' dtype (bnb_4bit_quant_storage).
	QLoRADoubleQuant Toggle       `json:"qlora_double_quant,omitzero"`
	QLoRAStorage     QuantStorage `json:"qlora_storage,omitzero"`
	// QLoRAHalf quantizes a float16 copy of each weight, so that every dequantization is float16 and copied
	// to the compute dtype (on by default with bitsandbytes before 0.43.0, versions.QuantizesInOwnDType;
	// Lightning's BitsandbytesPrecision always does it). QLoRAHead stores lm_head in 4 bits too, as
	// Lightning's plugin, which replaces every nn.Linear, does (llama).
	QLoRAHalf Toggle `json:"qlora_half,omitzero"`
	QLoRAHead bool   `json:"qlora_head,omitempty"`
	// KbitPrep is peft's prepare_model_for_kbit_training: the 16-bit parameters that are not 4-bit upcast to
	// float32 (on by default with QLoRA, as peft's and TRL's QLoRA recipes call it).
	KbitPrep Toggle `json:"kbit_prep,omitzero"`
	// LoRADType is the adapters' dtype: peft's (by its version), f32 or bf16.
	LoRADType AdapterDType `json:"lora_dtype,omitzero"`
	// Loss is how a causal LM's loss is computed: full, chunked:T, linear-ce:N or fused-linear-ce.
	Loss LossSetting `json:"loss,omitzero"`
	// Load is how the model reaches the device: none, or hf (from_pretrained, as a phase of its own).
	Load Load `json:"load,omitzero"`
	// Versions are the library releases the run assumes (versions.Default where not given).
	Versions versions.Set `json:"versions,omitzero"`

	// Sequence lengths (sequence models): each sample's length and how a batch is padded; Seq is the
	// context, the longest a sample may be (lengths.go).
	SeqDist      SeqDist `json:"seq_dist,omitzero"`
	Padding      Padding `json:"padding,omitzero"`
	SortByLength bool    `json:"sort_by_length,omitempty"` // group samples of similar length (Trainer's group_by_length)

	// Fixes.
	AMP        knob.AMP        `json:"amp"`                  // off, fp16 (with dynamic loss scaling) or bf16
	Checkpoint knob.Checkpoint `json:"checkpoint"`           // off, all, every:N (every N-th block), attn (attention only) or selective:ops
	Attention  knob.Attention  `json:"attention"`            // naive or flash
	Accum      int             `json:"accum"`                // micro-batches per optimizer step (gradient accumulation)
	EmptyCache EmptyCache      `json:"empty_cache,omitzero"` // when the loop calls torch.cuda.empty_cache()
	// Logits is how long the loop holds the model's logits: LogitsKeep (the GPT presets: nanoGPT's loop) or
	// LogitsDrop ("" too: the MLP's loop).
	Logits string `json:"logits,omitempty"`

	Batch int `json:"batch"` // micro-batch size: the effective batch is Batch x Accum
	Steps int `json:"steps"`
	// EvalEvery runs an evaluation pass after every EvalEvery-th step (0: never).
	EvalEvery int `json:"eval_every,omitempty"`

	Device         device.Kind `json:"device"`          // meta, cpu or cuda
	GPUMemory      uint64      `json:"gpu_memory"`      // device capacity in bytes
	ContextReserve uint64      `json:"context_reserve"` // taken by the CUDA context before the allocator
	AllocConf      AllocConf   `json:"alloc_conf,omitzero"`

	Optimizer knob.Optimizer `json:"optimizer"` // one of knob.Optimizers
	// OptimizerImpl is how torch.optim runs Adam and AdamW: foreach ("" too), fused or for-loop.
	OptimizerImpl knob.OptimizerImpl `json:"optimizer_impl,omitempty"`
	// OptimizerInBackward steps each parameter in backward, the moment its gradient is accumulated, and
	// frees the gradient right after (torchtune's optimizer_in_bwd: an optimizer per parameter, stepped by
	// its post-accumulate-grad hook).
	OptimizerInBackward bool          `json:"optimizer_in_backward,omitempty"`
	LR                  float32       `json:"lr"`
	WeightDecay         float32       `json:"weight_decay,omitempty"`
	ZeroGrad            knob.ZeroGrad `json:"zero_grad"` // none (set_to_none, the default) or zero

	Seed uint64 `json:"seed"`
	Bug  string `json:"bug,omitempty"` // one of Bugs, or "" for the fixed code path

	// Compile asks for the model under torch.compile, which is refused: its figures are not modelled.
	Compile bool `json:"compile,omitempty"`

	// ActivationOffload moves what the model's forward saves for backward to pinned host memory (--offload
	// activations), as torchtune's OffloadActivations does.
	ActivationOffload ActivationOffload `json:"activation_offload,omitzero"`

	// Parallel is the data-parallel job the run is one rank of (the zero value: one GPU): the GPUs and
	// nodes, the strategy (DDP, ZeRO-1/2/3, FSDP), the rank simulated, CPU offload and each strategy's knobs.
	Parallel dist.Settings `json:"parallel,omitzero"`
	// Split splits the model past data parallelism: tensor, sequence, context and pipeline parallel.
	Split Split `json:"split,omitzero"`
}

// validateLlama checks how the Llama-family shape (and BERT's) and the adapters combine (validateNumbers has
// checked each number).
func (c *Config) validateLlama() error {
	if err := c.validateFamily(); err != nil {
		return err
	}
	if c.Model == "bert" {
		if c.DModel%c.Heads != 0 {
			return &FieldError{"heads", c.Heads, fmt.Sprintf("does not divide d_model %d", c.DModel)}
		}
		return c.validateAdapters()
	}
	if c.HeadDim == 0 && c.DModel%c.Heads != 0 {
		return &FieldError{"heads", c.Heads, fmt.Sprintf("does not divide d_model %d (give head_dim)", c.DModel)}
	}
	if kv := c.KVHeads; kv > 0 && c.Heads%kv != 0 {
		return &FieldError{"kv_heads", kv, fmt.Sprintf("does not divide the %d heads", c.Heads)}
	}
	if hd := c.headDim(); hd%2 != 0 {
		return fmt.Errorf("head size %d is odd: rotary embeddings rotate halves", hd)
	}
	return c.validateAdapters()
}

// validateAdapters checks the LoRA and QLoRA settings.
func (c *Config) validateAdapters() error {
	if c.QLoRA && c.LoRA == 0 {
		return fmt.Errorf("qlora trains LoRA adapters on the 4-bit base: give --lora R")
	}
	if err := c.validateStacks(); err != nil {
		return err
	}
	if c.LoRA == 0 && (c.LoRATargets != 0 || c.LoRAAlpha != 0 || c.LoRADropout != 0) {
		return fmt.Errorf("lora targets, alpha and dropout need --lora R")
	}
	if c.LoRA == 0 {
		return nil
	}
	if c.LoRATargets == 0 && c.defaultLoRATargets() == nil {
		return fmt.Errorf("peft has no default target modules for %s: give --lora-targets (some of %s)", c.Architecture,
			strings.Join(c.projections(), ","))
	}
	for _, t := range c.LoRATargets.list() {
		if t != allLinear && indexOf(c.loraTargetable(), t) < 0 {
			return fmt.Errorf("lora target %q: the model's projections are %s", t, strings.Join(c.loraTargetable(), ","))
		}
	}
	return c.loraConfig().Validate()
}

func (c *Config) headDim() int {
	if c.HeadDim > 0 {
		return c.HeadDim
	}
	return c.DModel / c.Heads
}

// DefaultLoRAAlpha is peft's LoraConfig default lora_alpha.
const DefaultLoRAAlpha = 8

// loraConfig returns the adapter configuration, with peft's defaults for what is not given.
func (c *Config) loraConfig() nn.LoRAConfig {
	alpha := c.LoRAAlpha
	if alpha == 0 {
		alpha = DefaultLoRAAlpha
	}
	targets := c.LoRATargets.list()
	switch {
	case c.LoRATargets == 0: // peft's default for the model
		targets = c.defaultLoRATargets()
	case c.LoRATargets&LoRAAllLinear != 0: // peft's all-linear: every linear layer but the output layer
		targets = (c.LoRATargets&^LoRAAllLinear | c.EveryProjection()).list()
	}
	return nn.LoRAConfig{Rank: c.LoRA, Alpha: alpha, Dropout: c.LoRADropout, Targets: targets, DType: c.adapterDType()}
}

// quant4 is how QLoRA stores the base's weights: BitsAndBytesConfig's double quantization and storage, and
// whether a float16 copy is quantized (as bitsandbytes before 0.43.0 does unless told otherwise).
func (c *Config) quant4() *tensor.Quant4Options {
	return &tensor.Quant4Options{DoubleQuant: c.QLoRADoubleQuant.On(true), Storage: c.QLoRAStorage.dtype(),
		Half: c.QLoRAHalf.On(c.Versions.QuantizesHalf())}
}

// llamaConfig returns the model configuration of a validated llama Config.
func (c *Config) llamaConfig() nn.LlamaConfig {
	dtype := c.Weights.dtype()
	if c.QLoRA && c.Weights == WeightsF32 {
		dtype = tensor.BF16 // the QLoRA recipe loads with torch_dtype=bfloat16
	}
	attention := "naive"
	if c.Attention == knob.AttentionFlash {
		attention = "flash"
	}
	m := nn.LlamaConfig{Vocab: c.Vocab, DModel: c.DModel, Layers: c.Layers, Heads: c.Heads, KVHeads: c.KVHeads,
		HeadDim: c.HeadDim, FFN: c.FFN, Tied: c.Tied, QKVBias: c.QKVBias, NormEps: c.NormEps, RopeTheta: c.RopeTheta,
		Attention: attention, Dropout: c.Dropout, DType: dtype, QLoRA: c.QLoRA,
		Loss: nn.Loss{Kind: c.Loss.Kind, Chunk: c.Loss.Chunk}, Prequantized: c.Load == LoadNone}
	if c.QLoRA {
		m.Quant, m.QuantizeHead = c.quant4(), c.QLoRAHead
	}
	if c.LoRA > 0 {
		lc := c.loraConfig()
		m.Adapter = &lc
	}
	return m
}

// The leak bugs, each a real PyTorch mistake. The fixed code path is the default.
const (
	// BugEvalNoGrad runs evaluation without no_grad and keeps its outputs: each keeps its graph and saved
	// activations alive.
	BugEvalNoGrad = "eval-no-grad"
	// BugRetainGraph calls backward(retain_graph=True) while the loss is kept in a history list.
	BugRetainGraph = "retain-graph"
	// BugStashActivations keeps every hidden layer's output from a forward hook without detach.
	BugStashActivations = "stash-activations"
	// BugTensorLossSum sums the losses as tensors instead of with .item(): the graph grows on the host, not on
	// the device. It is the negative control: it must not read as a device leak.
	BugTensorLossSum = "tensor-loss-sum"
	// BugNoZeroGrad never calls optimizer.zero_grad(): backward adds each step's gradients in place to the
	// gradients of every step before, so the optimizer steps on a running sum. Memory does not grow: the
	// gradients stay allocated between steps instead of being freed by zero_grad(set_to_none=True).
	BugNoZeroGrad = "no-zero-grad"
	// BugModuleAttribute keeps a module's intermediate on the module in forward, self.intermediate = x @ W:
	// the GPT's attention keeps its qkv projection, the MLP's linear layers and a Llama's decoder layers
	// their outputs. Each attribute
	// holds one tensor until the next forward overwrites it (after backward, its graph's saved tensors are
	// freed; the tensor itself stays), a constant amount held across iterations, not a growing leak.
	BugModuleAttribute = "module-attribute"
)

// What the training loop does with the logits the model returns with the loss.
const (
	// LogitsKeep is nanoGPT's train.py: logits, loss = model(X, Y) holds the logits through backward and the
	// optimizer step until the next forward returns. The GPT presets are nanoGPT, so it is their default.
	LogitsKeep = "keep"
	// LogitsDrop frees the logits before backward, as HF Trainer's compute_loss (which returns only the loss)
	// and a loop computing loss = F.cross_entropy(model(x), y) in one expression (the MLP's) do.
	LogitsDrop = "drop"
)

// DescribeBug says what a bug's loop does, in PyTorch: "loss.backward(retain_graph=True);
// loss_history.append(loss)"; for "" the fixed loop.
func DescribeBug(bug string) string {
	switch bug {
	case "":
		return "the fixed loop"
	case BugEvalNoGrad:
		return "eval_outputs.append(model(x)) without torch.no_grad()"
	case BugRetainGraph:
		return "loss.backward(retain_graph=True); loss_history.append(loss)"
	case BugStashActivations:
		return "a forward hook keeps every hidden output without detach()"
	case BugTensorLossSum:
		return "total_loss += loss instead of loss.item()"
	case BugNoZeroGrad:
		return "no optimizer.zero_grad()"
	case BugModuleAttribute:
		return "self.intermediate = x @ W in a module's forward"
	}
	return bug
}

// Bugs lists every bug name Config.Bug accepts.
var Bugs = []string{BugEvalNoGrad, BugRetainGraph, BugStashActivations, BugTensorLossSum, BugNoZeroGrad, BugModuleAttribute}

// DefaultMLP is a small classifier that learns its task in seconds on the cpu device.
func DefaultMLP() Config {
	return Config{
		Model: "mlp", InFeatures: 32, Hidden: 128, Layers: 2, Classes: 8,
		Batch: 64, Steps: 200, EvalEvery: 0,
		Device: device.Meta, GPUMemory: device.DefaultCapacity, ContextReserve: device.DefaultContextReserve,
		Optimizer: knob.Adam, LR: 1e-2, ZeroGrad: knob.ZeroGradNone, Seed: 1,
		AMP: knob.AMPOff, Checkpoint: knob.CheckpointOff, Attention: knob.AttentionNaive, Accum: 1,
	}
}

// Validate checks the configuration and says what is wrong in one line.
func (c *Config) Validate() error {
	if c.Model != "mlp" && c.Model != "gpt" && c.Model != "llama" && c.Model != "bert" {
		return fmt.Errorf("unknown model %q (want mlp, gpt, llama or bert)", c.Model)
	}
	if !c.HF() && (c.LoRA != 0 || c.QLoRA || c.Weights != WeightsF32 || c.LoRATargets != 0) {
		return fmt.Errorf("lora, qlora and weights apply to the llama model and to bert")
	}
	if !c.HF() && (c.QLoRADoubleQuant != ToggleDefault || c.QLoRAStorage != StorageUint8 || c.KbitPrep != ToggleDefault ||
		c.QLoRAHalf != ToggleDefault || c.QLoRAHead ||
		c.LoRADType != AdapterPEFT || !c.Loss.IsZero() || c.Load != LoadNone) {
		return fmt.Errorf("qlora storage, kbit-prep, lora dtype, loss and load apply to the llama model (and load to bert)")
	}
	if !c.HF() && (c.Family != FamilyShape{} || !c.Routing.IsZero() || c.Task != TaskMLM) {
		return fmt.Errorf("experts, routing and task apply to the llama and bert models")
	}
	if err := c.validateNumbers(); err != nil {
		return err
	}
	if c.HF() {
		if err := c.validateLlama(); err != nil {
			return err
		}
	}
	// The settings below were parsed where they came in (flags, JSON); what is left is to check the ones made
	// in code and how they combine.
	if c.AMP > knob.AMPBF16 || c.Attention > knob.AttentionFlash || c.ZeroGrad > knob.ZeroGradZero {
		return fmt.Errorf("invalid settings: %s, %s, %s", c.AMP, c.Attention, c.ZeroGrad)
	}
	if c.Logits != "" && c.Logits != LogitsKeep && c.Logits != LogitsDrop {
		return fmt.Errorf("unknown logits %q (want keep or drop)", c.Logits)
	}
	if c.Model == "mlp" && (c.Checkpoint != knob.CheckpointOff || c.Attention != knob.AttentionNaive) {
		return fmt.Errorf("checkpoint and attention apply to the gpt and llama models")
	}
	if c.HF() && c.Checkpoint == knob.CheckpointAttention {
		return fmt.Errorf("checkpoint attn applies to the gpt model (%s: off, all or every:N)", c.Model)
	}
	if err := c.validateLengths(); err != nil {
		return err
	}
	if c.EmptyCache > EmptyCachePhase {
		return fmt.Errorf("invalid empty_cache setting %s", c.EmptyCache)
	}
	if err := c.Device.Available(); err != nil {
		return err
	}
	if err := allocator.CheckConfig(c.AllocConf.Config); err != nil {
		return fmt.Errorf("alloc conf: %w", err)
	}
	if _, err := knob.ParseOptimizer(string(c.Optimizer)); err != nil {
		return err // a Config made in code with a name that is not an optimizer's
	}
	if _, err := knob.ParseOptimizerImpl(string(c.OptimizerImpl)); err != nil {
		return err
	}
	if c.AMP == knob.AMPFP16 && c.Weights == WeightsFP16 {
		return fmt.Errorf("amp fp16 with fp16 weights: the grad scaler cannot unscale fp16 gradients (PyTorch raises the same)")
	}
	if c.Compile {
		return ErrCompile
	}
	if err := c.validateInBackward(); err != nil {
		return err
	}
	if err := c.validateActivationOffload(); err != nil {
		return err
	}
	if c.Bug != "" && !slices.Contains(Bugs, c.Bug) {
		return fmt.Errorf("unknown bug %q (want one of %s)", c.Bug, strings.Join(Bugs, ", "))
	}
	if err := c.validateSplit(); err != nil {
		return err
	}
	return c.validateParallel()
}

// ErrCompile is why --compile is refused rather than ignored: what a compiled model keeps is not what eager
// PyTorch keeps, and the runtime is eager PyTorch.
var ErrCompile = errors.New("torch.compile is not modelled: its min-cut partitioner (functorch's " +
	"min_cut_rematerialization_partition) chooses what the compiled graph saves and recomputes, and its fusions " +
	"drop intermediates, so eager figures would not be its; run without --compile for eager PyTorch's")

// validateInBackward checks what the optimizer step in backward combines with: each parameter is updated
// as its gradient arrives, so nothing may need every gradient first.
func (c *Config) validateInBackward() error {
	switch {
	case !c.OptimizerInBackward:
		return nil
	case c.Accum > 1:
		return fmt.Errorf("optimizer in backward updates each parameter as its gradient arrives: it cannot accumulate gradients over --accum %d micro-batches (torchtune refuses the same)", c.Accum)
	case c.AMP == knob.AMPFP16:
		return fmt.Errorf("optimizer in backward with amp fp16: the grad scaler unscales and checks every gradient before any step (use bf16)")
	case c.Parallel.Parallel():
		return fmt.Errorf("optimizer in backward with data parallelism is not modelled")
	}
	return nil
}

// validateParallel checks how the data-parallel settings combine with the rest (validateNumbers has checked
// their numbers).
func (c *Config) validateParallel() error {
	p := c.Parallel
	if !p.Parallel() {
		return nil
	}
	s := p.Strategy
	switch {
	case c.Device == device.CPU && s != dist.DDP:
		return fmt.Errorf("%s runs on the meta (or cuda) device: one rank's shard cannot update the model's values on the cpu device (--dp ddp can)", s)
	case s.ZeRO() && c.Optimizer != knob.Adam && c.Optimizer != knob.AdamW:
		return fmt.Errorf("%s steps with DeepSpeed's Adam on its fp32 partition: choose --optimizer adam or adamw, not %s", s, c.Optimizer)
	case s != dist.DDP && (c.Optimizer == knob.PagedAdamW || c.Optimizer == knob.PagedAdamW8bit || c.Optimizer == knob.AdamW8bit):
		return fmt.Errorf("%s with bitsandbytes' optimizers is not modelled (--dp ddp is)", s)
	case s == dist.HSDP && p.NodeCount() < 2:
		return fmt.Errorf("hsdp shards within a node and replicates across nodes: give --nodes 2 or more (on one node it is fsdp-full)")
	}
	return nil
}
