package frameworks

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestFrozenConfigsMapToTheirFlags holds the mapping of each frozen framework configuration (testdata,
// sources in testdata/README.md) to the flags read off the file by hand: the model's preset or config.json,
// then each setting that changes memory; and to the fields left out for a reason other than not changing
// memory. Each mapped configuration must be one oomdbg runs.
func TestFrozenConfigsMapToTheirFlags(t *testing.T) {
	tests := map[string]struct {
		framework Framework
		flags     string
		ignored   []string
	}{
		"torchtune/llama3_1_8B_qlora_single_device.yaml": {Torchtune,
			"--preset llama-3.1-8b --attention flash --lora 8 --lora-alpha 16 --lora-dropout 0 --lora-targets q,v,o,gate,up,down " +
				"--qlora=true --kbit-prep=false --batch 2 --accum 8 --optimizer adamw --optimizer-impl fused --lr 0.0003 --weight-decay 0.01 " +
				"--weights bf16 --amp off --lora-dtype bf16 --checkpoint all --loss linear-ce:8",
			[]string{"tokenizer.max_seq_len", "dataset.packed"}},
		"torchtune/llama3_1_8B_lora_single_device.yaml": {Torchtune,
			"--preset llama-3.1-8b --attention flash --lora 8 --lora-alpha 16 --lora-dropout 0 --lora-targets q,v,o,gate,up,down " +
				"--batch 2 --accum 8 --optimizer adamw --optimizer-impl fused --lr 0.0003 --weight-decay 0.01 " +
				"--weights bf16 --amp off --lora-dtype bf16 --checkpoint all --loss linear-ce:8",
			[]string{"tokenizer.max_seq_len", "dataset.packed"}},
		"torchtune/llama3_2_1B_full_single_device.yaml": {Torchtune,
			"--preset llama-3.2-1b --attention flash --batch 4 --accum 1 --optimizer paged-adamw8bit --lr 2e-05 " +
				"--optimizer-in-backward=true --weights bf16 --amp off --checkpoint off --loss linear-ce:8",
			[]string{"tokenizer.max_seq_len", "dataset.packed"}},
		"litgpt/llama-3.1-8b_qlora.yaml": {LitGPT,
			"--preset llama-3.1-8b --attention flash --weights bf16 --amp off --lora 32 --lora-alpha 16 --lora-dropout 0.05 " +
				"--lora-targets q,v --lora-dtype bf16 --qlora=true --qlora-double-quant=false --qlora-half=true --qlora-head=true " +
				"--kbit-prep=false --batch 2 --accum 4 " +
				"--seq 512 --optimizer adamw --lr 0.0002 --weight-decay 0 --loss litgpt-chunked:128",
			[]string{"checkpoint_dir (LitGPT's model)", "data"}},
		"litgpt/llama-3.1-8b_lora.yaml": {LitGPT,
			"--preset llama-3.1-8b --attention flash --weights bf16 --amp off --lora 32 --lora-alpha 16 --lora-dropout 0.05 " +
				"--lora-targets q,v --lora-dtype bf16 --batch 1 --accum 8 --seq 512 --optimizer adamw --lr 0.0002 --weight-decay 0 " +
				"--loss litgpt-chunked:128",
			[]string{"checkpoint_dir (LitGPT's model)", "data"}},
		"litgpt/llama-3.2-1B_full.yaml": {LitGPT,
			"--preset llama-3.2-1b --attention flash --tied=false --weights bf16 --amp off --batch 4 --accum 16 --seq 512 --optimizer adamw " +
				"--lr 0.0002 --weight-decay 0.1 --loss litgpt-chunked:128",
			[]string{"checkpoint_dir (LitGPT's model)", "data"}},
		"axolotl/llama-3_qlora-1b.yml": {Axolotl,
			"--preset llama-3.2-1b --lora 32 --lora-alpha 16 --lora-dropout 0.05 --lora-targets q,k,v,o,gate,up,down --qlora=true " +
				"--seq 2048 --batch 2 --accum 4 --optimizer adamw8bit --lr 0.0002 --weight-decay 0 --weights bf16 --amp bf16 " +
				"--qlora-storage bf16 --checkpoint all --attention flash",
			nil},
		"axolotl/llama-3_lora-8b.yml": {Axolotl,
			"--preset llama-3.1-8b --lora 32 --lora-alpha 16 --lora-dropout 0.05 --lora-targets q,k,v,o,gate,up,down " +
				"--seq 4096 --batch 2 --accum 4 --optimizer adamw8bit --lr 0.0002 --weight-decay 0 --weights bf16 --amp bf16 " +
				"--checkpoint all --attention flash",
			[]string{"base_model", "load_in_8bit", "lora_modules_to_save"}},
		"axolotl/llama-3_fft-8b.yaml": {Axolotl,
			"--preset llama-3.1-8b --seq 8192 --batch 1 --accum 8 --optimizer paged-adamw8bit --lr 2e-05 --weight-decay 0 " +
				"--weights bf16 --amp bf16 --checkpoint all --attention flash",
			[]string{"gradient_checkpointing_kwargs"}},
		"hf-trainer/bert-classifier/training_args.json": {HFTrainer,
			"--hf-config testdata/hf-trainer/bert-classifier/config.json --batch 16 --accum 2 --amp fp16 --optimizer adamw " +
				"--optimizer-impl foreach --lr 2e-05 --weight-decay 0.01 --sort-by-length=false --checkpoint off",
			[]string{"(sequence length)", "max_grad_norm"}},
		"hf-trainer/llama-grpo-lora/training_args.json": {HFTrainer,
			"--hf-config testdata/hf-trainer/llama-grpo-lora/config.json --lora 64 --lora-alpha 64 --lora-dropout 0 " +
				"--lora-targets q,k,v,o,gate,up,down --qlora=true --batch 6 --accum 2 --amp fp16 --optimizer paged-adamw8bit " +
				"--lr 0.0002 --weight-decay 0.1 --sort-by-length=false --checkpoint off",
			[]string{"adapter_config.json: base_model_name_or_path", "(sequence length)", "max_grad_norm", "torch_empty_cache_steps",
				"num_generations, max_completion_length, max_prompt_length, beta, use_vllm, vllm_device, vllm_gpu_memory_utilization, " +
					"vllm_dtype, ds3_gather_for_generation, sync_ref_model, ref_model_mixup_alpha, ref_model_sync_steps, temperature, log_completions"}},
	}
	files, _ := filepath.Glob("testdata/*/*.y*ml")
	more, _ := filepath.Glob("testdata/hf-trainer/*/training_args.json")
	if files = append(files, more...); len(files) != len(tests) {
		t.Errorf("%d frozen configurations, %d expected: a file without its expectation", len(files), len(tests))
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m, err := ReadFile(filepath.Join("testdata", name), nil)
			if err != nil {
				t.Fatal(err)
			}
			if m.Framework != tc.framework {
				t.Errorf("framework %s, want %s", m.Framework, tc.framework)
			}
			if got := strings.Join(m.Flags, " "); got != tc.flags {
				t.Errorf("flags\n  %s\nwant\n  %s", got, tc.flags)
			}
			var ignored []string
			for _, i := range m.Ignored {
				if i.Reason != noMemory {
					ignored = append(ignored, i.Field)
				}
			}
			if !slices.Equal(ignored, tc.ignored) {
				t.Errorf("ignored %q, want %q", ignored, tc.ignored)
			}
			if err := m.Config.Validate(); err != nil {
				t.Errorf("the mapped configuration does not run: %v", err)
			}
		})
	}
}

// TestEveryFieldIsAccountedFor checks that no field of a frozen configuration is dropped silently: each
// top-level key is read into a flag or named among the ignored ones.
func TestEveryFieldIsAccountedFor(t *testing.T) {
	files, _ := filepath.Glob("testdata/*/*.y*ml")
	more, _ := filepath.Glob("testdata/hf-trainer/*/training_args.json")
	for _, f := range append(files, more...) {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		doc, err := decode(data)
		if err != nil {
			t.Fatal(err)
		}
		m, err := ReadFile(f, nil)
		if err != nil {
			t.Fatal(err)
		}
		for k, v := range doc {
			if v == nil {
				continue
			}
			named := false
			for _, i := range m.Ignored {
				for _, field := range strings.Split(i.Field, ", ") {
					if field == k || strings.HasPrefix(field, k+".") || strings.HasPrefix(field, k+" ") || strings.HasPrefix(field, k+":") {
						named = true
					}
				}
			}
			if !named && !mapped(m.Framework, k) {
				t.Errorf("%s: %s is neither mapped nor ignored", f, k)
			}
		}
	}
}

// mapped lists, per framework, the top-level keys its reader turns into flags (or reads as a model).
func mapped(fw Framework, key string) bool {
	keys := map[Framework][]string{
		Torchtune: {"model", "batch_size", "gradient_accumulation_steps", "tokenizer", "dataset", "optimizer", "optimizer_in_bwd",
			"dtype", "enable_activation_checkpointing", "enable_activation_offloading", "loss", "clip_grad_norm", "compile", "low_cpu_ram"},
		LitGPT: {"checkpoint_dir", "precision", "quantize", "devices", "lora_r", "lora_alpha", "lora_dropout", "lora_query", "lora_key",
			"lora_value", "lora_projection", "lora_mlp", "lora_head", "train", "optimizer"},
		Axolotl: {"base_model", "model_type", "tokenizer_type", "load_in_8bit", "load_in_4bit", "adapter", "lora_r", "lora_alpha",
			"lora_dropout", "lora_target_modules", "lora_target_linear", "sequence_len", "sample_packing", "micro_batch_size",
			"gradient_accumulation_steps", "optimizer", "learning_rate", "weight_decay", "bf16", "fp16", "gradient_checkpointing",
			"attn_implementation"},
		HFTrainer: {"per_device_train_batch_size", "gradient_accumulation_steps", "bf16", "fp16", "optim", "learning_rate",
			"weight_decay", "group_by_length", "gradient_checkpointing", "torch_compile", "use_liger_kernel", "fsdp", "deepspeed", "fsdp_config"},
	}
	return slices.Contains(keys[fw], key)
}
