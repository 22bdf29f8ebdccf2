package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestTUIRunnerAppliesTheFixes records a workload through the TUI's runner with other fixes and on the meta
// device, and reads the configuration back from the snapshot: what the TUI chose is what ran.
func TestTUIRunnerAppliesTheFixes(t *testing.T) {
	cfg, err := train.PresetConfig("tiny")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Steps, cfg.Device = 1, "cpu"
	w, err := tuiWorkload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.Name != "tiny on cpu" || !w.GPT || w.Fixes.AMP != cfg.AMP.String() || w.Fixes.Batch != cfg.Batch {
		t.Fatalf("workload %+v does not describe %+v", w, cfg)
	}
	w.Device = "meta"
	w.Fixes.AMP, w.Fixes.Attention, w.Fixes.Checkpoint = "bf16", "flash", "all"
	w.Fixes.Batch, w.Fixes.Accum = cfg.Batch/2, 2
	var out bytes.Buffer
	if err := (tuiRunner{version: "test"}).Record(context.Background(), w, &out); err != nil {
		t.Fatal(err)
	}
	s, err := snapshot.Read(&out)
	if err != nil {
		t.Fatal(err)
	}
	var ran train.Config
	if err := json.Unmarshal(s.Meta.Workload, &ran); err != nil {
		t.Fatal(err)
	}
	if ran.Device != "meta" || ran.AMP != train.AMPBF16 || ran.Attention != train.AttentionFlash || ran.Checkpoint != train.CheckpointAll ||
		ran.Batch != cfg.Batch/2 || ran.Accum != 2 || ran.DModel != cfg.DModel || s.Meta.ToolVersion != "test" {
		t.Errorf("recorded %+v (tool %q), want the fixes applied to %+v", ran, s.Meta.ToolVersion, cfg)
	}
	back, err := (tuiRunner{}).Parse(s.Meta.Workload)
	if err != nil {
		t.Fatal(err)
	}
	if back.Fixes != w.Fixes || back.Device != "meta" {
		t.Errorf("parsed back %+v, want %+v on meta", back.Fixes, w.Fixes)
	}
	if _, err := (tuiRunner{}).Parse(json.RawMessage(`{"model":"gpt","amp":"fp8"}`)); err == nil {
		t.Error("a configuration that does not validate parsed")
	}
	var _ tui.Runner = tuiRunner{}
}
