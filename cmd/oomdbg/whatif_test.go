package main

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestWhatIfCommand(t *testing.T) {
	dir := testFiles(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	tests := map[string]struct {
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		"batch":         {[]string{"whatif", f("fixed.oomdbg"), "--batch-scale", "0.5"}, 0, []string{"peak allocated", "peak reserved", "verdict", "assumes:", "batch x0.5: "}, ""},
		"several fixes": {[]string{"whatif", f("fixed.oomdbg"), "--accum", "2", "--optimizer", "sgd", "--alloc-conf", "expandable_segments:True"}, 0, []string{"accumulate 2", "optimizer sgd", "alloc-conf expandable_segments:True"}, ""},
		"ends in OOM":   {[]string{"whatif", f("oom.oomdbg"), "--batch-scale", "0.5"}, 0, []string{"out of memory", "never recorded"}, ""},
		"no fix":        {[]string{"whatif", f("fixed.oomdbg")}, 2, nil, "no fix given"},
		"amp":           {[]string{"whatif", f("fixed.oomdbg"), "--amp", "bf16"}, 2, nil, "mixed precision cannot be read off a trace"},
		"bad optimizer": {[]string{"whatif", f("fixed.oomdbg"), "--optimizer", "lion"}, 2, nil, "unknown optimizer"},
		"bad scale":     {[]string{"whatif", f("fixed.oomdbg"), "--batch-scale", "0"}, 2, nil, "--batch-scale"},
		"not a file":    {[]string{"whatif", f("text.txt"), "--batch-scale", "0.5"}, 2, nil, "text.txt"},
		"8-bit and for-loop": {[]string{"whatif", f("fixed.oomdbg"), "--optimizer", "adamw8bit", "--optimizer-impl", "for-loop"}, 0,
			[]string{"optimizer adamw8bit: ", "8-bit state", "optimizer-impl for-loop: "}, ""},
		"bad impl":     {[]string{"whatif", f("fixed.oomdbg"), "--optimizer-impl", "fast"}, 2, nil, "--optimizer-impl"},
		"zero to none": {[]string{"whatif", f("fixed.oomdbg"), "--zero-grad", "none"}, 0, []string{"already does this"}, ""},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCmd(tc.args...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d\nstdout: %s\nstderr: %s", code, tc.code, stdout, stderr)
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			if tc.stderr != "" && (!strings.Contains(stderr, tc.stderr) || strings.Count(strings.TrimSpace(stderr), "\n") > 0) {
				t.Errorf("stderr %q, want one line with %q", stderr, tc.stderr)
			}
		})
	}
}

// The JSON holds at least what docs/whatif.md promises: before and after with peak_allocated,
// peak_reserved (bytes) and oom (a boolean), and the assumptions.
func TestWhatIfJSON(t *testing.T) {
	dir := testFiles(t)
	code, stdout, stderr := runCmd("whatif", filepath.Join(dir, "oom.oomdbg"), "--checkpoint", "all", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var doc struct {
		Before, After *struct {
			PeakAllocated *int64 `json:"peak_allocated"`
			PeakReserved  *int64 `json:"peak_reserved"`
			OOM           *bool  `json:"oom"`
		}
		Assumptions []string `json:"assumptions"`
		Unrecorded  string   `json:"unrecorded"`
	}
	if err := json.Unmarshal([]byte(stdout), &doc); err != nil {
		t.Fatal(err)
	}
	for name, s := range map[string]*struct {
		PeakAllocated *int64 `json:"peak_allocated"`
		PeakReserved  *int64 `json:"peak_reserved"`
		OOM           *bool  `json:"oom"`
	}{"before": doc.Before, "after": doc.After} {
		if s == nil || s.PeakAllocated == nil || s.PeakReserved == nil || s.OOM == nil || *s.PeakAllocated <= 0 {
			t.Errorf("%s: %s", name, stdout)
		}
	}
	if len(doc.Assumptions) != 1 || doc.Unrecorded == "" || !*doc.Before.OOM {
		t.Errorf("assumptions %q, unrecorded %q, before OOM %v", doc.Assumptions, doc.Unrecorded, *doc.Before.OOM)
	}
}
