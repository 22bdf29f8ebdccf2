package frameworks

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestStackSettingsMapToTheirFlags holds the settings of the stacks people train on, written here as the
// frameworks' documentation spells them, to the flags that model them: torchtune's losses (the chunk count
// of CEWithChunkedOutputLoss turned into tokens a chunk at the recipe's length), LoRA on the output layer
// and the losses it rules out, LoRA's dtype, LitGPT's double quantization, Liger's fused loss in axolotl and
// HF Trainer, and a BitsAndBytesConfig's double quantization and storage.
func TestStackSettingsMapToTheirFlags(t *testing.T) {
	const tt = "model:\n  _component_: torchtune.models.llama3_2.lora_llama3_2_1b\n  lora_attn_modules: [q_proj, v_proj]\n  lora_rank: 8\n"
	tests := map[string]struct {
		content       string
		flags, absent []string
		ignored       []string
	}{
		"torchtune CEWithChunkedOutputLoss": {
			content: tt + "tokenizer:\n  max_seq_len: 2048\nloss:\n  _component_: torchtune.modules.loss.CEWithChunkedOutputLoss\n  num_output_chunks: 4\ndtype: bf16\n",
			flags:   []string{"--seq 2048", "--loss chunked:512", "--lora-dtype bf16"},
			ignored: []string{"loss.num_output_chunks"},
		},
		"torchtune LinearCrossEntropyLoss, 16 chunks": {
			content: tt + "loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\n  num_output_chunks: 16\ndtype: fp32\n",
			flags:   []string{"--loss linear-ce:16", "--lora-dtype f32"},
		},
		"torchtune LoRA on the output rules the chunked loss out": {
			content: strings.NewReplacer("lora_rank: 8\n", "lora_rank: 8\n  apply_lora_to_output: true\n",
				"llama3_2.lora_llama3_2_1b", "llama3_1.lora_llama3_1_8b").Replace(tt) + // 3.2 1B ties lm_head
				"loss:\n  _component_: torchtune.modules.loss.LinearCrossEntropyLoss\ndtype: bf16\n",
			flags:   []string{"--lora-targets q,v,lm_head"},
			absent:  []string{"--loss"},
			ignored: []string{"loss._component_"},
		},
		"torchtune Liger": {
			content: tt + "loss:\n  _component_: torchtune.modules.loss.LigerLinearCrossEntropyLoss\ndtype: bf16\n",
			flags:   []string{"--loss fused-linear-ce"},
		},
		"torchtune fp16 adapters": {
			content: tt + "dtype: fp16\n",
			absent:  []string{"--lora-dtype"},
			ignored: []string{"dtype"},
		},
		"litgpt nf4-dq": {
			content: "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\nquantize: bnb.nf4-dq\nlora_r: 8\nlora_query: true\n" +
				"train:\n  micro_batch_size: 1\n",
			flags: []string{"--tied=false", "--qlora=true", "--qlora-double-quant=true", "--qlora-half=true", "--qlora-head=true",
				"--kbit-prep=false", "--lora-dtype bf16"},
		},
		"litgpt nf4 with LoRA on lm_head keeps lm_head in 16 bits": {
			content: "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: bf16-true\nquantize: bnb.nf4\nlora_r: 8\nlora_query: true\n" +
				"lora_head: true\ntrain:\n  micro_batch_size: 1\n",
			flags:   []string{"--tied=false", "--qlora=true", "--qlora-half=true", "--lora-targets q,lm_head"},
			absent:  []string{"--qlora-head", "--loss"},
			ignored: []string{"quantize", "(LitGPT's finetune loop)"},
		},
		"litgpt 32-true adapters": {
			content: "checkpoint_dir: checkpoints/meta-llama/Llama-3.2-1B\nprecision: 32-true\nlora_r: 8\nlora_value: true\ntrain:\n  micro_batch_size: 1\n",
			flags:   []string{"--lora-dtype f32"},
		},
		"axolotl Liger": {
			content: "base_model: NousResearch/Llama-3.2-1B\nadapter: lora\nlora_r: 8\nlora_target_linear: true\nbf16: true\n" +
				"liger_fused_linear_cross_entropy: true\nliger_cross_entropy: true\n",
			flags:   []string{"--loss fused-linear-ce"},
			ignored: []string{"liger_cross_entropy"},
		},
		"axolotl QLoRA": {
			content: "base_model: NousResearch/Llama-3.2-1B\nadapter: qlora\nload_in_4bit: true\nlora_r: 8\nlora_target_linear: true\nbf16: true\n",
			flags:   []string{"--qlora=true", "--weights bf16", "--qlora-storage bf16"},
			absent:  []string{"--kbit-prep"},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "config.yaml")
			if err := os.WriteFile(path, []byte(tc.content), 0o644); err != nil {
				t.Fatal(err)
			}
			check(t, path, tc.flags, tc.absent, tc.ignored)
		})
	}
}

// TestBitsAndBytesConfigAndLigerOfTrainingArguments: a config.json's quantization_config and
// use_liger_kernel in the TrainingArguments beside it.
func TestBitsAndBytesConfigAndLigerOfTrainingArguments(t *testing.T) {
	model, err := os.ReadFile("../../nn/hfconfig/models/llama-3.1-8b.json")
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(model, &cfg); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		storage string
		flags   []string
	}{
		{"bfloat16", []string{"--qlora-double-quant=false", "--qlora-storage bf16"}},
		{"float32", []string{"--qlora-double-quant=false", "--qlora-storage f32"}},
		{"uint8", []string{"--qlora-double-quant=false"}},
	} {
		t.Run(tc.storage, func(t *testing.T) {
			dir := t.TempDir()
			cfg["quantization_config"] = map[string]any{"quant_method": "bitsandbytes", "load_in_4bit": true,
				"bnb_4bit_use_double_quant": false, "bnb_4bit_quant_storage": tc.storage}
			data, _ := json.Marshal(cfg)
			write := func(name, content string) {
				if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			write("config.json", string(data))
			write("adapter_config.json", `{"peft_type": "LORA", "r": 16, "lora_alpha": 32, "target_modules": ["q_proj", "v_proj"]}`)
			write("training_args.json", `{"per_device_train_batch_size": 1, "bf16": true, "use_liger_kernel": true}`)
			absent := []string{"--qlora-storage"}
			if tc.storage != "uint8" {
				absent = nil
			}
			check(t, filepath.Join(dir, "training_args.json"), append(tc.flags, "--qlora=true", "--loss fused-linear-ce"), absent,
				[]string{"use_liger_kernel (RoPE, RMSNorm, SwiGLU)"})
		})
	}
}

// check reads the file at path and holds its mapping to flags it must have, flags it must not, and the
// fields it ignores for a reason other than not changing memory; the mapped configuration must run.
func check(t *testing.T, path string, flags, absent, ignored []string) {
	t.Helper()
	m, err := ReadFile(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	line := " " + strings.Join(m.Flags, " ") + " "
	for _, f := range flags {
		if !strings.Contains(line, " "+f+" ") {
			t.Errorf("flags %s\nlack %s", line, f)
		}
	}
	for _, f := range absent {
		if strings.Contains(line, " "+f) {
			t.Errorf("flags %s\nhave %s", line, f)
		}
	}
	var got []string
	for _, i := range m.Ignored {
		if i.Reason != noMemory {
			got = append(got, i.Field)
		}
	}
	for _, f := range ignored {
		if !slices.Contains(got, f) {
			t.Errorf("ignored %q, want %s among them", got, f)
		}
	}
	if err := m.Config.Validate(); err != nil {
		t.Errorf("the mapped configuration does not run: %v", err)
	}
}
