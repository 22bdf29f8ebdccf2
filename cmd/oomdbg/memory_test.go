package main

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/oomdbg/oomdbg/tui"
)

// TestViewPagesPastTheTUIBudget checks what the TUI may hold a run in before it pages it: its own budget
// under the default --max-memory (half of a 24 GiB machine would hold 100M events whole), the default when
// that is less, and --max-memory when given, more or less than the TUI's budget.
func TestViewPagesPastTheTUIBudget(t *testing.T) {
	defer debug.SetMemoryLimit(math.MaxInt64) // resolve tells the runtime
	for _, tc := range []struct {
		mem  memory
		want int64
	}{
		{memory{}, min(int64(defaultMaxMemory()), tui.DefaultMemoryBudget)},
		{memory{limit: 8 << 30, set: true}, 8 << 30},
		{memory{limit: 256 << 20, set: true}, 256 << 20},
	} {
		mem := tc.mem
		if got := viewHold(&mem); got != tc.want {
			t.Errorf("--max-memory %d (given: %v): the TUI holds %d, want %d", tc.mem.limit, tc.mem.set, got, tc.want)
		}
	}
}
