package main

import (
	"encoding/json"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/units"
)

// TestGPUMemOnPyTorchSnapshot: PyTorch's snapshots do not record the card's memory, so report --gpu-mem
// gives it. A recording that ran out of memory on a 24 GiB card, exported to PyTorch's format, then has the
// device's capacity, marked as given, and the OOM's message is the one PyTorch printed, as the recording
// has it ("has a total capacity of ... of which ... is free"); the OOM is replayed on what the allocator had
// then (the card less what the CUDA context took, as the OOM's free memory shows). A snapshot that records
// another capacity refuses it (exit 2), as does a bad size.
func TestGPUMemOnPyTorchSnapshot(t *testing.T) {
	dir := testFiles(t)
	native := filepath.Join(dir, "oom.oomdbg")
	exported := filepath.Join(t.TempDir(), "oom.pickle")
	if code, _, stderr := runCmd("export", native, "--format", "torch", "-o", exported); code != exitOK {
		t.Fatalf("export: exit %d: %s", code, stderr)
	}
	code, out, stderr := runCmd("report", native, "--format", "json")
	if code != exitProblem { // an OOM is a problem found: exit 1

		t.Fatalf("report: exit %d: %s", code, stderr)
	}
	var rec struct {
		Devices []struct {
			Capacity       int64 `json:"capacity"`
			ContextReserve int64 `json:"context_reserve"`
		} `json:"devices"`
		OOM struct {
			Message string `json:"message"`
		} `json:"oom"`
	}
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatal(err)
	}
	capacity := rec.Devices[0].Capacity
	total := regexp.MustCompile(`has a total capacity of \S+ \S+ of which \S+ \S+ is free`).FindString(rec.OOM.Message)
	if total == "" {
		t.Fatalf("the recording's message says no capacity: %q", rec.OOM.Message)
	}
	gpuMem := units.FormatSizeExact(uint64(capacity))

	code, text, stderr := runCmd("report", exported)
	if code != exitProblem || !strings.Contains(text, "cuda:0: capacity not recorded") || strings.Contains(text, total) {
		t.Fatalf("without --gpu-mem: exit %d, %s\n%s", code, stderr, text)
	}
	code, text, stderr = runCmd("report", exported, "--gpu-mem", gpuMem)
	if code != exitProblem {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	for _, want := range []string{"cuda:0: " + units.FormatSize(capacity) + " (given with --gpu-mem, not recorded)", total,
		"replayed on the " + units.FormatSize(capacity-rec.Devices[0].ContextReserve) + " the allocator could have"} {
		if !strings.Contains(text, want) {
			t.Errorf("report --gpu-mem %s lacks %q:\n%s", gpuMem, want, text)
		}
	}
	code, out, stderr = runCmd("report", exported, "--gpu-mem", gpuMem, "--format", "json")
	if code != exitProblem {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	if err := validate(loadSchemaFile(t, "report-json.schema.json", ""), []byte(out)); err != nil {
		t.Errorf("the report does not match its schema: %v", err)
	}
	var got struct {
		Devices []struct {
			Capacity      int64 `json:"capacity"`
			CapacityGiven bool  `json:"capacity_given"`
		} `json:"devices"`
	}
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if got.Devices[0].Capacity != capacity || !got.Devices[0].CapacityGiven {
		t.Errorf("device %+v, want capacity %d given", got.Devices[0], capacity)
	}

	for name, tc := range map[string]struct {
		args   []string
		stderr string
	}{
		"recorded":  {[]string{native, "--gpu-mem", "40GiB"}, "oomdbg: --gpu-mem 40.00 GiB: the snapshot records simulated GPU (meta)'s memory"},
		"bad size":  {[]string{exported, "--gpu-mem", "24XB"}, `oomdbg: invalid argument "24XB" for "--gpu-mem" flag`},
		"too large": {[]string{exported, "--gpu-mem", "2PiB"}, `oomdbg: invalid argument "2PiB" for "--gpu-mem" flag`},
	} {
		t.Run(name, func(t *testing.T) {
			code, _, stderr := runCmd(append([]string{"report"}, tc.args...)...)
			if code != exitUsage || !strings.HasPrefix(stderr, tc.stderr) || strings.Count(stderr, "\n") != 1 {
				t.Errorf("exit %d, stderr %q; want exit %d and one line starting %q", code, stderr, exitUsage, tc.stderr)
			}
		})
	}
}
