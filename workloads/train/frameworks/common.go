package frameworks

import (
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// The settings more than one framework spells the same way: LoRA's target modules, the optimizers of HF's
// TrainingArguments (which axolotl takes), the sequence length.

// loraModules are the module names the frameworks give LoRA targets, and the projection each is.
var loraModules = map[string]string{
	"q_proj": "q", "k_proj": "k", "v_proj": "v", "o_proj": "o", "gate_proj": "gate", "up_proj": "up", "down_proj": "down",
	"output_proj": "o", "w1": "gate", "w3": "up", "w2": "down", // torchtune's names
	"qkv_proj": "qkv", "gate_up_proj": "gate_up", // Phi-3's fused ones
	"lm_head": "lm_head", "output": "lm_head", "embed_tokens": "embed", // the ends: peft's Linear and Embedding
}

// allLinear is peft's all-linear (and axolotl's lora_target_linear) on a Llama-family model: every linear
// layer of the blocks, lm_head excluded.
const allLinear = "q,k,v,o,gate,up,down"

// loraTargets sets --lora-targets from module names; a name oomdbg does not adapt is ignored with why.
func (b *builder) loraTargets(field string, names []string) error {
	var targets []string
	for _, n := range names {
		if n == "all-linear" {
			targets = append(targets, strings.Split(allLinear, ",")...)
			continue
		}
		if t, ok := loraModules[n]; ok {
			targets = append(targets, t)
			continue
		}
		b.ignore(field+": "+n, "LoRA on "+n+" is "+notModelled)
	}
	if len(targets) == 0 {
		return nil
	}
	lt, err := train.ParseLoRATargets(strings.Join(dedupe(targets), ","))
	if err != nil {
		return err
	}
	return b.set(field, "lora-targets", lt.String())
}

func dedupe(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// hfOptimizers are TrainingArguments' optim names (axolotl's optimizer too) and oomdbg's optimizer and
// implementation for each.
var hfOptimizers = map[string][2]string{
	"adamw_torch":       {"adamw", "foreach"},
	"adamw_torch_fused": {"adamw", "fused"},
	"adamw_hf":          {"adamw", "for-loop"}, // transformers' own AdamW: a loop over parameters
	"adamw_bnb_8bit":    {"adamw8bit", ""},
	"adamw_8bit":        {"adamw8bit", ""},
	"paged_adamw_8bit":  {"paged-adamw8bit", ""},
	"paged_adamw_32bit": {"paged-adamw", ""},
	"paged_adamw":       {"paged-adamw", ""},
	"sgd":               {"sgd", ""},
}

// hfOptimizer sets the optimizer TrainingArguments names.
func (b *builder) hfOptimizer(field, name string) error {
	o, ok := hfOptimizers[name]
	if !ok {
		b.ignore(field, "optimizer "+name+" is "+notModelled+": the configuration's optimizer stands")
		return nil
	}
	if err := b.set(field, "optimizer", o[0]); err != nil {
		return err
	}
	if o[1] != "" {
		return b.set(field, "optimizer-impl", o[1])
	}
	return nil
}

// seqLength sets --seq from field, or says why the model's stands.
func (b *builder) seqLength(field string) error {
	n, ok, err := b.integer(field)
	switch {
	case err != nil:
		return err
	case !ok:
		b.ignore(field, "no limit is given: the samples are as long as the dataset's; the model's --seq "+itoa(b.cfg.Seq)+" stands")
		return nil
	}
	return b.set(field, "seq", itoa(n))
}

// scalar sets flag from a number field, when present.
func (b *builder) scalar(field, flag string) error {
	f, ok, err := b.number(field)
	if err != nil || !ok {
		return err
	}
	return b.set(field, flag, formatFloat(f))
}

// count sets flag from an integer field, when present.
func (b *builder) count(field, flag string) error {
	n, ok, err := b.integer(field)
	if err != nil || !ok {
		return err
	}
	return b.set(field, flag, itoa(n))
}

// adapterDType sets --lora-dtype to the weights' dtype, for a trainer that makes LoRA's parameters in the
// model's dtype (torchtune, LitGPT) where peft makes them float32.
func (b *builder) adapterDType(field string) error {
	if b.cfg.LoRA == 0 {
		return nil
	}
	switch w := b.cfg.Weights.String(); w {
	case "bf16", "f32":
		return b.set(field, "lora-dtype", w)
	default:
		b.ignore(field, "LoRA's parameters in the model's "+w+": --lora-dtype takes f32 or bf16; they are float32 here")
		return nil
	}
}

// clipping records a gradient-norm clipping setting: its temporaries (a norm a parameter) are not
// modelled.
func (b *builder) clipping(field string) error {
	f, ok, err := b.number(field)
	if err != nil {
		return err
	}
	if ok && f > 0 {
		b.ignore(field, "gradient clipping's norms, one small tensor a parameter, are "+notModelled)
	} else {
		b.used[field] = true
	}
	return nil
}

// compile records a torch.compile setting.
func (b *builder) compile(field string) error {
	on, _, err := b.boolean(field)
	if err != nil {
		return err
	}
	if on {
		b.ignore(field, compileReason)
	} else {
		b.used[field] = true
	}
	return nil
}

func itoa(n int) string { return strconv.Itoa(n) }
