package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestExitCodes(t *testing.T) {
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
