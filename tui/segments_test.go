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

// TestSegmentsShowTheirStreams: with segments on two streams (the two-stream trace the replay holds to
// PyTorch's rules), the pane says what each stream holds and tags each segment with its stream. The view
// opens at the trace's peak (its 16th entry): stream 0 holds its 20 MiB segment, whose two blocks were freed
// and merged, and its 40 MiB one in use; the unshard-like stream 94742130589440 its two 40 MiB segments,
// one reused.
func TestSegmentsShowTheirStreams(t *testing.T) {
	s, err := load.File("../allocator/replay/testdata/multistream.json")
	if err != nil {
		t.Fatal(err)
	}
	m := newTestModel(t, s, 160, 30)
	press(m, "3")
	out := ansi.Strip(screen(m))
	for _, want := range []string{"s0: 2 segments, 60.00 MiB, 20.00 MiB free", "s94742130589440: 2 segments, 80.00 MiB, 0 B free",
		formatAddr(0x7f0004000000) + "  20.00 MiB   0% s0 ", formatAddr(0x7f0000000000) + "  40.00 MiB 100% s94742130589440 "} {
		if !strings.Contains(out, want) {
			t.Errorf("the pane lacks %q:\n%s", want, out)
		}
	}
}
