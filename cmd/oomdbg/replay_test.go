package main

import (
	"bytes"
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
)

func TestReplayCmd(t *testing.T) {
	snap := func(name string) string {
		return filepath.Join("..", "..", "snapshot", "torch", "testdata", "snapshots", name)
	}
	tests := map[string]struct {
		args   []string
		code   int
		stdout []string // substrings of stdout
		stderr string   // the start of the one line on stderr
	}{
		"fidelity": {args: []string{snap("g3.pickle")}, code: exitOK,
			stdout: []string{"replay of g3.pickle: PyTorch snapshot (schema G3, pickle protocol 4)",
				"new segments            2 of 2 (100.0%) sizes match", "final state             3 of 3 (100.0%)"}},
		"what if": {args: []string{snap("g3.pickle"), "--alloc-conf", "expandable_segments:True"}, code: exitOK,
			stdout: []string{"device 0: what if expandable_segments:True", "capacity 5.00 MiB: reserved at the recorded OOM"}},
		"what if with capacity": {args: []string{snap("g1.pickle"), "--alloc-conf", "", "--gpu-mem", "30MiB"}, code: exitOK,
			stdout: []string{"capacity 30.00 MiB, as given", "fails (the replay stops there"}},
		"json": {args: []string{snap("g3.json"), "--json"}, code: exitOK, stdout: []string{`"fidelity": [`}},
		"state only": {args: []string{snap("segments.pickle")}, code: exitUsage,
			stderr: "oomdbg: " + snap("segments.pickle") + ": the snapshot holds no allocation trace to replay"},
		"bad settings": {args: []string{snap("g3.pickle"), "--alloc-conf", "bogus:1"}, code: exitUsage,
			stderr: `oomdbg: --alloc-conf "bogus:1": Unrecognized key 'bogus'`},
		"not a snapshot": {args: []string{"replay.go"}, code: exitUsage,
			stderr: "oomdbg: replay.go is neither an oomdbg snapshot nor a PyTorch memory snapshot"},
		"missing file": {args: []string{"nothere.pickle"}, code: exitUsage, stderr: "oomdbg: open nothere.pickle"},
		"no file":      {args: nil, code: exitUsage, stderr: "oomdbg: accepts 1 arg(s), received 0"},
		"bad size":     {args: []string{snap("g3.pickle"), "--gpu-mem", "lots"}, code: exitUsage, stderr: `oomdbg: invalid argument "lots"`},
		"cut short": {args: []string{filepath.Join(testFiles(t), "cut.oomdbg")}, code: exitOK,
			stdout: []string{"device 0: the trace replayed under the recorded settings"}, stderr: "oomdbg: warning: snapshot cut short at byte "},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			code := run(context.Background(), append([]string{"replay"}, tc.args...), &out, &errOut)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, errOut.String())
			}
			for _, s := range tc.stdout {
				if !strings.Contains(out.String(), s) {
					t.Errorf("stdout lacks %q:\n%s", s, out.String())
				}
			}
			if tc.stderr != "" && (!strings.HasPrefix(errOut.String(), tc.stderr) || strings.Count(errOut.String(), "\n") != 1) {
				t.Errorf("stderr %q, want one line starting %q", errOut.String(), tc.stderr)
			}
			if tc.code == exitOK && tc.stderr == "" && errOut.Len() != 0 {
				t.Errorf("stderr %q on success", errOut.String())
			}
			if name == "json" {
				var v map[string]any
				if err := json.Unmarshal(out.Bytes(), &v); err != nil {
					t.Errorf("--json output does not parse: %v", err)
				}
			}
		})
	}
}
