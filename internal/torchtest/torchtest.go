// Package torchtest runs small PyTorch programs (Debian's python3-torch, on the CPU) from Go tests, so
// oomdbg's runtime can be checked against PyTorch's own numbers.
//
// Where PyTorch is not installed the tests that need it are skipped, except under CI (CI=true), where they
// fail: CI installs python3-torch, and a check that silently stops running is no check.
package torchtest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// Python is the interpreter with Debian's python3-torch.
const Python = "/usr/bin/python3"

var (
	once      sync.Once
	available bool
	version   string
)

// Require skips (or, under CI, fails) t when PyTorch cannot be imported, and returns torch.__version__.
func Require(t testing.TB) string {
	t.Helper()
	once.Do(func() {
		out, err := exec.Command(Python, "-c", "import torch; print(torch.__version__)").Output()
		available, version = err == nil, string(bytes.TrimSpace(out))
	})
	if !available {
		if os.Getenv("CI") == "true" {
			t.Fatalf("PyTorch is not importable by %s; CI must install python3-torch", Python)
		}
		t.Skipf("PyTorch is not importable by %s (apt-get install python3-torch)", Python)
	}
	return version
}

// Run executes script with PyTorch; the script prints one JSON document, decoded into out.
func Run(t testing.TB, script string, out any) {
	t.Helper()
	run(t, out, "-c", script)
}

// RunFile executes the Python file at path with args; it prints one JSON document, decoded into out.
func RunFile(t testing.TB, path string, out any, args ...string) {
	t.Helper()
	run(t, out, append([]string{path}, args...)...)
}

func run(t testing.TB, out any, args ...string) {
	t.Helper()
	Require(t)
	cmd := exec.Command(Python, args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Env = append(os.Environ(), "OMP_NUM_THREADS=1")
	stdout, err := cmd.Output()
	if err != nil {
		t.Fatalf("python: %v\n%s", err, stderr.String())
	}
	if err := json.Unmarshal(stdout, out); err != nil {
		t.Fatalf("python printed %q: %v", stdout, err)
	}
}
