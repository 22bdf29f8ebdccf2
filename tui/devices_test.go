package tui

import (
	"strings"
	"testing"

	"github.com/charmbracelet/x/exp/golden"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// TestOpensOnTheDeviceThatRanOut: memory on three GPUs is no one pool. The TUI opens a snapshot of an OOM
// under DataParallel (snapshottest.DataParallelOOM: 16, 78 and 22 MiB on cuda:0, 1 and 2; the OOM on cuda:1)
// on cuda:1, whose own 78 MiB the title's capacity, the OOM panel and the timeline give, not the 116 MiB of
// the three; d shows the sum, saying it is one.
func TestOpensOnTheDeviceThatRanOut(t *testing.T) {
	s, err := torch.Import(snapshottest.DataParallelOOM())
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 80, 24)
	out := screen(m)
	title := strings.SplitN(out, "\n", 2)[0]
	if !strings.Contains(title, "cuda:1 (2 of 3") || !strings.Contains(out, "OUT OF MEMORY") {
		t.Fatalf("the TUI does not open on cuda:1's OOM:\n%s", out)
	}
	if !strings.Contains(out, "allocated 78.00 MiB · reserved 80.00 MiB") || strings.Contains(out, "116.00 MiB") {
		t.Errorf("the OOM panel does not give cuda:1's own memory:\n%s", out)
	}
	golden.RequireEqual(t, []byte(out)) // at 80x24: cuda:1's own OOM, its capacity line absent (none recorded)
	press(m, "d", "d")
	if title := strings.SplitN(screen(m), "\n", 2)[0]; !strings.Contains(title, "all 3 devices summed, not one pool") {
		t.Errorf("the view of all devices does not say it sums them: %q", title)
	}
}
