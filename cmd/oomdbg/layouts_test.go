package main

import (
	"strings"
	"testing"
)

func TestLayoutsBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"layouts", "--gpus", "12", "--nodes", "8"}, // GPUs not divisible by nodes
		{"layouts", "--gpus", "0"},
		{"layouts", "--nodes", "16", "--gpus", "8"},
		{"layouts", "--batch", "0"},
		{"layouts", "--micro-batch", "-1"},
		{"layouts", "--preset", "gpt-9"},
		{"layouts", "--preset", "bert-base"},
		{"layouts", "--preset", "mixtral-8x7b"},
		{"layouts", "--hf-config", "/nonexistent/config.json"},
		{"layouts", "--gpu", "v100x"},
		{"layouts", "--gpu-mem", "lots"},
		{"layouts", "--gpu-mem", "256MiB"},
		{"layouts", "--margin", "100"},
		{"layouts", "--plans", "0"},
		{"layouts", "--seq", "-4"},
		{"layouts", "extra"},
	} {
		code, stdout, stderr := runCmd(args...)
		if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("oomdbg %s: exit %d, stdout %q, stderr %q: want exit 2 and one line", strings.Join(args, " "), code, stdout, stderr)
		}
	}
}

// TestLayoutsNoneFits: a 70B model on one 24 GiB card has no layout; the command says so and exits 1.
func TestLayoutsNoneFits(t *testing.T) {
	code, stdout, stderr := runCmd("layouts", "--preset", "llama-2-70b", "--gpus", "1", "--gpu-mem", "24GiB", "--batch", "8")
	if code != exitProblem || !strings.Contains(stdout, "none fits") || strings.Count(stderr, "\n") != 1 {
		t.Errorf("exit %d, stdout %q, stderr %q: want exit 1, none fits, one line", code, stdout, stderr)
	}
}

// TestLayoutsJSON: the JSON lists as many plans as asked, the fastest first.
func TestLayoutsJSON(t *testing.T) {
	code, stdout, stderr := runCmd("layouts", "--preset", "llama-3.1-8b", "--gpus", "8", "--gpu", "h100", "--batch", "64", "--plans", "3", "--json")
	if code != exitOK || stderr != "" || strings.Count(stdout, `"step_s"`) != 3 {
		t.Errorf("exit %d, stderr %q, stdout %q: want 3 plans", code, stderr, stdout)
	}
}

// TestLayoutsHFConfig: a config.json gives the same search as the preset made from it.
func TestLayoutsHFConfig(t *testing.T) {
	args := []string{"layouts", "--gpus", "16", "--nodes", "2", "--gpu", "h100", "--batch", "64", "--json"}
	code1, out1, err1 := runCmd(append(args, "--preset", "llama-2-7b")...)
	code2, out2, err2 := runCmd(append(args, "--hf-config", "../../workloads/nn/hfconfig/models/llama-2-7b.json")...)
	out1 = strings.Replace(out1, `"model": "llama-2-7b"`, "", 1)
	out2 = strings.Replace(out2, `"model": "../../workloads/nn/hfconfig/models/llama-2-7b.json"`, "", 1)
	if code1 != exitOK || code2 != exitOK || err1 != "" || err2 != "" || out1 != out2 {
		t.Errorf("--preset: exit %d %q; --hf-config: exit %d %q; outputs equal: %v", code1, err1, code2, err2, out1 == out2)
	}
}
