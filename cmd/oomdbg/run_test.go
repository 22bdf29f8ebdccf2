package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

func TestRunCommand(t *testing.T) {
	dir := t.TempDir()
	falcon := filepath.Join(dir, "falcon.json")
	broken := filepath.Join(dir, "broken.json")
	os.WriteFile(falcon, []byte(`{"architectures": ["FalconForCausalLM"], "hidden_size": 4096}`), 0o644)
	moe := filepath.Join(dir, "moe.json")
	os.WriteFile(moe, []byte(`{"architectures": ["MixtralForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
		"max_position_embeddings": 32, "num_local_experts": 8}`), 0o644)
	loads := filepath.Join(dir, "loads.txt")
	os.WriteFile(loads, []byte("8 1 1 1 1 1 1 1\n"), 0o644)
	os.WriteFile(broken, []byte(`{"architectures": ["LlamaForCausalLM"], "num_hidden_layers": -3`), 0o644)
	smollm := filepath.Join("..", "..", "workloads", "nn", "hfconfig", "models", "smollm2-135m.json")
	freeze, freezeURL := filepath.Join(dir, "freeze.txt"), filepath.Join(dir, "freeze-url.txt")
	os.WriteFile(freeze, []byte("accelerate==0.33.0\nbitsandbytes==0.42.0\ntorch==2.3.1+cu121\ntransformers==4.43.3\n"), 0o644)
	os.WriteFile(freezeURL, []byte("# pip freeze\ntorch @ https://download.pytorch.org/whl/torch.whl\n"), 0o644)
	llama := []string{"--model", "llama", "--d-model", "64", "--heads", "4", "--kv-heads", "2", "--layers", "2",
		"--vocab", "100", "--ffn", "96", "--seq", "32", "--batch", "2", "--steps", "2"}
	tests := map[string]struct {
		args   []string
		code   int
		stdout []string // substrings
		stderr string   // substring
	}{
		"fits": {args: []string{"--steps", "3"}, code: exitOK,
			stdout: []string{"steps      3 of 3", "peak       ", "optimizer"}},
		"oom in setup": {args: []string{"--hidden", "8192", "--layers", "6", "--in-features", "4096", "--gpu-mem", "1GiB"}, code: exitProblem,
			stdout: []string{"OOM in iteration -1, setup, allocating f32[8192,8192] net.4.weight:", "CUDA out of memory. Tried to allocate 256.00 MiB."},
			stderr: "out of memory in iteration -1, setup"},
		"leak bug": {args: []string{"--bug", "retain-graph", "--steps", "4"}, code: exitProblem, stdout: []string{"steps      4 of 4", "\nleak       leak: "},
			stderr: "leak_bug.oomdbg leaks: allocated memory grows"},
		"bad size": {args: []string{"--gpu-mem", "lots"}, code: exitUsage, stderr: `invalid size "lots"`},
		"bad bug":  {args: []string{"--bug", "nope"}, code: exitUsage, stderr: `unknown bug "nope"`},
		"bad conf": {args: []string{"--alloc-conf", "max_split_size_mb:1"}, code: exitUsage, stderr: "alloc conf:"},
		"hf config": {args: []string{"--hf-config", smollm, "--batch", "1", "--seq", "64", "--steps", "2"}, code: exitOK,
			stdout: []string{"model      llama (LlamaForCausalLM) [bf16 weights], 134.5M parameters", "steps      2 of 2"}},
		"hf config, qlora, paged": {args: []string{"--hf-config", smollm, "--batch", "1", "--seq", "64", "--steps", "2",
			"--lora", "128", "--lora-targets", "q,k,v,o,gate,up,down", "--qlora", "--optimizer", "paged-adamw8bit"}, code: exitOK,
			stdout: []string{"[QLoRA r=128, bf16 weights]", "trainable, ", "paged      "}}, // B of gate and up: 1536 x 128 > 1e5 elements
		"unknown architecture": {args: []string{"--hf-config", falcon}, code: exitUsage,
			stderr: `unknown architecture "FalconForCausalLM" (known: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, MixtralForCausalLM`},
		"mixture of experts, skewed": {args: []string{"--hf-config", moe, "--batch", "2", "--steps", "2", "--routing", "skewed:2"}, code: exitOK,
			stdout: []string{"model      llama (MixtralForCausalLM)", "experts    routing skewed:2: the busiest expert took "}},
		"mixture of experts, loads": {args: []string{"--hf-config", moe, "--batch", "2", "--steps", "2", "--routing", "file:" + loads}, code: exitOK,
			stdout: []string{"experts    routing file:" + loads}},
		"routing of 8 on a dense model": {args: append(slices.Clone(llama), "--routing", "file:"+loads), code: exitUsage,
			stderr: "routing applies to a mixture of experts"},
		"bad routing":       {args: []string{"--hf-config", moe, "--routing", "zipf"}, code: exitUsage, stderr: `unknown routing "zipf"`},
		"task on a decoder": {args: append(slices.Clone(llama), "--task", "classify"), code: exitUsage, stderr: "task applies to bert"},
		"bert classification": {args: []string{"--preset", "bert-base", "--task", "classify", "--batch", "2", "--seq", "64", "--steps", "2"}, code: exitOK,
			stdout: []string{"model      bert-base, 109.5M parameters"}},
		"broken config":      {args: []string{"--hf-config", broken}, code: exitUsage, stderr: "config.json: not a JSON object"},
		"missing config":     {args: []string{"--hf-config", filepath.Join(dir, "none.json")}, code: exitUsage, stderr: "no such file"},
		"config and preset":  {args: []string{"--hf-config", smollm, "--preset", "tiny"}, code: exitUsage, stderr: "give one"},
		"llama flags, lora":  {args: append(slices.Clone(llama), "--tied", "--lora", "4"), code: exitOK, stdout: []string{"[LoRA r=4, bf16 weights], ", "trainable"}},
		"qlora without lora": {args: append(slices.Clone(llama), "--qlora"), code: exitUsage, stderr: "give --lora R"},
		"litgpt loss, one token": {args: append(slices.Clone(llama), "--loss", "litgpt-chunked:2", "--seq-dist", "uniform:1:1", "--batch", "1"),
			code: exitUsage, stderr: "a batch of 1 token has no next token"},
		"bad lora target":    {args: append(slices.Clone(llama), "--lora", "4", "--lora-targets", "q,embeddings"), code: exitUsage, stderr: `unknown lora target "embeddings"`},
		"unknown library":    {args: append(slices.Clone(llama), "--versions", "jax=0.4.30"), code: exitUsage, stderr: `versions: unknown library "jax"`},
		"bad version":        {args: append(slices.Clone(llama), "--versions", "torch=two"), code: exitUsage, stderr: `versions: torch: version "two"`},
		"freeze with a url":  {args: append(slices.Clone(llama), "--versions-from", freezeURL), code: exitUsage, stderr: "line 2: torch is installed from"},
		"missing freeze":     {args: append(slices.Clone(llama), "--versions-from", filepath.Join(dir, "none.txt")), code: exitUsage, stderr: "no such file"},
		"loss on the gpt":    {args: []string{"--preset", "tiny", "--loss", "chunked:16"}, code: exitUsage, stderr: "apply to the llama model"},
		"kbit without qlora": {args: append(slices.Clone(llama), "--lora", "4", "--kbit-prep"), code: exitUsage, stderr: "it needs --qlora"},
		"qlora as others run it": {args: append(slices.Clone(llama), "--tied=false", "--lora", "4", "--lora-targets", "all-linear,lm_head", "--qlora",
			"--qlora-double-quant=false", "--qlora-storage", "bf16", "--load", "hf", "--versions-from", freeze, "--versions", "bitsandbytes=0.43.1"),
			code: exitOK, stdout: []string{"load ", "[QLoRA r=4"}},
		"fused loss":  {args: append(slices.Clone(llama), "--loss", "fused-linear-ce"), code: exitOK, stdout: []string{"steps      2 of 2"}},
		"linear loss": {args: append(slices.Clone(llama), "--loss", "linear-ce:8"), code: exitOK, stdout: []string{"steps      2 of 2"}},
		"linear loss, empty chunks": {args: append(slices.Clone(llama), "--loss", "linear-ce:16777216"), code: exitUsage,
			stderr: "into empty chunks"},
		"bad kv heads":       {args: append(slices.Clone(llama), "--kv-heads", "3"), code: exitUsage, stderr: "--kv-heads 3: does not divide the 4 heads"},
		"bad optimizer impl": {args: append(slices.Clone(llama), "--optimizer-impl", "magic"), code: exitUsage, stderr: `unknown optimizer implementation "magic"`},
		"lora on the gpt":    {args: []string{"--preset", "tiny", "--lora", "4"}, code: exitUsage, stderr: "apply to the llama model"},
		"compile":            {args: []string{"--preset", "tiny", "--compile"}, code: exitUsage, stderr: "torch.compile is not modelled"},
		"selective checkpoint, offload, step in backward": {args: append(slices.Clone(llama), "--checkpoint", "selective:ops",
			"--offload", "activations", "--optimizer-in-backward", "--amp", "bf16"), code: exitOK,
			stdout: []string{"steps      2 of 2", "(offload activations)"}},
		"bad offload": {args: append(slices.Clone(llama), "--offload", "activations+disk"), code: exitUsage, stderr: `unknown offload "activations+disk"`},
		"step in backward, accumulating": {args: append(slices.Clone(llama), "--optimizer-in-backward", "--accum", "2"), code: exitUsage,
			stderr: "cannot accumulate gradients over --accum 2"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".oomdbg")
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"run", "-o", out}, tc.args...), &stdout, &stderr)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, stderr.String())
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout.String())
				}
			}
			if !strings.Contains(stderr.String(), tc.stderr) || strings.Count(stderr.String(), "\n") > 1 {
				t.Errorf("stderr %q, want one line containing %q", stderr.String(), tc.stderr)
			}
			if tc.code == exitUsage {
				return
			}
			s, err := snapshot.ReadFile(out)
			if err != nil || s.Footer == nil || s.Warning != nil {
				t.Fatalf("snapshot %s: %v (footer %v, warning %v)", out, err, s.Footer != nil, s.Warning)
			}
			if s.Meta.Source != "oomdbg" || len(s.Meta.Workload) == 0 {
				t.Errorf("metadata %+v lacks the workload", s.Meta)
			}
		})
	}
}

// TestRunHostMemory runs the cpu device, whose tensors live in host memory: a model that would not fit
// --max-memory is refused before anything is allocated, and one that fits says what it will take, which is
// the peak the same run reaches on the meta device.
func TestRunHostMemory(t *testing.T) {
	dir := t.TempDir()
	metaPeak := func(preset string) string {
		_, out, _ := runCmd("run", "--device", "meta", "--preset", preset, "--steps", "2", "-o", filepath.Join(dir, "meta.oomdbg"))
		m := regexp.MustCompile(`peak       (\S+ \S+) allocated`).FindStringSubmatch(out)
		if m == nil {
			t.Fatalf("no peak in the meta run's summary:\n%s", out)
		}
		return m[1]
	}
	big := filepath.Join(dir, "big.oomdbg")
	code, _, stderr := runCmd("run", "--device", "cpu", "--preset", "gpt2-small", "--steps", "2", "--max-memory", "1GiB", "-o", big)
	want := "oomdbg: the cpu device would hold about " + metaPeak("gpt2-small") + " of tensors in host memory"
	if code != exitUsage || !strings.HasPrefix(stderr, want) || strings.Count(stderr, "\n") != 1 {
		t.Errorf("gpt2-small on the cpu device in 1 GiB: exit %d, %q; want 2, %q", code, stderr, want)
	}
	if _, err := os.Stat(big); err == nil {
		t.Errorf("the refused run left a snapshot")
	}
	code, _, stderr = runCmd("run", "--device", "cpu", "--preset", "tiny", "--steps", "2", "-o", filepath.Join(dir, "tiny.oomdbg"))
	want = "oomdbg: the cpu device will hold about " + metaPeak("tiny") + " of tensors in host memory"
	if code != exitOK || !strings.HasPrefix(stderr, want) {
		t.Errorf("tiny on the cpu device: exit %d, %q; want 0, %q", code, stderr, want)
	}
}

// TestReportCarriesParameterCounts records SmolLM2-135M from its config.json, fully and under LoRA, and
// checks that the JSON report's source gives its published parameter count (134,515,008) and the
// trainable count: all of them, or the adapters' (rank 8 on q and v of 30 layers: 30 x 8 x (576+576 +
// 576+192) = 460,800, peft's formula).
func TestReportCarriesParameterCounts(t *testing.T) {
	dir := t.TempDir()
	smollm := filepath.Join("..", "..", "workloads", "nn", "hfconfig", "models", "smollm2-135m.json")
	freeze, freezeURL := filepath.Join(dir, "freeze.txt"), filepath.Join(dir, "freeze-url.txt")
	os.WriteFile(freeze, []byte("accelerate==0.33.0\nbitsandbytes==0.42.0\ntorch==2.3.1+cu121\ntransformers==4.43.3\n"), 0o644)
	os.WriteFile(freezeURL, []byte("# pip freeze\ntorch @ https://download.pytorch.org/whl/torch.whl\n"), 0o644)
	for name, tc := range map[string]struct {
		args              []string
		params, trainable int64
	}{
		"full": {nil, 134_515_008, 134_515_008},
		"lora": {[]string{"--lora", "8"}, 134_515_008 + 460_800, 460_800},
	} {
		out := filepath.Join(dir, name+".oomdbg")
		args := append([]string{"run", "-o", out, "--hf-config", smollm, "--batch", "1", "--seq", "16", "--steps", "1"}, tc.args...)
		var stdout, stderr bytes.Buffer
		if code := run(context.Background(), args, &stdout, &stderr); code != exitOK {
			t.Fatalf("%s: exit %d: %s", name, code, stderr.String())
		}
		code, report, errs := runCmd("report", out, "--format", "json", "--measure=false")
		if code != exitOK {
			t.Fatalf("%s: report exit %d: %s", name, code, errs)
		}
		var r struct {
			Source struct {
				Parameters          *int64 `json:"parameters"`
				TrainableParameters *int64 `json:"trainable_parameters"`
			} `json:"source"`
		}
		if err := json.Unmarshal([]byte(report), &r); err != nil {
			t.Fatal(err)
		}
		if r.Source.Parameters == nil || *r.Source.Parameters != tc.params || *r.Source.TrainableParameters != tc.trainable {
			t.Errorf("%s: source.parameters %v, trainable %v; want %d and %d", name, r.Source.Parameters, r.Source.TrainableParameters, tc.params, tc.trainable)
		}
	}
}
