package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExitCodes runs the command line without a terminal. oomdbg without arguments records the default
// workload into the temporary directory, which is the test's own: a test leaves nothing in the machine's.
func TestExitCodes(t *testing.T) {
	machineTmp := os.TempDir()
	t.Setenv("TMPDIR", t.TempDir())
	t.Cleanup(func() {
		left, _ := filepath.Glob(filepath.Join(machineTmp, fmt.Sprintf("oomdbg-*-%d.oomdbg", os.Getpid())))
		if len(left) > 0 {
			t.Errorf("left %v in %s", left, machineTmp)
		}
	})
	tests := map[string]struct {
		args       []string
		code       int
		stdout     string // a substring stdout must contain
		stderrLine string // the one line stderr must hold exactly, if set
	}{
		"help": {args: []string{"--help"}, code: exitOK, stdout: "Available Commands"},
		"no args": {args: nil, code: exitProblem, stdout: "OOM in iteration 0, forward",
			stderrLine: "prefix:oomdbg: out of memory in iteration 0, forward (snapshot "},
		"version":         {args: []string{"version"}, code: exitOK, stdout: "oomdbg "},
		"completion bash": {args: []string{"completion", "bash"}, code: exitOK, stdout: "bash completion"},
		"completion zsh":  {args: []string{"completion", "zsh"}, code: exitOK, stdout: "compdef"},
		"unknown flag": {args: []string{"--bogus"}, code: exitUsage,
			stderrLine: "oomdbg: unknown flag: --bogus (see 'oomdbg --help')"},
		"unknown command": {args: []string{"nothere"}, code: exitUsage,
			stderrLine: `oomdbg: unknown command "nothere" for "oomdbg"`},
		"version takes no args": {args: []string{"version", "x"}, code: exitUsage,
			stderrLine: `oomdbg: unknown command "x" for "oomdbg version"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), tc.args, &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit code %d, want %d (stderr %q)", code, tc.code, errOut.String())
			}
			if !strings.Contains(out.String(), tc.stdout) {
				t.Errorf("stdout %q does not contain %q", out.String(), tc.stdout)
			}
			if name == "no args" && !strings.Contains(out.String(), "snapshot   "+filepath.Join(os.TempDir(), "oomdbg-")) {
				t.Errorf("the default recording is not in the temporary directory %s:\n%s", os.TempDir(), out.String())
			}
			if prefix, ok := strings.CutPrefix(tc.stderrLine, "prefix:"); ok {
				if !strings.HasPrefix(errOut.String(), prefix) || strings.Count(errOut.String(), "\n") != 1 {
					t.Errorf("stderr %q, want one line starting %q", errOut.String(), prefix)
				}
			} else if tc.stderrLine != "" && errOut.String() != tc.stderrLine+"\n" {
				t.Errorf("stderr %q, want the one line %q", errOut.String(), tc.stderrLine)
			}
			if tc.code == exitOK && errOut.Len() != 0 {
				t.Errorf("stderr %q on success", errOut.String())
			}
		})
	}
}
