package backend

import (
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestTUIPlansFitWhenRecorded: the plans the TUI lists (Backend.Plans) fit when their fixes are applied
// to the workload as the TUI's re-run applies them and run.
func TestTUIPlansFitWhenRecorded(t *testing.T) {
	cfg, err := train.PresetConfig("gpt2-small")
	if err != nil {
		t.Fatal(err)
	}
	cfg.GPUMemory = 12 << 30
	w, err := Workload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := Backend{}.Plans(context.Background(), w)
	if err != nil {
		t.Fatal(err)
	}
	if len(plans) < 2 {
		t.Fatalf("%d plans", len(plans))
	}
	for _, p := range plans[:2] {
		pw := w
		pw.Fixes = p.Fixes
		c, err := configOf(pw)
		if err != nil {
			t.Fatal(err)
		}
		c.Steps = 2
		res, _, err := train.Run(context.Background(), c, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.OOM != nil || float64(res.PeakReserved) > 0.95*float64(c.GPUMemory-c.ContextReserve) {
			t.Errorf("%s: peak reserved %d, OOM %v", p.Name, res.PeakReserved, res.OOM != nil)
		}
	}
}
