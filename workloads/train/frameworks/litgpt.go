package frameworks

import (
	"fmt"
	"path"
	"strings"
)

// litgpt reads a LitGPT finetune config (config_hub/finetune/<model>/{full,lora,qlora}.yaml, for litgpt
// finetune_full and finetune_lora): the checkpoint directory's model, precision, quantize, LoRA's settings,
// train.micro_batch_size and global_batch_size (their ratio over the devices is the accumulation),
// train.max_seq_length and the optimizer. LitGPT attends with sdpa and runs lm_head and the loss 128 tokens
// at a time.
func (b *builder) litgpt() error {
	b.fw = LitGPT
	dir, err := b.str("checkpoint_dir")
	if err != nil {
		return err
	}
	if err := b.useModel("checkpoint_dir", path.Base(strings.TrimRight(dir, "/"))); err != nil {
		return err
	}
	if err := b.set("checkpoint_dir", "attention", "flash"); err != nil { // LitGPT's attention is sdpa
		return err
	}
	// LitGPT's GPT ties no weights: convert_hf_checkpoint copies a tied model's embeddings into lm_head.weight
	if b.cfg.Tied {
		if err := b.set("checkpoint_dir", "tied", "false"); err != nil {
			return err
		}
	}
	b.ignore("checkpoint_dir (LitGPT's model)", "LitGPT builds its own GPT class (litgpt/model.py, a fused qkv "+
		"projection); the model here is Hugging Face's modules of the same shape")
	if err := b.litgptPrecision(); err != nil {
		return err
	}
	if has(b.doc, "lora_r") {
		if err := b.litgptLoRA(); err != nil {
			return err
		}
	}
	devices, ok, err := b.integer("devices")
	if err != nil {
		return err
	}
	if !ok {
		devices = 1
	}
	if devices > 1 {
		b.ignore("devices", fmt.Sprintf("LitGPT shards the model with FSDP over %d devices: one device training it all is modelled (--gpus and --dp give a sharded run)", devices))
	} else {
		b.used["devices"] = true
	}
	if err := b.count("train.micro_batch_size", "batch"); err != nil {
		return err
	}
	if global, ok, err := b.integer("train.global_batch_size"); err != nil {
		return err
	} else if ok {
		micro, _, _ := b.integer("train.micro_batch_size")
		if micro < 1 || global%(micro*devices) != 0 {
			return fmt.Errorf("train.global_batch_size %d is not a multiple of micro_batch_size x devices", global)
		}
		if err := b.set("train.global_batch_size", "accum", itoa(global/(micro*devices))); err != nil {
			return err
		}
	}
	if err := b.seqLength("train.max_seq_length"); err != nil {
		return err
	}
	b.ignore("data", datasetLength)
	if err := b.clipping("train.max_norm"); err != nil {
		return err
	}
	if err := b.litgptOptimizer(); err != nil {
		return err
	}
	// the finetune loop makes the logits and the loss 128 tokens at a time (lm_head_chunk_size=128,
	// chunked_cross_entropy), Fabric's convert_output turning the chunks to float32, which the loop's
	// logits holds until the next forward
	if b.cfg.AdaptsLMHead() {
		b.ignore("(LitGPT's finetune loop)", "--loss litgpt-chunked:128 with LoRA on lm_head is "+notModelled+"; the full logits are taken")
	} else if err := b.set("(LitGPT's finetune loop)", "loss", "litgpt-chunked:128"); err != nil {
		return err
	}
	b.rest()
	return nil
}

// litgptPrecision maps Lightning's precision: -true is the whole model in the dtype, -mixed is float32
// weights under autocast.
func (b *builder) litgptPrecision() error {
	p, err := b.str("precision")
	if err != nil {
		return err
	}
	settings := map[string][2]string{"bf16-true": {"bf16", "off"}, "bf16-mixed": {"f32", "bf16"},
		"16-true": {"fp16", "off"}, "16-mixed": {"f32", "fp16"}, "32-true": {"f32", "off"}}
	s, ok := settings[p]
	if !ok {
		if p == "" {
			return nil // LitGPT picks bf16-true where the GPU has it: the preset's weights stand
		}
		return fmt.Errorf("precision %q: want bf16-true, bf16-mixed, 16-true, 16-mixed or 32-true", p)
	}
	if err := b.set("precision", "weights", s[0]); err != nil {
		return err
	}
	return b.set("precision", "amp", s[1])
}

// litgptLoRA reads lora_r, lora_alpha, lora_dropout, the lora_query/key/value/projection/mlp/head switches
// and quantize (bnb.nf4 and bnb.fp4 store the base in 4 bits; -dq adds double quantization).
func (b *builder) litgptLoRA() error {
	for _, s := range []struct{ field, flag string }{{"lora_r", "lora"}} {
		if err := b.count(s.field, s.flag); err != nil {
			return err
		}
	}
	if err := b.scalar("lora_alpha", "lora-alpha"); err != nil {
		return err
	}
	if err := b.scalar("lora_dropout", "lora-dropout"); err != nil {
		return err
	}
	var modules []string
	for _, s := range []struct {
		field   string
		modules []string
	}{{"lora_query", []string{"q_proj"}}, {"lora_key", []string{"k_proj"}}, {"lora_value", []string{"v_proj"}},
		{"lora_projection", []string{"o_proj"}}, {"lora_mlp", []string{"gate_proj", "up_proj", "down_proj"}},
		{"lora_head", []string{"lm_head"}}} {
		on, _, err := b.boolean(s.field)
		if err != nil {
			return err
		}
		b.used[s.field] = true
		if on {
			modules = append(modules, s.modules...)
		}
	}
	if err := b.loraTargets("lora_*", modules); err != nil {
		return err
	}
	if err := b.adapterDType("precision"); err != nil { // LitGPT makes LoRA's parameters in the model's dtype
		return err
	}
	q, err := b.str("quantize")
	if err != nil || q == "" {
		return err
	}
	switch q {
	case "bnb.nf4-dq", "bnb.fp4-dq", "bnb.nf4", "bnb.fp4":
		if err := b.set("quantize", "qlora", "true"); err != nil {
			return err
		}
		// bnb.nf4 keeps a float32 absmax per 64 values; -dq quantizes them again
		if err := b.set("quantize", "qlora-double-quant", fmt.Sprint(strings.HasSuffix(q, "-dq"))); err != nil {
			return err
		}
		// Lightning's BitsandbytesPrecision replaces every nn.Linear made under fabric.init_module, lm_head's
		// included, quantizing a float16 copy of each weight (_quantize_weight: .to(dtype=torch.half)); the
		// norms and the embeddings stay in the precision's dtype: no peft preparation
		if err := b.set("quantize", "qlora-half", "true"); err != nil {
			return err
		}
		if b.cfg.AdaptsLMHead() {
			b.ignore("quantize", "lm_head is taken in the precision's dtype: LoRA on a 4-bit lm_head is "+notModelled)
		} else if err := b.set("quantize", "qlora-head", "true"); err != nil {
			return err
		}
		return b.set("quantize", "kbit-prep", "false")
	}
	b.ignore("quantize", q+" is "+notModelled+": the base is taken in the precision's dtype")
	return nil
}

// litgptOptimizers are the optimizers of LitGPT's configs (a class path, or a torch.optim class name).
var litgptOptimizers = map[string]string{
	"torch.optim.AdamW": "adamw", "AdamW": "adamw", "torch.optim.Adam": "adam", "Adam": "adam",
	"torch.optim.SGD": "sgd", "SGD": "sgd", "bitsandbytes.optim.PagedAdamW": "paged-adamw",
	"bitsandbytes.optim.AdamW8bit": "adamw8bit", "bitsandbytes.optim.PagedAdamW8bit": "paged-adamw8bit",
}

func (b *builder) litgptOptimizer() error {
	name, err := b.str("optimizer.class_path")
	if err != nil {
		return err
	}
	field := "optimizer.class_path"
	if name == "" {
		if name, err = b.str("optimizer"); err != nil {
			return nil // a mapping without class_path: LitGPT's default, AdamW
		}
		field = "optimizer"
	}
	if name == "" {
		return nil
	}
	o, ok := litgptOptimizers[name]
	if !ok {
		b.ignore(field, "optimizer "+name+" is "+notModelled+": the configuration's optimizer stands")
	} else if err := b.set(field, "optimizer", o); err != nil {
		return err
	}
	if err := b.scalar("optimizer.init_args.lr", "lr"); err != nil {
		return err
	}
	return b.scalar("optimizer.init_args.weight_decay", "weight-decay")
}
