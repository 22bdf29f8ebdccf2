package hostmem

import (
	"math"
	"runtime/debug"
	"testing"
)

// TestHold checks what the TUI may hold a run in before it pages it: its own budget under the default
// --max-memory (half of a 24 GiB machine would hold 100M events whole), the default when that is less, and
// --max-memory when given, more or less than the TUI's budget.
func TestHold(t *testing.T) {
	defer debug.SetMemoryLimit(math.MaxInt64) // Resolve tells the runtime
	const own = 1 << 30                       // the TUI's budget (tui.DefaultMemoryBudget)
	for _, tc := range []struct {
		lim  Limit
		want int64
	}{
		{Limit{}, min(int64(Default()), own)},
		{Limit{Bytes: 8 << 30, Given: true}, 8 << 30},
		{Limit{Bytes: 256 << 20, Given: true}, 256 << 20},
	} {
		lim := tc.lim
		if got := lim.Hold(own); got != tc.want {
			t.Errorf("--max-memory %d (given: %v): the TUI holds %d, want %d", tc.lim.Bytes, tc.lim.Given, got, tc.want)
		}
	}
}
