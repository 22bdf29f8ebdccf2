package app

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// record records the default MLP for steps steps into dir and returns the file's path and bytes.
func record(t *testing.T, dir string, steps int) (string, []byte) {
	t.Helper()
	cfg := train.DefaultMLP()
	cfg.Steps = steps
	path := filepath.Join(dir, "run.oomdbg")
	var stdout, stderr bytes.Buffer
	if err := Record(context.Background(), cfg, Recording{Path: path, Version: "test"}, &stdout, &stderr); err != nil {
		t.Fatalf("%v: %s", err, stderr.String())
	}
	if first, _, _ := strings.Cut(stdout.String(), "\n"); !strings.HasPrefix(first, "snapshot   "+path+" (") {
		t.Errorf("the summary starts %q", first)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return path, data
}

// TestRecordValidatesBeforeWriting holds that a configuration that cannot run leaves the file it would have
// replaced as it was, and says which field is wrong.
func TestRecordValidatesBeforeWriting(t *testing.T) {
	path := filepath.Join(t.TempDir(), "old.oomdbg")
	if err := os.WriteFile(path, []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := train.DefaultMLP()
	cfg.Hidden = 0
	err := Record(context.Background(), cfg, Recording{Path: path}, &bytes.Buffer{}, &bytes.Buffer{})
	var fe *train.FieldError
	if !errors.As(err, &fe) || fe.Field != "hidden" {
		t.Fatalf("Record of hidden 0: %v", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("the file holds %q", b)
	}
}

// TestOpenAndCheckPartial holds the one rule for a file read in part: a file damaged part-way is used up to
// the damage, and check uses it only when asked; one cut short loads with its warning; one over the memory
// budget is refused, with what to do.
func TestOpenAndCheckPartial(t *testing.T) {
	dir := t.TempDir()
	_, data := record(t, dir, 8)
	damaged := filepath.Join(dir, "damaged.oomdbg")
	bad := bytes.Clone(data)
	copy(bad[len(bad)*2/3:], bytes.Repeat([]byte{0xff}, 16))
	cut := filepath.Join(dir, "cut.oomdbg")
	for path, b := range map[string][]byte{damaged: bad, cut: data[:len(data)*2/3]} {
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	lim := &hostmem.Limit{}
	s, damage, err := Open(damaged, lim, load.CostAnalyse)
	if err != nil || damage == nil || s.Events.Len() == 0 {
		t.Errorf("a damaged file: %v events, damage %v, error %v", s, damage, err)
	}
	if s, damage, err := Open(cut, lim, load.CostAnalyse); err != nil || damage != nil || s.Warning == nil {
		t.Errorf("a file cut short: damage %v, error %v", damage, err)
	}
	tight := &hostmem.Limit{Bytes: hostmem.Min, Given: true}
	if _, _, err := Open(damaged, tight, 1<<30); !errors.Is(err, load.ErrMemory) || !strings.Contains(err.Error(), "--max-memory raises it") {
		t.Errorf("over the budget: %v", err)
	}
	for _, path := range []string{damaged, cut} {
		if _, err := Check(path, CheckRequest{Memory: lim}, &bytes.Buffer{}); err == nil {
			t.Errorf("check %s passed a file read in part", filepath.Base(path))
		}
		var stderr bytes.Buffer
		if c, err := Check(path, CheckRequest{Memory: lim, AllowTruncated: true}, &stderr); err != nil || c == nil ||
			!strings.HasPrefix(stderr.String(), "oomdbg: warning: ") {
			t.Errorf("check --allow-truncated %s: %v, stderr %q", filepath.Base(path), err, stderr.String())
		}
	}
}

func TestHumanCount(t *testing.T) {
	for n, want := range map[int]string{12: "12", 12_500: "12.5K", 355_000_000: "355.0M", 1_300_000_000: "1.30B"} {
		if got := humanCount(n); got != want {
			t.Errorf("humanCount(%d) = %q, want %q", n, got, want)
		}
	}
}
