package tui

import (
	"context"
	"strings"
	"testing"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// TestSegmentsAgreeWithTheReport: the pane's reserved-but-unallocated bytes are the report's, at the OOM of
// oomdbg's own recording and at the peak of PyTorch's snapshots (f4's peak holds 3.12 MiB of blocks freed
// but pending on their stream, which the pane once counted as allocated); the segments are drawn to scale.
func TestSegmentsAgreeWithTheReport(t *testing.T) {
	type at struct {
		name string
		snap func(t *testing.T) *snapshot.Snapshot
		key  string // p for the peak, o for the OOM
		want func(r *triage.Report) int64
	}
	torch := func(f string) func(t *testing.T) *snapshot.Snapshot {
		return func(t *testing.T) *snapshot.Snapshot {
			s, err := load.File(torchtest.FixturePath(t, f))
			if err != nil {
				t.Fatal(err)
			}
			return s
		}
	}
	atPeak := func(r *triage.Report) int64 { return r.Gaps.ReservedUnallocatedAtPeak }
	for _, tc := range []at{
		{"tiny-oom", func(t *testing.T) *snapshot.Snapshot { return fixture(t, "tiny-oom") }, "o", func(r *triage.Report) int64 { return *r.Gaps.ReservedUnallocatedAtOOM }},
		{"f4", torch(torchtest.F4), "p", atPeak},
		{"f7", torch(torchtest.F7), "p", atPeak},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := tc.snap(t)
			r := triage.Analyze(context.Background(), timeline.New(s), triage.Options{})
			m := newTestModel(t, s, 200, 40)
			press(m, tc.key, "3")
			out := screen(m)
			want := units.FormatSize(tc.want(r)) + " ("
			if !strings.Contains(out, want) {
				t.Errorf("the pane does not say %q, the report's reserved but unallocated:\n%s", want, out)
			}
			// To scale: each segment's map is its share of the largest one's.
			var largest int64
			for _, sg := range m.segs.segs {
				largest = max(largest, sg.Size)
			}
			mapW, drawn := 200-37, 0
			for _, line := range strings.Split(ansi.Strip(out), "\n") {
				for _, sg := range m.segs.segs {
					if strings.HasPrefix(line, " "+formatAddr(sg.Addr)) || strings.HasPrefix(line, "▸"+formatAddr(sg.Addr)) {
						drawn++
						cells := strings.Count(line, string(cellAllocated)) + strings.Count(line, string(cellPending)) + strings.Count(line, string(cellFree))
						if want := max(int(int64(mapW)*sg.Size/largest), 1); cells != want {
							t.Errorf("segment %#x of %d bytes takes %d cells, want %d", sg.Addr, sg.Size, cells, want)
						}
					}
				}
			}
			if drawn == 0 {
				t.Errorf("no segment is drawn:\n%s", out)
			}
		})
	}
}
