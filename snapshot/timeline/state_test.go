package timeline_test

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// TestResume indexes every trace page by page, each page's Timeline resumed from the State the previous one
// ended in and holding that page's events only, and checks every page against the Timeline of the whole
// run: the series, the live and active sets, the segments, the changes, and the spans pieced together.
func TestResume(t *testing.T) {
	for name, s := range traces(t) {
		t.Run(name, func(t *testing.T) {
			whole := timeline.New(s)
			n := s.Events.Len()
			rng := rand.New(rand.NewPCG(11, 12))
			var cuts []int
			for c := 0; c < n; c += 1 + rng.IntN(max(n/5, 1)) {
				cuts = append(cuts, c)
			}
			cuts = append(cuts, n)
			var st timeline.State
			var phases []timeline.PhaseSpan
			pages := &snapshot.Snapshot{Meta: s.Meta, Strings: s.Strings, Frames: s.Frames, Stacks: s.Stacks}
			var all snapshot.Events
			for k := 0; k+1 < len(cuts); k++ {
				from, to := cuts[k], cuts[k+1]
				// The page's events, and nothing before them.
				for _, e := range s.Events.Range(from, to) {
					all.Append(&e)
				}
				page, err := all.LoadPage(all.Page(from, to))
				if err != nil {
					t.Fatal(err)
				}
				all.Forget(to)
				ps := *pages
				ps.Events = page
				var tl *timeline.Timeline
				if k == 0 {
					tl = timeline.New(&ps)
				} else {
					if st.Seq() != from {
						t.Fatalf("the State is at %d, want %d", st.Seq(), from)
					}
					tl = timeline.Resume(&ps, st)
				}
				if tl.Base() != from || tl.Len() != to {
					t.Fatalf("page [%d, %d) indexed as [%d, %d)", from, to, tl.Base(), tl.Len())
				}
				for seq := from; seq < to; seq++ {
					for _, series := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
						if got, want := tl.Value(series, seq), whole.Value(series, seq); got != want {
							t.Fatalf("page [%d, %d): %s after event %d = %d, want %d", from, to, series, seq, got, want)
						}
					}
					if seq != from && seq != to-1 && rng.IntN(to-from) >= 16 {
						continue // about 16 events of each page
					}
					if got, want := tl.Value(timeline.Active, seq), whole.Value(timeline.Active, seq); got != want {
						t.Fatalf("page [%d, %d): active after event %d = %d, want %d", from, to, seq, got, want)
					}
					if got, want := asOf(tl.ActiveAt(seq, nil), to), asOf(whole.ActiveAt(seq, nil), to); !slices.Equal(got, want) {
						t.Fatalf("page [%d, %d): active set after event %d differs (%d and %d blocks)", from, to, seq, len(got), len(want))
					}
					if got, want := asOf(tl.LiveAt(seq, nil), to), asOf(whole.LiveAt(seq, nil), to); !slices.Equal(got, want) {
						t.Fatalf("page [%d, %d): live set after event %d differs", from, to, seq)
					}
					if got, want := segmentsOf(tl.SegmentsAt(seq)), segmentsOf(whole.SegmentsAt(seq)); !slices.Equal(got, want) {
						t.Fatalf("page [%d, %d): segments after event %d differ", from, to, seq)
					}
					if seq > from {
						got, want := tl.Changes(from, seq), whole.Changes(from, seq)
						if len(got.Allocated) != len(want.Allocated) || len(got.Freed) != len(want.Freed) || got.Transient != want.Transient || got.TransientBytes != want.TransientBytes {
							t.Fatalf("page [%d, %d): changes from %d to %d differ", from, to, from, seq)
						}
					}
				}
				for _, p := range tl.Phases() {
					if l := len(phases) - 1; l >= 0 && phases[l].End == p.Start && phases[l].Phase == p.Phase && phases[l].Iteration == p.Iteration {
						phases[l].End, phases[l].After = p.End, p.After // a span the cut went through
						continue
					}
					phases = append(phases, p)
				}
				st = tl.State()
			}
			end := whole.State()
			if st.Seq() != end.Seq() || st.Allocated() != end.Allocated() || !slices.Equal(asOf(slices.Clone(st.Live()), n), asOf(slices.Clone(end.Live()), n)) {
				t.Errorf("the last page ends in a State at %d with %d bytes and %d blocks; the whole run's is at %d with %d bytes and %d blocks",
					st.Seq(), st.Allocated(), len(st.Live()), end.Seq(), end.Allocated(), len(end.Live()))
			}
			if !slices.Equal(phases, whole.Phases()) {
				t.Errorf("the pages' phase spans pieced together differ from the whole run's (%d and %d spans)", len(phases), len(whole.Phases()))
			}
		})
	}
}

// asOf returns blocks as a Timeline that has indexed the events before end sees them: its frees after end
// have not happened yet. IDs are cleared: a resumed Timeline numbers blocks from those it carried.
func asOf(bs []timeline.Allocation, end int) []timeline.Allocation {
	for i := range bs {
		b := &bs[i]
		b.ID = 0
		if b.Free >= end {
			b.Free = -1
		}
		if b.Released >= end {
			b.Released = -1
		}
	}
	return bs
}

type segment struct {
	addr   uint64
	size   int64
	blocks int
	gaps   int
}

func segmentsOf(ss []timeline.SegmentState) []segment {
	var out []segment
	for _, s := range ss {
		out = append(out, segment{s.Addr, s.Size, len(s.Blocks), len(s.Gaps)})
	}
	return out
}
