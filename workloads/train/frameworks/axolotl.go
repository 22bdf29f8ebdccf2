package frameworks

import "strings"

// axolotl reads an axolotl config (examples/*/*.yml): base_model, the adapter (lora, qlora with
// load_in_4bit), LoRA's settings, sequence_len and sample_packing, micro_batch_size,
// gradient_accumulation_steps, the optimizer (TrainingArguments' names), bf16 and fp16 (axolotl loads the
// model in that dtype and HF Trainer autocasts to it), gradient_checkpointing, the attention and the
// Liger kernels.
func (b *builder) axolotl() error {
	b.fw = Axolotl
	base, err := b.str("base_model")
	if err != nil {
		return err
	}
	if err := b.useModel("base_model", base); err != nil {
		return err
	}
	b.used["model_type"], b.used["tokenizer_type"] = true, true
	if err := b.axolotlAdapter(); err != nil {
		return err
	}
	if err := b.seqLength("sequence_len"); err != nil {
		return err
	}
	if packed, _, err := b.boolean("sample_packing"); err != nil {
		return err
	} else if !packed {
		b.ignore("sample_packing", datasetLength)
	} else {
		b.used["sample_packing"] = true // packed to sequence_len: every sample is --seq long
	}
	if err := b.count("micro_batch_size", "batch"); err != nil {
		return err
	}
	if err := b.count("gradient_accumulation_steps", "accum"); err != nil {
		return err
	}
	if name, err := b.str("optimizer"); err != nil {
		return err
	} else if name != "" {
		if err := b.hfOptimizer("optimizer", name); err != nil {
			return err
		}
	}
	if err := b.scalar("learning_rate", "lr"); err != nil {
		return err
	}
	if err := b.scalar("weight_decay", "weight-decay"); err != nil {
		return err
	}
	if err := b.axolotlPrecision(); err != nil {
		return err
	}
	if err := b.axolotlQuantStorage(); err != nil {
		return err
	}
	if err := b.trainerCommon("gradient_checkpointing", "gradient_checkpointing_kwargs", "torch_compile", "max_grad_norm"); err != nil {
		return err
	}
	if err := b.axolotlAttention(); err != nil {
		return err
	}
	if err := b.axolotlKernels(); err != nil {
		return err
	}
	b.rest()
	return nil
}

// axolotlAdapter reads adapter, load_in_4bit and load_in_8bit, and LoRA's settings.
func (b *builder) axolotlAdapter() error {
	adapter, err := b.str("adapter")
	if err != nil {
		return err
	}
	in4, _, err := b.boolean("load_in_4bit")
	if err != nil {
		return err
	}
	in8, _, err := b.boolean("load_in_8bit")
	if err != nil {
		return err
	}
	b.used["load_in_4bit"], b.used["load_in_8bit"] = true, true
	if in8 {
		b.ignore("load_in_8bit", "an LLM.int8 base is "+notModelled+": the base is taken in the precision's dtype, twice its bytes")
	}
	if adapter == "" {
		b.used["adapter"] = true
		return nil
	}
	b.used["adapter"] = true
	if adapter != "lora" && adapter != "qlora" {
		b.ignore("adapter", "adapter "+adapter+" is "+notModelled+": a full fine-tune is taken")
		return nil
	}
	if err := b.count("lora_r", "lora"); err != nil {
		return err
	}
	if err := b.scalar("lora_alpha", "lora-alpha"); err != nil {
		return err
	}
	if err := b.scalar("lora_dropout", "lora-dropout"); err != nil {
		return err
	}
	modules, err := b.strings("lora_target_modules")
	if err != nil {
		return err
	}
	if linear, _, err := b.boolean("lora_target_linear"); err != nil {
		return err
	} else if linear {
		modules = append(modules, "all-linear")
	}
	b.used["lora_target_linear"] = true
	if err := b.loraTargets("lora_target_modules", modules); err != nil {
		return err
	}
	if saved, err := b.strings("lora_modules_to_save"); err != nil {
		return err
	} else if len(saved) > 0 {
		b.ignore("lora_modules_to_save", "trained copies of "+strings.Join(saved, ", ")+" (peft's modules_to_save) are "+notModelled)
	}
	if adapter == "qlora" || in4 {
		if err := b.set("adapter", "qlora", "true"); err != nil {
			return err
		}
	}
	return nil
}

// axolotlQuantStorage: axolotl loads a 4-bit base with bnb_4bit_quant_storage in the model's dtype (its
// peft preparation is --kbit-prep's default: on, but under FSDP and ZeRO).
func (b *builder) axolotlQuantStorage() error {
	if !b.cfg.QLoRA {
		return nil
	}
	return b.set("adapter", "qlora-storage", map[string]string{"bf16": "bf16", "f32": "f32", "fp16": "bf16"}[b.cfg.Weights.String()])
}

// axolotlPrecision: bf16 (true or auto) loads the model in bfloat16 and autocasts to it; fp16 autocasts to
// float16 (a float16 base cannot be unscaled, so the model's weights stand).
func (b *builder) axolotlPrecision() error {
	bf16, _, err := b.boolean("bf16")
	if err != nil {
		return err
	}
	fp16, _, err := b.boolean("fp16")
	if err != nil {
		return err
	}
	b.used["bf16"], b.used["fp16"] = true, true
	switch {
	case bf16:
		if err := b.set("bf16", "weights", "bf16"); err != nil {
			return err
		}
		return b.set("bf16", "amp", "bf16")
	case fp16:
		return b.set("fp16", "amp", "fp16")
	}
	return b.set("bf16", "amp", "off")
}

// axolotlAttention reads attn_implementation, or the older flash_attention and sdp_attention switches.
func (b *builder) axolotlAttention() error {
	impl, err := b.str("attn_implementation")
	if err != nil {
		return err
	}
	for _, f := range []string{"flash_attention", "sdp_attention"} {
		if on, _, err := b.boolean(f); err != nil {
			return err
		} else if on {
			impl = "sdpa"
			b.used[f] = true
		}
	}
	switch impl {
	case "":
		return nil
	case "eager":
		return b.set("attn_implementation", "attention", "naive")
	case "sdpa", "flash_attention_2", "flash_attention_3", "flex_attention":
		return b.set("attn_implementation", "attention", "flash")
	}
	b.ignore("attn_implementation", "attention "+impl+" is "+notModelled)
	return nil
}

// axolotlKernels reads Liger's kernels: the fused linear cross-entropy never makes the logits (--loss
// fused-linear-ce); the others save less than HF's modules, not modelled yet.
func (b *builder) axolotlKernels() error {
	if on, _, _ := b.boolean("liger_fused_linear_cross_entropy"); on {
		if err := b.ligerLoss("liger_fused_linear_cross_entropy"); err != nil {
			return err
		}
	}
	if on, _, _ := b.boolean("liger_cross_entropy"); on {
		b.ignore("liger_cross_entropy", "Liger's cross-entropy over the whole logits, its gradient written over them, is "+
			notModelled+"; HF's loss is taken")
	}
	for _, f := range []string{"liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_layer_norm", "liger_swiglu"} {
		if on, _, _ := b.boolean(f); on {
			b.ignore(f, "Liger's kernel saves less than HF's module: "+notModelled)
		}
	}
	for _, f := range []string{"deepspeed", "fsdp", "fsdp_config", "fsdp_version"} {
		if has(b.doc, f) {
			b.ignore(f, "sharding is not read from the file: give --gpus and --dp")
		}
	}
	return nil
}
