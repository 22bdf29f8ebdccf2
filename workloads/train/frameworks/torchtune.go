package frameworks

import (
	"fmt"
	"strings"
)

// torchtune reads a torchtune recipe config (recipes/configs/*.yaml, for lora_finetune_single_device,
// full_finetune_single_device and their distributed forms): the model builder, LoRA's settings, batch_size,
// gradient_accumulation_steps, tokenizer.max_seq_len, the optimizer, optimizer_in_bwd, dtype (the whole
// model in it, no autocast), activation checkpointing and offloading, loss and compile. torchtune's
// models attend with sdpa and drop the logits once the loss has them.
func (b *builder) torchtune() error {
	b.fw = Torchtune
	component, err := b.str("model._component_")
	if err != nil {
		return err
	}
	builderName := component[strings.LastIndex(component, ".")+1:]
	kind := ""
	for _, k := range []string{"qlora_", "lora_"} {
		if base, ok := strings.CutPrefix(builderName, k); ok {
			kind, builderName = k, base
		}
	}
	if err := b.useModel("model._component_", builderName); err != nil {
		return err
	}
	if err := b.set("model._component_", "attention", "flash"); err != nil { // torchtune's attention is sdpa
		return err
	}
	if kind != "" {
		if err := b.torchtuneLoRA(kind == "qlora_"); err != nil {
			return err
		}
	}
	for _, s := range []struct{ field, flag string }{{"batch_size", "batch"}, {"gradient_accumulation_steps", "accum"}} {
		if err := b.count(s.field, s.flag); err != nil {
			return err
		}
	}
	if err := b.seqLength("tokenizer.max_seq_len"); err != nil {
		return err
	}
	if packed, _, err := b.boolean("dataset.packed"); err != nil {
		return err
	} else if !packed {
		b.ignore("dataset.packed", datasetLength)
	} else {
		b.used["dataset.packed"] = true
	}
	if err := b.torchtuneOptimizer(); err != nil {
		return err
	}
	if err := b.torchtunePrecision(); err != nil {
		return err
	}
	if err := b.torchtuneActivations(); err != nil {
		return err
	}
	if err := b.torchtuneLoss(); err != nil {
		return err
	}
	if err := b.clipping("clip_grad_norm"); err != nil {
		return err
	}
	if err := b.compile("compile"); err != nil {
		return err
	}
	if low, _, err := b.boolean("low_cpu_ram"); err != nil {
		return err
	} else if low {
		b.ignore("low_cpu_ram", "host memory while the model loads; the device's is the same")
	}
	b.rest()
	return nil
}

// torchtuneLoRA reads the LoRA builder's arguments: lora_attn_modules, apply_lora_to_mlp (w1, w2, w3),
// apply_lora_to_output, lora_rank, lora_alpha, lora_dropout. A qlora_ builder stores the base in NF4
// (torchao's NF4Tensor: blocks of 64, scalers quantized in blocks of 256, the sizes bitsandbytes' double
// quantization has).
func (b *builder) torchtuneLoRA(qlora bool) error {
	if err := b.count("model.lora_rank", "lora"); err != nil {
		return err
	}
	if err := b.scalar("model.lora_alpha", "lora-alpha"); err != nil {
		return err
	}
	if err := b.scalar("model.lora_dropout", "lora-dropout"); err != nil {
		return err
	}
	modules, err := b.strings("model.lora_attn_modules")
	if err != nil {
		return err
	}
	mlp, _, err := b.boolean("model.apply_lora_to_mlp")
	if err != nil {
		return err
	}
	if mlp {
		modules = append(modules, "w1", "w2", "w3")
	}
	out, _, err := b.boolean("model.apply_lora_to_output")
	if err != nil {
		return err
	}
	if out {
		modules = append(modules, "output")
	}
	if err := b.loraTargets("model.lora_attn_modules", modules); err != nil {
		return err
	}
	b.used["model.apply_lora_to_mlp"], b.used["model.apply_lora_to_output"] = true, true
	if qlora {
		if err := b.set("model._component_", "qlora", "true"); err != nil {
			return err
		}
		// torchao's NF4 base beside norms and embeddings left in the model's dtype: no peft preparation
		if err := b.set("model._component_", "kbit-prep", "false"); err != nil {
			return err
		}
	}
	return nil
}

// torchtuneOptimizers are the optimizer components of torchtune's recipes.
var torchtuneOptimizers = map[string]string{
	"torch.optim.AdamW": "adamw", "torch.optim.Adam": "adam", "torch.optim.SGD": "sgd",
	"bitsandbytes.optim.AdamW8bit": "adamw8bit", "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw8bit",
	"bitsandbytes.optim.PagedAdamW": "paged-adamw", "bitsandbytes.optim.PagedAdamW32bit": "paged-adamw",
}

func (b *builder) torchtuneOptimizer() error {
	component, err := b.str("optimizer._component_")
	if err != nil || component == "" {
		return err
	}
	o, ok := torchtuneOptimizers[component]
	if !ok {
		b.ignore("optimizer._component_", "optimizer "+component+" is "+notModelled+": the configuration's optimizer stands")
	} else if err := b.set("optimizer._component_", "optimizer", o); err != nil {
		return err
	}
	if momentum, ok, err := b.number("optimizer.momentum"); err != nil {
		return err
	} else if ok && momentum > 0 && o == "sgd" {
		if err := b.set("optimizer.momentum", "optimizer", "momentum"); err != nil {
			return err
		}
	}
	if fused, ok, err := b.boolean("optimizer.fused"); err != nil {
		return err
	} else if ok && fused {
		if err := b.set("optimizer.fused", "optimizer-impl", "fused"); err != nil {
			return err
		}
	}
	if foreach, ok, err := b.boolean("optimizer.foreach"); err != nil {
		return err
	} else if ok && !foreach {
		if err := b.set("optimizer.foreach", "optimizer-impl", "for-loop"); err != nil {
			return err
		}
	}
	if err := b.scalar("optimizer.lr", "lr"); err != nil {
		return err
	}
	if err := b.scalar("optimizer.weight_decay", "weight-decay"); err != nil {
		return err
	}
	if inBwd, ok, err := b.boolean("optimizer_in_bwd"); err != nil {
		return err
	} else if ok {
		return b.set("optimizer_in_bwd", "optimizer-in-backward", fmt.Sprint(inBwd))
	}
	return nil
}

// torchtunePrecision: torchtune loads the model in dtype and trains it so, without autocast.
func (b *builder) torchtunePrecision() error {
	dtype, err := b.str("dtype")
	if err != nil {
		return err
	}
	weights := map[string]string{"bf16": "bf16", "fp32": "f32", "fp16": "fp16", "": "f32"}[dtype] // get_dtype(None) is float32
	if weights == "" {
		return fmt.Errorf("dtype %q: want bf16, fp32 or fp16", dtype)
	}
	if err := b.set("dtype", "weights", weights); err != nil {
		return err
	}
	if err := b.set("dtype", "amp", "off"); err != nil {
		return err
	}
	return b.adapterDType("dtype") // LoRA's parameters are made in the model's dtype
}

// torchtuneActivations reads enable_activation_checkpointing (every layer, non-reentrant; ac_mode and
// ac_option in the distributed recipes: selective every N-th layer) and enable_activation_offloading.
func (b *builder) torchtuneActivations() error {
	ckpt, _, err := b.boolean("enable_activation_checkpointing")
	if err != nil {
		return err
	}
	setting := "off"
	if ckpt {
		setting = "all"
	}
	mode, err := b.str("ac_mode")
	if err != nil {
		return err
	}
	switch mode {
	case "full":
		setting = "all"
	case "selective":
		n, ok, err := b.integer("ac_option")
		if err != nil || !ok || n < 1 {
			return fmt.Errorf("ac_option: want a positive integer for ac_mode selective")
		}
		setting = "every:" + itoa(n)
		b.ignore("ac_option", "torchtune checkpoints layers N-1, 2N-1, ... (its wrapper counts from 1); "+
			"every:N takes layers 0, N, ...: the same number when N divides the layers")
	}
	if err := b.set("enable_activation_checkpointing", "checkpoint", setting); err != nil {
		return err
	}
	b.used["ac_mode"] = true
	offload, _, err := b.boolean("enable_activation_offloading")
	if err != nil {
		return err
	}
	streams, ok, err := b.boolean("activation_offloading_use_streams")
	if err != nil {
		return err
	}
	b.used["activation_offloading_use_streams"] = true
	switch {
	case offload && ok && !streams:
		return b.set("enable_activation_offloading", "offload", "activations:sync")
	case offload:
		return b.set("enable_activation_offloading", "offload", "activations")
	}
	b.used["enable_activation_offloading"] = true
	return nil
}

// torchtuneLoss: CEWithChunkedOutputLoss and LinearCrossEntropyLoss never hold the whole logits in float32
// (num_output_chunks, 8 by default), Liger's fused loss never makes them.
func (b *builder) torchtuneLoss() error {
	component, err := b.str("loss._component_")
	if err != nil {
		return err
	}
	chunks, ok, err := b.integer("loss.num_output_chunks")
	if err != nil {
		return err
	}
	if !ok {
		chunks = 8
	} else if chunks < 1 {
		return fmt.Errorf("loss.num_output_chunks: want a positive integer, not %d", chunks)
	}
	b.used["loss.num_output_chunks"] = true
	name := component[strings.LastIndex(component, ".")+1:]
	var loss string
	switch name {
	case "", "CrossEntropyLoss":
		b.used["loss._component_"] = true
		return nil
	case "CEWithChunkedOutputLoss":
		// the output layer makes num_output_chunks chunks of the sequence; chunked:T takes T tokens a chunk
		t := (b.cfg.Seq + chunks - 1) / chunks
		loss = "chunked:" + itoa(t)
		b.ignore("loss.num_output_chunks", itoa(chunks)+" chunks of --seq "+itoa(b.cfg.Seq)+" are chunked:"+itoa(t)+
			": another --seq keeps "+itoa(t)+" tokens a chunk, not "+itoa(chunks)+" chunks")
	case "LinearCrossEntropyLoss":
		loss = "linear-ce:" + itoa(chunks)
	case "LigerLinearCrossEntropyLoss", "LigerFusedCrossEntropyLoss":
		loss = "fused-linear-ce"
	default:
		b.ignore("loss._component_", "the loss "+component+" is "+notModelled+"; the full logits and HF's loss are taken")
		return nil
	}
	if b.cfg.AdaptsLMHead() {
		b.ignore("loss._component_", "--loss "+loss+" with LoRA on the output projection is "+notModelled+
			"; the full logits and HF's loss are taken")
		return nil
	}
	return b.set("loss._component_", "loss", loss)
}
