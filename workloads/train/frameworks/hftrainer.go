package frameworks

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// hfTrainer reads Hugging Face TrainingArguments as JSON (TrainingArguments.to_json_string(), or the JSON
// HfArgumentParser.parse_json_file reads), with the model from the config.json beside it and LoRA from a
// peft adapter_config.json there, if any: per_device_train_batch_size, gradient_accumulation_steps,
// gradient_checkpointing, bf16 and fp16 (autocast), optim, learning_rate, weight_decay, group_by_length
// and torch_compile. The sequence length is the data collator's, not an argument.
func (b *builder) hfTrainer() error {
	b.fw = HFTrainer
	if !has(b.doc, "per_device_train_batch_size") && !has(b.doc, "gradient_accumulation_steps") {
		return errors.New("a JSON file that is not TrainingArguments (no per_device_train_batch_size)")
	}
	if err := b.hfModel(); err != nil {
		return err
	}
	if err := b.count("per_device_train_batch_size", "batch"); err != nil {
		return err
	}
	if err := b.count("gradient_accumulation_steps", "accum"); err != nil {
		return err
	}
	b.ignore("(sequence length)", "TrainingArguments do not give it (the data collator does): the model's --seq "+itoa(b.cfg.Seq)+" stands")
	bf16, _, err := b.boolean("bf16")
	if err != nil {
		return err
	}
	fp16, _, err := b.boolean("fp16")
	if err != nil {
		return err
	}
	b.used["bf16"], b.used["fp16"] = true, true
	amp := "off"
	if fp16 {
		amp = "fp16"
	}
	if bf16 {
		amp = "bf16"
	}
	if err := b.set("bf16", "amp", amp); err != nil {
		return err
	}
	if name, err := b.str("optim"); err != nil {
		return err
	} else if name != "" {
		if err := b.hfOptimizer("optim", name); err != nil {
			return err
		}
	}
	if err := b.scalar("learning_rate", "lr"); err != nil {
		return err
	}
	if err := b.scalar("weight_decay", "weight-decay"); err != nil {
		return err
	}
	if group, ok, err := b.boolean("group_by_length"); err != nil {
		return err
	} else if ok {
		if err := b.set("group_by_length", "sort-by-length", fmt.Sprint(group)); err != nil {
			return err
		}
	}
	if err := b.trainerCommon("gradient_checkpointing", "gradient_checkpointing_kwargs", "torch_compile", "max_grad_norm"); err != nil {
		return err
	}
	if err := b.hfExtras(); err != nil {
		return err
	}
	b.rest()
	return nil
}

// trainerCommon reads the settings HF Trainer and axolotl spell alike: gradient checkpointing (every
// layer; reentrant or not keeps the same bytes), torch.compile and gradient clipping.
func (b *builder) trainerCommon(ckpt, kwargs, compile, clip string) error {
	on, _, err := b.boolean(ckpt)
	if err != nil {
		return err
	}
	setting := "off"
	if on {
		setting = "all"
	}
	if err := b.set(ckpt, "checkpoint", setting); err != nil {
		return err
	}
	if has(b.doc, kwargs) {
		b.ignore(kwargs, "reentrant or not, checkpointing keeps the same bytes: the runtime's is reentrant")
	}
	if err := b.compile(compile); err != nil {
		return err
	}
	return b.clipping(clip)
}

// trlFields are the arguments TRL's trainers add to TrainingArguments for generation and a reference model.
var trlFields = []string{"num_generations", "max_completion_length", "max_prompt_length", "beta", "use_vllm",
	"vllm_device", "vllm_gpu_memory_utilization", "vllm_dtype", "vllm_max_model_len", "vllm_sampling_params",
	"ds3_gather_for_generation", "reward_weights", "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps",
	"temperature", "log_completions", "model_init_kwargs"}

// hfExtras reads Liger's kernels and records the arguments that change memory in ways not modelled.
func (b *builder) hfExtras() error {
	if on, _, _ := b.boolean("use_liger_kernel"); on {
		if err := b.ligerLoss("use_liger_kernel"); err != nil {
			return err
		}
		b.ignore("use_liger_kernel (RoPE, RMSNorm, SwiGLU)", "Liger's other kernels save less than HF's modules: "+notModelled)
	} else {
		b.used["use_liger_kernel"] = true
	}
	if n, ok, _ := b.integer("torch_empty_cache_steps"); ok {
		b.ignore("torch_empty_cache_steps", "empty_cache every "+itoa(n)+" steps: a run of a few steps is not emptied (--empty-cache step empties every step)")
	} else {
		b.used["torch_empty_cache_steps"] = true
	}
	for _, f := range []string{"deepspeed", "fsdp", "fsdp_config"} {
		switch v := get(b.doc, f).(type) {
		case nil:
		case []any:
			if len(v) > 0 {
				b.ignore(f, "sharding is not read from the file: give --gpus and --dp")
			} else {
				b.used[f] = true
			}
		default:
			if f == "fsdp_config" {
				b.used[f] = true
			} else {
				b.ignore(f, "sharding is not read from the file: give --gpus and --dp")
			}
		}
	}
	var trl []string
	for _, f := range trlFields {
		if has(b.doc, f) {
			trl = append(trl, f)
			b.used[f] = true
		}
	}
	if len(trl) > 0 {
		b.ignored = append(b.ignored, Ignored{strings.Join(trl, ", "), "TRL's generation and reference model are " +
			notModelled + ": the figures are one supervised step's"})
	}
	return nil
}

// ligerLoss sets Liger's fused linear cross-entropy, unless LoRA adapts lm_head (not modelled with it).
func (b *builder) ligerLoss(field string) error {
	if b.cfg.AdaptsLMHead() {
		b.ignore(field, "Liger's fused linear cross-entropy with LoRA on lm_head is "+notModelled+"; the full logits are taken")
		return nil
	}
	return b.set(field, "loss", "fused-linear-ce")
}

// hfModel takes the model from config.json beside the arguments (or the one given), with its quantization,
// and LoRA from adapter_config.json.
func (b *builder) hfModel() error {
	var quant struct {
		QuantizationConfig *struct {
			QuantMethod string `json:"quant_method"`
			LoadIn4bit  bool   `json:"load_in_4bit"`
			DoubleQuant *bool  `json:"bnb_4bit_use_double_quant"`
			Storage     string `json:"bnb_4bit_quant_storage"`
		} `json:"quantization_config"`
	}
	if b.model != nil {
		b.cfg = *b.model
	} else {
		path := filepath.Join(b.dir, "config.json")
		data, err := readBounded(path)
		if err != nil {
			return fmt.Errorf("TrainingArguments name no model: the model's config.json must be beside them (%w)", err)
		}
		m, err := hfconfig.Parse(data)
		if err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		b.cfg, b.base = train.FromHF(m), []string{"--hf-config", path}
		_ = json.Unmarshal(data, &quant) // hfconfig has checked it is JSON
	}
	adapter, err := b.adapterConfig()
	if err != nil {
		return err
	}
	q := quant.QuantizationConfig
	fromName := adapter != nil && strings.Contains(strings.ToLower(adapter.Base), "bnb-4bit")
	if (q != nil && q.LoadIn4bit) || fromName {
		if b.cfg.LoRA == 0 {
			return errors.New("a 4-bit base without a LoRA adapter cannot train: put the adapter_config.json beside the arguments")
		}
		if err := b.set("quantization_config", "qlora", "true"); err != nil {
			return err
		}
		if fromName && q == nil {
			b.ignore("adapter_config.json: base_model_name_or_path", adapter.Base+" is a bitsandbytes 4-bit checkpoint (its name says so): its default quantization is taken")
		}
		if q != nil {
			return b.bnbConfig(q.DoubleQuant, q.Storage)
		}
	}
	return nil
}

// bnbConfig maps a BitsAndBytesConfig's bnb_4bit_use_double_quant and bnb_4bit_quant_storage (a torch
// dtype's name). The storage changes no byte (the packed weights are the same bytes in any dtype): float16 is
// taken as bf16.
func (b *builder) bnbConfig(doubleQuant *bool, storage string) error {
	const field = "quantization_config"
	if doubleQuant != nil {
		if err := b.set(field, "qlora-double-quant", fmt.Sprint(*doubleQuant)); err != nil {
			return err
		}
	}
	switch strings.TrimPrefix(storage, "torch.") {
	case "", "uint8":
		return nil
	case "bfloat16", "float16":
		return b.set(field, "qlora-storage", "bf16")
	case "float32":
		return b.set(field, "qlora-storage", "f32")
	}
	return fmt.Errorf("%s: bnb_4bit_quant_storage %q: want uint8, bfloat16, float16 or float32", field, storage)
}

// peftAdapter is what a peft adapter_config.json says of a LoRA adapter.
type peftAdapter struct {
	PeftType      string   `json:"peft_type"`
	R             int      `json:"r"`
	Alpha         float64  `json:"lora_alpha"`
	Dropout       float64  `json:"lora_dropout"`
	Targets       any      `json:"target_modules"`
	ModulesToSave []string `json:"modules_to_save"`
	UseDoRA       bool     `json:"use_dora"`
	Base          string   `json:"base_model_name_or_path"`
}

// adapterConfig reads adapter_config.json beside the arguments, if there is one, into the LoRA settings.
func (b *builder) adapterConfig() (*peftAdapter, error) {
	path := filepath.Join(b.dir, "adapter_config.json")
	if _, err := os.Stat(path); err != nil {
		return nil, nil
	}
	data, err := readBounded(path)
	if err != nil {
		return nil, err
	}
	var a peftAdapter
	if err := json.Unmarshal(data, &a); err != nil {
		return nil, fmt.Errorf("%s: not a peft adapter config: %s", path, firstLine(err.Error()))
	}
	if a.PeftType != "LORA" || a.R < 1 {
		return nil, fmt.Errorf("%s: peft_type %q with r %d: only LoRA adapters are read", path, a.PeftType, a.R)
	}
	const field = "adapter_config.json"
	for _, s := range [][2]string{{"lora", itoa(a.R)}, {"lora-alpha", formatFloat(a.Alpha)}, {"lora-dropout", formatFloat(a.Dropout)}} {
		if err := b.set(field, s[0], s[1]); err != nil {
			return nil, err
		}
	}
	var targets []string
	switch t := a.Targets.(type) {
	case string:
		targets = []string{t}
	case []any:
		for _, x := range t {
			if s, ok := x.(string); ok {
				targets = append(targets, s)
			}
		}
	}
	if err := b.loraTargets(field+": target_modules", targets); err != nil {
		return nil, err
	}
	if len(a.ModulesToSave) > 0 {
		b.ignore(field+": modules_to_save", "trained copies of "+strings.Join(a.ModulesToSave, ", ")+" are "+notModelled)
	}
	if a.UseDoRA {
		b.ignore(field+": use_dora", "DoRA's magnitude vectors and their saved norms are "+notModelled)
	}
	return &a, nil
}
