package tui

import (
	"slices"
	"testing"
)

// TestFixesPaneShowsOnlyChoices: a row with nothing to choose is not shown. A GPT has no weights dtype or
// adapter to choose (a Llama has), an MLP no attention or checkpointing, and a loop without a leak bug no bug
// to fix; zero_grad's choices say what PyTorch calls them.
func TestFixesPaneShowsOnlyChoices(t *testing.T) {
	for name, want := range map[string]struct{ shown, hidden []int }{
		"tiny-oom":    {[]int{rowAMP, rowAttention, rowCheckpoint, rowOptimizer, rowZeroGrad, rowBug}, []int{rowWeights, rowAdapter}},
		"smollm-ft":   {[]int{rowWeights, rowAdapter, rowAttention, rowCheckpoint}, []int{rowBug}},
		"leaky":       {[]int{rowAMP, rowOptimizer, rowBug}, []int{rowWeights, rowAdapter, rowAttention, rowCheckpoint}},
		"leaky-fixed": {[]int{rowAMP, rowOptimizer}, []int{rowBug}},
	} {
		p := newFixesPane(workload(t, name), playback{}, 0)
		rows := p.rows()
		for _, r := range want.shown {
			if !slices.Contains(rows, r) {
				t.Errorf("%s: no %s row in %v", name, fixRowNames[r], rows)
			}
		}
		for _, r := range want.hidden {
			if slices.Contains(rows, r) {
				t.Errorf("%s: a %s row with nothing to choose: %q", name, fixRowNames[r], p.choices(r))
			}
		}
		if got := p.choices(rowZeroGrad); !slices.Equal(got, []string{"set_to_none", "zero"}) {
			t.Errorf("%s: zero_grad's choices %q", name, got)
		}
	}
}

// toRow moves the fixes pane's selection down to a setting's row.
func toRow(t *testing.T, m *Model, row int) {
	t.Helper()
	for range numFixRows {
		if rows := m.fixes.rows(); m.fixes.selected < len(rows) && rows[m.fixes.selected] == row && !m.fixes.focusRanked {
			return
		}
		press(m, "down")
	}
	t.Fatalf("the fixes pane has no row %s: %v", fixRowNames[row], m.fixes.rows())
}
