package main

import (
	"path/filepath"
	"strings"
	"testing"
)

func TestDiffCommand(t *testing.T) {
	dir := testFiles(t)
	f := func(name string) string { return filepath.Join(dir, name) }
	tests := map[string]struct {
		args   []string
		code   int
		stdout []string
		stderr string
	}{
		"leak vs fixed": {args: []string{f("leak.oomdbg"), f("fixed.oomdbg")}, code: exitOK, stdout: []string{
			"oomdbg diff: " + f("leak.oomdbg") + " -> " + f("fixed.oomdbg"),
			"peak allocated                       1.01 MiB             462.50 KiB  -569.00 KiB (-55%)",
			"leaks           leak, 75.50 KiB per iteration                no leak",
			"\nCATEGORIES AT THE PEAK\n", "  activation       532.00 KiB   32.00 KiB  -500.00 KiB (-93%)",
			"\nSCOPES AT THE PEAK (largest changes)\n  net.3       256.00 KiB         0 B  -256.00 KiB (-100%)"}},
		"oom vs leak, markdown": {args: []string{f("oom.oomdbg"), f("leak.oomdbg"), "--format", "markdown"}, code: exitOK, stdout: []string{
			"## oomdbg diff: `", "| out of memory | iteration 0, forward | none |  |",
			"**Not alike**: a ran out of memory in iteration 0, forward, and never reached iteration 1",
			"### Phases (highest peak inside the phase, over setup and iterations up to 0, which both reached)",
			"| `backward` | not reached |"}},
		"one file":   {args: []string{f("leak.oomdbg")}, code: exitUsage, stderr: "oomdbg: accepts 2 arg(s), received 1"},
		"bad format": {args: []string{f("leak.oomdbg"), f("fixed.oomdbg"), "-f", "json"}, code: exitUsage, stderr: `oomdbg: unknown format "json" (want text or markdown)`},
		"bad file":   {args: []string{f("leak.oomdbg"), f("text.txt")}, code: exitUsage, stderr: "is neither an oomdbg snapshot nor a PyTorch memory snapshot"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			code, stdout, stderr := runCmd(append([]string{"diff"}, tc.args...)...)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, stderr)
			}
			for _, s := range tc.stdout {
				if !strings.Contains(stdout, s) {
					t.Errorf("stdout lacks %q:\n%s", s, stdout)
				}
			}
			if tc.stderr != "" && (!strings.Contains(stderr, tc.stderr) || strings.Count(stderr, "\n") != 1) {
				t.Errorf("stderr %q, want one line with %q", stderr, tc.stderr)
			}
		})
	}
}
