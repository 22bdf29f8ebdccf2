// Package torchtest gives tests what they compare oomdbg with: small PyTorch programs run on the CPU
// (Debian's python3-torch), CPython itself, and the real PyTorch snapshot files.
//
// Where one of them is missing the tests that need it are skipped, except under CI (CI=true), where they
// fail: CI installs python3-torch and checks out the fixtures, and a check that silently stops running is
// no check.
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
		unavailable(t, "PyTorch is not importable by %s (apt-get install python3-torch)", Python)
	}
	return version
}

// Run executes script with PyTorch, with args as sys.argv[1:]; the script prints one JSON document, decoded
// into out.
func Run(t testing.TB, script string, out any, args ...string) {
	t.Helper()
	run(t, out, append([]string{"-c", script}, args...)...)
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
