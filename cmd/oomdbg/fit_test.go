package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// runFlagsFit parses args as oomdbg run does, runs the configuration on the meta device with train.Run and
// holds it to docs/fit.md's rule: no OOM, peak reserved within 95% of what the CUDA context leaves.
func runFlagsFit(t *testing.T, args []string) bool {
	t.Helper()
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	flags := addConfigFlags(fs, train.DefaultMLP()).addHFConfig()
	if err := fs.Parse(args); err != nil {
		t.Fatalf("run %s: %v", strings.Join(args, " "), err)
	}
	cfg, err := flags.config()
	if err != nil {
		t.Fatalf("run %s: %v", strings.Join(args, " "), err)
	}
	cfg.Device = device.Meta
	res, _, err := train.Run(context.Background(), cfg, nil)
	if err != nil {
		t.Fatalf("run %s: %v", strings.Join(args, " "), err)
	}
	return res.OOM == nil && float64(res.PeakReserved) <= 0.95*float64(cfg.GPUMemory-cfg.ContextReserve)
}

// TestFitPlansRunAsListed: fit --json's largest batch fits when run and the next does not, and every plan it
// lists fits when its flags are given to run.
func TestFitPlansRunAsListed(t *testing.T) {
	cases := map[string]struct {
		args     []string
		nothing  bool // no batch fits as configured
		noPlans  bool
		workload []string // run flags of the workload as configured
	}{
		"gpt2-medium on 24 GiB": {args: nil, workload: []string{"--preset", "gpt2-medium"}},
		"llama-3.2-1b with LoRA and QLoRA allowed on 16 GiB": {args: []string{"--preset", "llama-3.2-1b", "--gpu-mem", "16GiB", "--allow", "lora,qlora", "--plans", "4"},
			workload: []string{"--preset", "llama-3.2-1b", "--gpu-mem", "16GiB"}},
		"gpt2-small on 4 GPUs of 6 GiB with ZeRO and offload allowed": {args: []string{"--preset", "gpt2-small", "--gpus", "4", "--gpu-mem", "6GiB", "--allow", "zero,offload", "--plans", "3"},
			workload: []string{"--preset", "gpt2-small", "--gpus", "4", "--gpu-mem", "6GiB"}},
		"gpt2-medium on 4 GiB": {args: []string{"--gpu-mem", "4GiB"}, nothing: true, noPlans: true,
			workload: []string{"--preset", "gpt2-medium", "--gpu-mem", "4GiB"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCmd(append([]string{"fit", "--json"}, tc.args...)...)
			if want := map[bool]int{false: exitOK, true: exitProblem}[tc.noPlans]; code != want {
				t.Fatalf("exit %d, want %d (no plan fits: %v): %s", code, want, tc.noPlans, stderr)
			}
			var got struct {
				MaxBatch       *int `json:"max_batch"`
				SimulatedSteps int  `json:"simulated_steps"`
				Plans          []struct {
					Flags         string
					PeakAllocated *int64 `json:"peak_allocated"`
					PeakReserved  *int64 `json:"peak_reserved"`
					Fits          bool
					StepTime      *float64 `json:"step_time_s"`
				}
			}
			if err := json.Unmarshal([]byte(stdout), &got); err != nil {
				t.Fatalf("%v:\n%s", err, stdout)
			}
			if got.MaxBatch == nil || got.SimulatedSteps < 1 {
				t.Fatalf("max_batch %v, simulated_steps %d:\n%s", got.MaxBatch, got.SimulatedSteps, stdout)
			}
			b := *got.MaxBatch
			if tc.nothing != (b == 0) {
				t.Fatalf("max batch %d", b)
			}
			with := func(batch int) []string {
				return append(append([]string{}, tc.workload...), "--batch", itoa(batch), "--steps", "2")
			}
			if b > 0 && !runFlagsFit(t, with(b)) {
				t.Errorf("batch %d does not fit when run", b)
			}
			if runFlagsFit(t, with(b+1)) {
				t.Errorf("batch %d fits when run: %d is not the largest", b+1, b)
			}
			if tc.noPlans != (len(got.Plans) == 0) {
				t.Fatalf("%d plans", len(got.Plans))
			}
			for _, p := range got.Plans {
				if !p.Fits || p.PeakAllocated == nil || p.PeakReserved == nil || p.StepTime == nil || *p.StepTime <= 0 {
					t.Errorf("plan %s: fits %v, peak reserved %v, step time %v", p.Flags, p.Fits, p.PeakReserved, p.StepTime)
				}
				if strings.ContainsAny(p.Flags, `'"`) {
					t.Fatalf("flags need a shell: %s", p.Flags)
				}
				if !runFlagsFit(t, strings.Fields(p.Flags)) {
					t.Errorf("oomdbg run %s: does not fit", p.Flags)
				}
			}
		})
	}
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestFitBadInput: every mistake is one line and exit 2.
func TestFitBadInput(t *testing.T) {
	for _, args := range [][]string{
		{"fit", "--gpu", "v100x"},
		{"fit", "--allow", "lora,magic"},
		{"fit", "--margin", "100"},
		{"fit", "--margin", "-1"},
		{"fit", "--plans", "0"},
		{"fit", "--device", "cpu"},
		{"fit", "--bug", "retain-graph"},
		{"fit", "--gpu-mem", "lots"},
		{"fit", "--batch", "0"},
		{"fit", "--preset", "gpt-9"},
	} {
		code, stdout, stderr := runCmd(args...)
		if code != exitUsage || stdout != "" || strings.Count(stderr, "\n") != 1 {
			t.Errorf("oomdbg %s: exit %d, stdout %q, stderr %q: want exit 2 and one line", strings.Join(args, " "), code, stdout, stderr)
		}
	}
}

// TestREADMEFit: the README's fit table is what the command it names prints.
func TestREADMEFit(t *testing.T) {
	readme, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"fit", "--markdown"}
	if !strings.Contains(string(readme), "`oomdbg "+strings.Join(args, " ")+"`") {
		t.Errorf("the README does not name oomdbg %s", strings.Join(args, " "))
	}
	code, stdout, stderr := runCmd(args...)
	if code != exitOK {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if !strings.Contains(string(readme), stdout) {
		t.Errorf("the README lacks the table of oomdbg %s (regenerate it):\n%s", strings.Join(args, " "), stdout)
	}
}

// TestFitListsModelParallelLayouts: fit of a dense decoder on many GPUs lists, after its simulated plans,
// the fastest Megatron layouts that fit, each a factorisation of the GPUs whose worst rank is within the
// headroom rule; not for one GPU, nor for adapters, which the layouts' formulas do not describe.
func TestFitListsModelParallelLayouts(t *testing.T) {
	const intro = "Model-parallel layouts of the 64 GPUs"
	code, stdout, stderr := runCmd("fit", "--preset", "llama-2-70b", "--gpus", "64", "--nodes", "8", "--gpu-mem", "80GiB")
	if code != exitProblem || !strings.Contains(stderr, "model-parallel layouts fit by the formulas") {
		t.Fatalf("exit %d, want %d with the layouts named: %s", code, exitProblem, stderr)
	}
	_, section, ok := strings.Cut(stdout, intro)
	if !ok {
		t.Fatalf("no layouts section:\n%s", stdout)
	}
	limit := 0.95 * float64(80<<30-device.DefaultContextReserve) // docs/fit.md's rule on the card
	rows := 0
	for _, line := range strings.Split(section, "\n") {
		if !strings.HasPrefix(line, "dp=") {
			continue
		}
		rows++
		cols := regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
		var dp, tp, pp, cp int
		if _, err := fmt.Sscanf(cols[0], "dp=%d tp=%d pp=%d cp=%d", &dp, &tp, &pp, &cp); err != nil {
			t.Fatalf("%q: %v", cols[0], err)
		}
		if dp*tp*pp*cp != 64 || tp > 8 {
			t.Errorf("%s is not a layout of 64 GPUs in nodes of 8", cols[0])
		}
		peak, err := units.ParseSize(strings.ReplaceAll(cols[10], " ", ""))
		if err != nil {
			t.Fatalf("peak %q: %v", cols[10], err)
		}
		if float64(peak) > limit {
			t.Errorf("%s: peak %s beyond the rule's %.0f bytes", cols[0], cols[10], limit)
		}
	}
	if rows == 0 || rows > modelParallelPlans {
		t.Errorf("%d layouts listed, want 1 to %d:\n%s", rows, modelParallelPlans, section)
	}
	// The fastest listed layout runs whole, every micro-batch of both steps, and fits on its first and last
	// stages (fit simulated their first 2 x PP micro-batches).
	_, runs, _ := strings.Cut(section, "To run a layout")
	first := regexp.MustCompile(`(?m)^  1  oomdbg run (.*?)   \(rank`).FindStringSubmatch(runs)
	if first == nil {
		t.Fatalf("no layout to run:\n%s", section)
	}
	args := strings.Fields(first[1])
	pp := 1
	if i := slices.Index(args, "--pp"); i >= 0 {
		pp, _ = strconv.Atoi(args[i+1])
	}
	for _, rank := range []int{0, 64 - 64/pp} {
		if !runFlagsFit(t, append(slices.Clone(args), "--steps", "2", "--rank", strconv.Itoa(rank))) {
			t.Errorf("oomdbg run %s --rank %d: does not fit", first[1], rank)
		}
	}
	// On one node of eight, every listed layout's command runs, whole, and fits.
	_, stdout, _ = runCmd("fit", "--preset", "llama-3.1-8b", "--gpus", "8", "--gpu-mem", "80GiB")
	_, section, _ = strings.Cut(stdout, "To run a layout")
	commands := 0
	for _, line := range strings.Split(section, "\n") {
		_, cmdline, ok := strings.Cut(line, "oomdbg run ")
		if !ok {
			continue
		}
		commands++
		listed, _, _ := strings.Cut(cmdline, "   (rank")
		if !runFlagsFit(t, append(strings.Fields(listed), "--steps", "2")) {
			t.Errorf("oomdbg run %s: does not fit", listed)
		}
	}
	if commands == 0 {
		t.Errorf("no layout to run:\n%s", stdout)
	}
	// A workload a split rank cannot run says so instead of listing layouts.
	_, stdout, _ = runCmd("fit", "--preset", "llama-3.1-8b", "--gpus", "8", "--gpu-mem", "80GiB", "--eval-every", "2")
	if !strings.Contains(stdout, "The layouts could not be run: a split model's rank runs training steps only") || strings.Contains(stdout, "To run a layout") {
		t.Errorf("fit --eval-every 2 with layouts:\n%s", stdout)
	}
	for _, args := range [][]string{
		{"--preset", "llama-3.2-1b", "--gpu-mem", "16GiB"},
		{"--preset", "llama-3.2-1b", "--gpus", "4", "--lora", "16", "--gpu-mem", "16GiB"},
	} {
		if _, stdout, _ := runCmd(append([]string{"fit"}, args...)...); strings.Contains(stdout, "Model-parallel layouts") {
			t.Errorf("fit %s lists layouts", strings.Join(args, " "))
		}
	}
}

// BenchmarkFitLayouts70B is fit on a 64-GPU job of a 70B model: the plans on one GPU, the formulas' search
// of the layouts and the simulation of the fastest.
func BenchmarkFitLayouts70B(b *testing.B) {
	for range b.N {
		if code, _, stderr := runCmd("fit", "--preset", "llama-2-70b", "--gpus", "64", "--nodes", "8", "--gpu-mem", "80GiB"); code != exitProblem {
			b.Fatalf("exit %d: %s", code, stderr)
		}
	}
}
