package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestSeqDistFlags runs the length settings through the command line: bad values exit 2 with one line, and a
// file of lengths is read once, so that a FIFO works and the snapshot carries the lengths it held.
func TestSeqDistFlags(t *testing.T) {
	dir := t.TempDir()
	bad := map[string]struct {
		args []string
		want string
	}{
		"missing file":   {[]string{"--preset", "tiny", "--seq-dist", "file:" + filepath.Join(dir, "none")}, "no such file or directory"},
		"not a number":   {[]string{"--preset", "tiny", "--seq-dist", "file:" + write(t, dir, "7\nseven\n")}, `line 2: "seven" is not a length`},
		"bad uniform":    {[]string{"--preset", "tiny", "--seq-dist", "uniform:9:3"}, "want uniform:MIN:MAX"},
		"past context":   {[]string{"--preset", "tiny", "--seq-dist", "uniform:9:65"}, "MAX 65 is longer than the context, seq 64"},
		"bad padding":    {[]string{"--preset", "tiny", "--padding", "multiple:-8"}, "N must be an integer from 1"},
		"bad empty":      {[]string{"--preset", "tiny", "--empty-cache", "sometimes"}, `unknown empty-cache "sometimes"`},
		"not a sequence": {[]string{"--seq-dist", "uniform:1:9"}, "apply to sequence models, not the mlp"},
	}
	for name, tc := range bad {
		t.Run(name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), append([]string{"run", "-o", filepath.Join(dir, "x.oomdbg")}, tc.args...), &stdout, &stderr)
			if code != exitUsage || !strings.Contains(stderr.String(), tc.want) || strings.Count(stderr.String(), "\n") != 1 {
				t.Errorf("exit %d, stderr %q; want 2 and one line saying %q", code, stderr.String(), tc.want)
			}
		})
	}

	t.Run("fifo", func(t *testing.T) {
		fifo := filepath.Join(dir, "lengths")
		if err := syscall.Mkfifo(fifo, 0o600); err != nil {
			t.Skipf("no FIFOs here: %v", err)
		}
		go func() {
			f, err := os.OpenFile(fifo, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			f.WriteString("10\n20\n20\n30\n")
			f.Close()
		}()
		out := filepath.Join(dir, "fifo.oomdbg")
		var stdout, stderr bytes.Buffer
		code := run(context.Background(), []string{"run", "--preset", "tiny", "--device", "meta", "--steps", "2", "--seq-dist", "file:" + fifo, "--padding", "multiple:8", "--empty-cache", "step", "-o", out}, &stdout, &stderr)
		if code != exitOK {
			t.Fatalf("exit %d: %s", code, stderr.String())
		}
		s, err := snapshot.ReadFile(out)
		if err != nil {
			t.Fatal(err)
		}
		var cfg train.Config
		if err := json.Unmarshal(s.Meta.Workload, &cfg); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(s.Meta.Workload), `"counts":[[10,1],[20,2],[30,1]]`) || cfg.Padding != train.PadToMultiple(8) || cfg.EmptyCache != train.EmptyCacheStep {
			t.Errorf("the snapshot stores %s", s.Meta.Workload)
		}
	})
}

func write(t *testing.T, dir, text string) string {
	t.Helper()
	f, err := os.CreateTemp(dir, "lengths")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(text); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
