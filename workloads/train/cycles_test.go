package train

import (
	"context"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/dist"
)

// TestSimulateCountsRepeatedMicroBatches: Simulate runs a step of 40 micro-batches until the allocator's
// state repeats, and counts the rest: fewer phases run, and the peaks, losses and what a rank moved are those
// of RunWithin, which runs all 40 (package fit holds the verdicts of many configurations to full runs).
func TestSimulateCountsRepeatedMicroBatches(t *testing.T) {
	for name, edit := range map[string]func(*Config){
		"one GPU":    func(*Config) {},
		"DDP, 2 GPU": func(c *Config) { c.Parallel = dist.Settings{GPUs: 2, Strategy: dist.DDP} },
	} {
		t.Run(name, func(t *testing.T) {
			cfg := tinyGPT()
			cfg.Accum, cfg.GPUMemory = 40, 8<<30
			edit(&cfg)
			want, err := RunWithin(context.Background(), cfg, 1<<40)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Simulate(context.Background(), cfg, 1<<40)
			if err != nil {
				t.Fatal(err)
			}
			if len(got.Phases) >= len(want.Phases)/4 {
				t.Errorf("ran %d phases of the %d of every micro-batch: the repeats were run", len(got.Phases), len(want.Phases))
			}
			if got.PeakAllocated != want.PeakAllocated || got.PeakReserved != want.PeakReserved || got.UnallocatedAtPeak != want.UnallocatedAtPeak {
				t.Errorf("peaks %d %d %d, the full run's %d %d %d", got.PeakAllocated, got.PeakReserved, got.UnallocatedAtPeak,
					want.PeakAllocated, want.PeakReserved, want.UnallocatedAtPeak)
			}
			if len(got.Losses) != len(want.Losses) || len(got.Traffic) != len(want.Traffic) {
				t.Fatalf("%d losses and %d steps of traffic, the full run's %d and %d", len(got.Losses), len(got.Traffic), len(want.Losses), len(want.Traffic))
			}
			for i := range got.Traffic {
				if got.Traffic[i] != want.Traffic[i] {
					t.Errorf("step %d moved %+v, the full run %+v", i, got.Traffic[i], want.Traffic[i])
				}
			}
		})
	}
}
