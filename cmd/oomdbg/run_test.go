package main

import (
	"bytes"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

func TestRunCommand(t *testing.T) {
	dir := t.TempDir()
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
		"leak bug": {args: []string{"--bug", "retain-graph", "--steps", "4"}, code: exitOK, stdout: []string{"steps      4 of 4"}},
		"bad size": {args: []string{"--gpu-mem", "lots"}, code: exitUsage, stderr: `invalid size "lots"`},
		"bad bug":  {args: []string{"--bug", "nope"}, code: exitUsage, stderr: `unknown bug "nope"`},
		"bad conf": {args: []string{"--alloc-conf", "max_split_size_mb:1"}, code: exitUsage, stderr: "alloc conf:"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			out := filepath.Join(dir, strings.ReplaceAll(name, " ", "_")+".oomdbg")
			var stdout, stderr bytes.Buffer
			code := run(append([]string{"run", "-o", out}, tc.args...), &stdout, &stderr)
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
