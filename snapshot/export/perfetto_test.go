package export

import (
	"bytes"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/charmbracelet/x/exp/golden"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

func TestPerfettoGolden(t *testing.T) {
	var buf bytes.Buffer
	if err := Perfetto(&buf, timeline.New(fixture()), 13); err != nil {
		t.Fatal(err)
	}
	golden.RequireEqual(t, buf.Bytes())
}

// traceEvent is an event of the Trace Event Format, as a viewer reads it.
type traceEvent struct {
	Ph   string
	Pid  int
	Tid  int
	Name string
	Ts   *float64
	Dur  *float64
	S    string
	Args map[string]any
}

func decodeTrace(t *testing.T, data []byte) []traceEvent {
	t.Helper()
	var doc struct {
		TraceEvents     []traceEvent
		DisplayTimeUnit string
	}
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatalf("the trace is not JSON: %v", err)
	}
	if doc.DisplayTimeUnit != "ms" || len(doc.TraceEvents) == 0 {
		t.Fatalf("displayTimeUnit %q, %d events", doc.DisplayTimeUnit, len(doc.TraceEvents))
	}
	return doc.TraceEvents
}

// TestPerfettoTrace decodes the trace of every snapshot and checks it against the Timeline: the counters
// replay the allocated and reserved series change by change, a slice stands for every phase and iteration,
// an instant for every OOM, and every event is one a viewer knows.
func TestPerfettoTrace(t *testing.T) {
	for name, s := range snapshots(t) {
		t.Run(name, func(t *testing.T) {
			tl := timeline.New(s)
			var buf bytes.Buffer
			if err := Perfetto(&buf, tl, -1); err != nil {
				t.Fatal(err)
			}
			counters := map[string][]int64{}
			ooms := 0
			for _, e := range decodeTrace(t, buf.Bytes()) {
				if e.Pid != perfettoPID {
					t.Fatalf("event %+v outside the process", e)
				}
				switch e.Ph {
				case "M":
				case "C":
					counters[e.Name] = append(counters[e.Name], int64(e.Args["bytes"].(float64)))
				case "X":
					if e.Ts == nil || e.Dur == nil || *e.Dur < 0 {
						t.Fatalf("slice %+v without a time or with a negative duration", e)
					}
				case "i":
					if strings.HasPrefix(e.Name, "OOM") {
						ooms++
						if e.S != "g" {
							t.Errorf("OOM instant of scope %q, want global", e.S)
						}
					}
				default:
					t.Fatalf("event of phase %q", e.Ph)
				}
			}
			for series, name := range map[timeline.Series]string{timeline.Allocated: "allocated", timeline.Reserved: "reserved"} {
				var want []int64
				for i := range tl.Len() {
					if v := tl.Value(series, i); i == 0 || v != want[len(want)-1] {
						want = append(want, v)
					}
				}
				if !slices.Equal(counters[name], want) {
					t.Errorf("%s counter has %d values, want the %d changes of the series", name, len(counters[name]), len(want))
				}
			}
			if ooms != len(tl.OOMs()) {
				t.Errorf("%d OOM instants, want %d", ooms, len(tl.OOMs()))
			}
		})
	}
}

// TestPerfettoSlices counts the fixture's slices: one per iteration (setup included) and one per phase.
func TestPerfettoSlices(t *testing.T) {
	tl := timeline.New(fixture())
	var buf bytes.Buffer
	if err := Perfetto(&buf, tl, -1); err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range decodeTrace(t, buf.Bytes()) {
		if e.Ph == "X" {
			names = append(names, e.Name)
		}
	}
	want := []string{"setup", "iteration 0", "iteration 1", "setup", "data", "forward", "backward", "optimizer", "zero_grad", "data", "forward"}
	if !slices.Equal(names, want) {
		t.Errorf("slices %q, want %q", names, want)
	}
}

// TestCategoryTracks checks the per-category counters against the Timeline at every event: their sum is the
// allocated bytes, whatever categories changed on the way.
func TestCategoryTracks(t *testing.T) {
	for name, s := range snapshots(t) {
		t.Run(name, func(t *testing.T) {
			tl := timeline.New(s)
			tracks := categoryTracks(s, tl.Len())
			next := make([]int, len(tracks))
			cur := make([]int64, len(tracks))
			for seq := range tl.Len() {
				sum := int64(0)
				for k, tr := range tracks {
					for next[k] < len(tr.points) && tr.points[next[k]].seq == seq {
						cur[k] = tr.points[next[k]].v
						next[k]++
					}
					sum += cur[k]
				}
				if sum != tl.Allocated(seq) {
					t.Fatalf("after event %d (%s) the categories hold %d bytes, the Timeline %d", seq, s.Events.At(seq).Action, sum, tl.Allocated(seq))
				}
			}
			// And by category at the peak, against the Timeline's live set.
			peak := tl.Peak(timeline.Allocated).Seq
			want := timeline.CategoryBytes(tl.LiveAt(peak, nil))
			for _, tr := range tracks {
				c, _ := snapshot.ParseCategory(strings.TrimPrefix(tr.name, "allocated: "))
				v := int64(0)
				for _, p := range tr.points {
					if p.seq <= peak {
						v = p.v
					}
				}
				if v != want[c] {
					t.Errorf("%s at the peak: %d, want %d", tr.name, v, want[c])
				}
			}
		})
	}
}

// TestDecimate checks that decimation keeps within its limit and never loses the highest or the lowest point.
func TestDecimate(t *testing.T) {
	saw := func(n, spike int) []point {
		var pts []point
		for i := range n {
			v := int64(i % 100)
			if i == spike {
				v = 1 << 40
			}
			pts = append(pts, point{seq: i, v: v})
		}
		return pts
	}
	tests := map[string]struct {
		points []point
		n      int
		limit  int
		all    bool
	}{
		"fits":           {saw(100, 50), 100, 1000, true},
		"spike kept":     {saw(100000, 77777), 100000, 1000, false},
		"spike at start": {saw(100000, 0), 100000, 500, false},
		"spike at end":   {saw(100000, 99999), 100000, 500, false},
		"sparse":         {[]point{{0, 5}, {90000, 1}, {99990, 9}}, 100000, 2, false},
		"limit of one":   {saw(5000, 4000), 5000, 1, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []point
			decimate(tc.points, tc.n, tc.limit, func(p point) { got = append(got, p) })
			if tc.all && !slices.Equal(got, tc.points) {
				t.Fatalf("%d of %d points kept under the limit", len(got), len(tc.points))
			}
			if len(got) > max(tc.limit, 2) {
				t.Errorf("%d points, limit %d", len(got), tc.limit)
			}
			if !slices.IsSortedFunc(got, func(a, b point) int { return a.seq - b.seq }) {
				t.Error("points out of order")
			}
			top := slices.MaxFunc(tc.points, func(a, b point) int { return int(a.v - b.v) })
			bottom := slices.MinFunc(tc.points, func(a, b point) int { return int(a.v - b.v) })
			if !slices.Contains(got, top) || !slices.ContainsFunc(got, func(p point) bool { return p.v == bottom.v }) {
				t.Errorf("lost the highest %v or the lowest %v: %v", top, bottom, first(got, 10))
			}
		})
	}
}
