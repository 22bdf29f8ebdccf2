package main

import (
	"bytes"
	"os"
	"path/filepath"
	"regexp"
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
