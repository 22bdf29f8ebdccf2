package snapshot_test

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// randomEvents are events with every field set at random, in ways a training loop never sets them: times
// that jump by hours and go backwards, many devices and streams, frees that differ from their allocs, and the
// rare fields on any action.
func randomEvents(seed uint64, n int) []snapshot.Event {
	rng := rand.New(rand.NewPCG(seed, 7))
	evs := make([]snapshot.Event, n)
	var t int64
	for i := range evs {
		switch rng.IntN(20) {
		case 0:
			t += int64(rng.Uint64() >> 20) // hours
		case 1:
			t -= int64(rng.IntN(1 << 20))
		case 2:
			t = math.MinInt64 + int64(rng.IntN(4))
		default:
			t += int64(rng.IntN(5000))
		}
		e := snapshot.Event{
			Time: t, Action: snapshot.Action(1 + rng.IntN(snapshot.NumActions-1)), Device: int16(rng.IntN(3) - 1),
			Stream: int64(rng.IntN(3)) << 40, Addr: uint64(rng.IntN(64)) * 512, Size: int64(rng.IntN(4096)),
			BlockSize: int64(rng.IntN(3)) * 512, Phase: snapshot.Phase(rng.IntN(snapshot.NumPhases)),
			Iteration: int32(rng.IntN(3) - 1), Category: snapshot.Category(rng.IntN(snapshot.NumCategories)),
			Scope: snapshot.StringID(rng.IntN(4)), Label: snapshot.StringID(rng.IntN(4)), Stack: snapshot.StackID(rng.IntN(4)),
		}
		if rng.IntN(4) == 0 {
			e.Text, e.DeviceFree = snapshot.StringID(rng.IntN(9)), int64(rng.IntN(3))
			e.Holder, e.Parent = rng.Uint64N(5), rng.Uint64()
		}
		evs[i] = e
	}
	return evs
}

// TestEventsRoundTrip checks that every event comes back from the columns as it went in, by At, Range,
// Slice, Time, Phase, Action and Request, for a generated training loop and for random events.
func TestEventsRoundTrip(t *testing.T) {
	traces := map[string][]snapshot.Event{
		"random": randomEvents(1, 30000),
		"gpt2-small": func() []snapshot.Event {
			s := snapshottest.Trace(snapshottest.GPT2Small())
			return s.Events.Slice(0, s.Events.Len())
		}(),
		"empty": nil,
	}
	for name, want := range traces {
		for _, of := range []struct {
			name string
			f    func(...snapshot.Event) snapshot.Events
		}{{"EventsOf", snapshot.EventsOf}, {"DistinctEventsOf", snapshot.DistinctEventsOf}} {
			t.Run(name+"/"+of.name, func(t *testing.T) { roundTrip(t, want, of.f) })
		}
	}
}

// roundTrip checks that the events want come back from the columns of(want...) as they went in.
func roundTrip(t *testing.T, want []snapshot.Event, of func(...snapshot.Event) snapshot.Events) {
	for i := range want {
		want[i].Seq = uint64(i)
	}
	evs := of(want...)
	if evs.Len() != len(want) {
		t.Fatalf("Len %d, want %d", evs.Len(), len(want))
	}
	for i, w := range want {
		if got := evs.At(i); got != w {
			t.Fatalf("At(%d) = %+v, want %+v", i, got, w)
		}
		r := snapshot.Request{Action: w.Action, Device: w.Device, Stream: w.Stream, Addr: w.Addr, Size: w.Size,
			BlockSize: w.BlockSize, Label: w.Label}
		if got := evs.Request(i); got != r {
			t.Fatalf("Request(%d) = %+v, want %+v", i, got, r)
		}
		if evs.Time(i) != w.Time || evs.Action(i) != w.Action {
			t.Fatalf("event %d: Time %d, Action %s; want %d, %s", i, evs.Time(i), evs.Action(i), w.Time, w.Action)
		}
		if p, it := evs.Phase(i); p != w.Phase || it != w.Iteration {
			t.Fatalf("event %d: Phase %s %d, want %s %d", i, p, it, w.Phase, w.Iteration)
		}
	}
	if got := evs.Slice(0, evs.Len()); len(want) > 0 && !slices.Equal(got, want) {
		t.Fatal("Slice of all the events differs")
	}
	rng := rand.New(rand.NewPCG(2, 3))
	for range 50 {
		from := rng.IntN(len(want) + 1)
		to := from + rng.IntN(len(want)-from+1)
		n := 0
		for seq, e := range evs.Range(from, to) {
			if seq != from+n || e != want[seq] {
				t.Fatalf("Range(%d, %d) yields event %d as %+v, want %+v", from, to, seq, e, want[from+n])
			}
			n++
		}
		if n != to-from {
			t.Fatalf("Range(%d, %d) yields %d events", from, to, n)
		}
	}
	if !slices.Equal(evs.Actions(), actions(want)) {
		t.Error("Actions differs")
	}
}

func actions(evs []snapshot.Event) []snapshot.Action {
	out := make([]snapshot.Action, len(evs))
	for i, e := range evs {
		out[i] = e.Action
	}
	return out
}

// TestEventsShareRows checks what the columns are for: a training loop's events cost far less than an Event
// each, because frees share their alloc's row.
func TestEventsShareRows(t *testing.T) {
	s := snapshottest.Trace(snapshottest.GPT2Small())
	perEvent := float64(s.Events.Bytes()) / float64(s.Events.Len())
	if perEvent > 32 {
		t.Errorf("%.1f bytes an event, want at most 32", perEvent)
	}
}

// TestEventsView appends in one goroutine while another reads Views of what was appended: every View holds
// the events it was made with, whatever is appended after (run with -race).
func TestEventsView(t *testing.T) {
	want := randomEvents(4, 20000)
	for i := range want {
		want[i].Seq = uint64(i)
	}
	var evs snapshot.Events
	views := make(chan snapshot.Events, 8)
	var wg sync.WaitGroup
	wg.Go(func() {
		for v := range views {
			for seq, e := range v.All() {
				if e != want[seq] {
					t.Errorf("a View of %d events has event %d as %+v, want %+v", v.Len(), seq, e, want[seq])
					return
				}
			}
		}
	})
	for i := range want {
		evs.Append(&want[i])
		if i%997 == 0 {
			views <- evs.View()
		}
	}
	close(views)
	wg.Wait()
}

// TestEventsCopy checks that appending to a copy of an Events leaves the original and its Views alone.
func TestEventsCopy(t *testing.T) {
	all := randomEvents(5, 3000)
	for i := range all {
		all[i].Seq = uint64(i)
	}
	var a snapshot.Events
	for i := range all[:2000] {
		a.Append(&all[i])
	}
	view := a.View()
	b := a // a copy, then both grow apart
	for i := range all[2000:] {
		b.Append(&all[2000+i])
		e := all[i]
		a.Append(&e)
	}
	for i := range 2000 {
		if view.At(i) != all[i] || a.At(i) != all[i] || b.At(i) != all[i] {
			t.Fatalf("event %d differs after the copies grew", i)
		}
	}
	for i := 2000; i < 3000; i++ {
		if b.At(i) != all[i] {
			t.Fatalf("the copy's event %d differs", i)
		}
		w := all[i-2000]
		w.Seq = uint64(i)
		if a.At(i) != w {
			t.Fatalf("the original's event %d differs", i)
		}
	}
}

// TestEventsPages pages random events and a training loop out and back, and forgets events while appending:
// what comes back is what went in, and the row tables are shared, not copied.
func TestEventsPages(t *testing.T) {
	for name, want := range map[string][]snapshot.Event{
		"random": randomEvents(6, 20000),
		"gpt2-small": func() []snapshot.Event {
			s := snapshottest.Trace(snapshottest.GPT2Small())
			return s.Events.Slice(0, s.Events.Len())
		}(),
	} {
		t.Run(name, func(t *testing.T) {
			for i := range want {
				want[i].Seq = uint64(i)
			}
			var evs snapshot.Events
			var pages [][]byte
			var starts []int
			from := 0
			rng := rand.New(rand.NewPCG(8, 9))
			for i := range want {
				evs.Append(&want[i])
				if rng.IntN(3000) == 0 || i == len(want)-1 {
					pages, starts = append(pages, evs.Page(from, i+1)), append(starts, from)
					evs.Forget(i + 1)
					from = i + 1
					if evs.Base() != from || evs.Len() != from {
						t.Fatalf("after Forget(%d): Base %d, Len %d", from, evs.Base(), evs.Len())
					}
				}
			}
			if len(pages) < 5 {
				t.Fatalf("only %d pages", len(pages))
			}
			bytes := 0
			for k, p := range pages {
				bytes += len(p)
				got, err := evs.LoadPage(p)
				if err != nil {
					t.Fatal(err)
				}
				end := len(want)
				if k+1 < len(starts) {
					end = starts[k+1]
				}
				if got.Base() != starts[k] || got.Len() != end {
					t.Fatalf("page %d holds [%d, %d), want [%d, %d)", k, got.Base(), got.Len(), starts[k], end)
				}
				for seq, e := range got.All() {
					if e != want[seq] {
						t.Fatalf("page %d: event %d is %+v, want %+v", k, seq, e, want[seq])
					}
					if got.At(seq) != e || got.Time(seq) != e.Time {
						t.Fatalf("page %d: At(%d) differs from All", k, seq)
					}
				}
			}
			three, err := evs.LoadPage(pages[1:4]...)
			if err != nil {
				t.Fatal(err)
			}
			if three.Base() != starts[1] || three.Len() != starts[4] {
				t.Fatalf("pages 1 to 3 hold [%d, %d), want [%d, %d)", three.Base(), three.Len(), starts[1], starts[4])
			}
			for seq, e := range three.All() {
				if e != want[seq] {
					t.Fatalf("pages 1 to 3: event %d is %+v, want %+v", seq, e, want[seq])
				}
			}
			if _, err := evs.LoadPage(pages[1], pages[3]); err == nil {
				t.Error("LoadPage took pages that do not follow each other")
			}
			if _, err := evs.LoadPage([]byte("not a page")); err == nil {
				t.Error("LoadPage took bytes Page did not make")
			}
			t.Logf("%d events in %d pages of %.2f bytes an event", len(want), len(pages), float64(bytes)/float64(len(want)))
		})
	}
}

// TestEstimateEvents checks the estimate from chunk headers against the events a file holds: exact for a file
// of few chunks, within a few percent for one of many.
func TestEstimateEvents(t *testing.T) {
	for _, tc := range []struct {
		iterations, chunk int
		exact             bool
	}{{3, 0, true}, {40, 20, false}} {
		cfg := snapshottest.GPT2Small()
		cfg.Iterations = tc.iterations
		var b bytes.Buffer
		var opts []snapshot.WriterOption
		if tc.chunk > 0 {
			opts = append(opts, snapshot.WithChunkEvents(tc.chunk))
		}
		if err := snapshottest.Encode(&b, cfg, opts...); err != nil {
			t.Fatal(err)
		}
		s, err := snapshot.Read(bytes.NewReader(b.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		got, exact := snapshot.EstimateEvents(bytes.NewReader(b.Bytes()), int64(b.Len()))
		want := int64(s.Events.Len())
		if exact != tc.exact || exact && got != want || !exact && (got < want*9/10 || got > want*11/10) {
			t.Errorf("%d iterations: estimate %d (exact %v), the file holds %d", tc.iterations, got, exact, want)
		}
	}
	if n, _ := snapshot.EstimateEvents(bytes.NewReader([]byte("not a snapshot at all")), 21); n != 0 {
		t.Errorf("an estimate of %d events for a file that is not a snapshot", n)
	}
}
