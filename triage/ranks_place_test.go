package triage

import (
	"encoding/json"
	"fmt"
	"testing"
)

// TestRankPlaceFollowsMegatronsOrder: a split job's rank is tp + TP*(cp + CP*(dp + DP*stage)), Megatron's
// order; each rank of a job of 64 GPUs (TP 2, CP 2, PP 4, DP 4) is built that way and read back.
func TestRankPlaceFollowsMegatronsOrder(t *testing.T) {
	const tp, cp, dp, pp = 2, 2, 4, 4
	for stage := range pp {
		for d := range dp {
			for c := range cp {
				for r := range tp {
					rank := r + tp*(c+cp*(d+dp*stage))
					w, _ := json.Marshal(map[string]any{"parallel": map[string]any{"gpus": 64, "strategy": "zero1", "rank": rank},
						"split": map[string]any{"tp": tp, "pp": pp, "cp": cp}})
					jr, ok := rankOf(w)
					if !ok {
						t.Fatalf("rank %d: not read as a rank", rank)
					}
					want := fmt.Sprintf("stage %d of 4, tp rank %d of 2, cp rank %d of 2", stage, r, c)
					if got := jr.place(false); got != want {
						t.Errorf("rank %d: %q, want %q", rank, got, want)
					}
					if got, want := jr.place(true), fmt.Sprintf("s%d t%d c%d", stage, r, c); got != want {
						t.Errorf("rank %d: short %q, want %q", rank, got, want)
					}
				}
			}
		}
	}
	w, _ := json.Marshal(map[string]any{"parallel": map[string]any{"gpus": 8, "strategy": "ddp", "rank": 3}})
	if jr, _ := rankOf(w); jr.place(false) != "" {
		t.Errorf("a job that splits nothing has a place: %q", jr.place(false))
	}
}
