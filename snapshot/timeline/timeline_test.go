package timeline_test

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// model is a plain replay of the Timeline's accounting rules, written for clarity, not speed: the truth the
// index is checked against.
type model struct {
	series [3][]int64
	// states[i] is the active blocks after event i, only for the sampled events.
	states map[int][]modelBlock
	ranges []modelRange
}

type modelBlock struct {
	alloc     int
	device    int16
	addr      uint64
	size      int64
	category  snapshot.Category
	label     snapshot.StringID
	requested bool // free requested: counted in active, not in allocated
}

type modelRange struct {
	device int16
	addr   uint64
	size   int64
}

func runModel(evs []snapshot.Event, sample func(int) bool) *model {
	m := &model{states: map[int][]modelBlock{}}
	var active []*modelBlock // in allocation order
	var allocated, reserved, act int64
	find := func(dev int16, addr uint64) int {
		for i, b := range active {
			if b.device == dev && b.addr == addr {
				return i
			}
		}
		return -1
	}
	release := func(i int) {
		b := active[i]
		if !b.requested {
			allocated -= b.size
		}
		act -= b.size
		active = slices.Delete(active, i, i+1)
	}
	for seq, e := range evs {
		switch e.Action {
		case snapshot.ActionAlloc:
			if i := find(e.Device, e.Addr); i >= 0 {
				release(i)
			}
			size := e.BlockSize
			if size <= 0 {
				size = max(e.Size, 0)
			}
			cat := e.Category
			if !cat.Valid() {
				cat = snapshot.CategoryUnknown
			}
			active = append(active, &modelBlock{alloc: seq, device: e.Device, addr: e.Addr, size: size, category: cat, label: e.Label})
			allocated += size
			act += size
		case snapshot.ActionFreeRequested:
			if i := find(e.Device, e.Addr); i >= 0 && !active[i].requested {
				active[i].requested = true
				allocated -= active[i].size
			}
		case snapshot.ActionFreeCompleted:
			if i := find(e.Device, e.Addr); i >= 0 {
				release(i)
			}
		case snapshot.ActionCategory:
			if i := find(e.Device, e.Addr); i >= 0 && !active[i].requested && e.Category.Valid() {
				active[i].category = e.Category
				if e.Label != 0 {
					active[i].label = e.Label
				}
			}
		case snapshot.ActionSegmentAlloc:
			m.ranges = append(m.ranges, modelRange{e.Device, e.Addr, e.Size})
			reserved += e.Size
		case snapshot.ActionSegmentMap:
			m.ranges = append(m.ranges, modelRange{e.Device, e.Addr, e.Size})
			reserved += e.Size
		case snapshot.ActionSegmentFree:
			// The random traces free only cudaMalloc'd segments, never mapped pages.
			if i := slices.IndexFunc(m.ranges, func(r modelRange) bool { return r.device == e.Device && r.addr == e.Addr }); i >= 0 {
				reserved -= m.ranges[i].size
				m.ranges = slices.Delete(m.ranges, i, i+1)
			}
		case snapshot.ActionSegmentUnmap:
			reserved -= m.cut(e.Device, e.Addr, e.Addr+uint64(e.Size))
		}
		m.series[0] = append(m.series[0], allocated)
		m.series[1] = append(m.series[1], reserved)
		m.series[2] = append(m.series[2], act)
		if sample(seq) {
			var st []modelBlock
			for _, b := range active {
				st = append(st, *b)
			}
			m.states[seq] = st
		}
	}
	return m
}

// cut removes [lo, hi) of device from the ranges and returns the bytes removed.
func (m *model) cut(dev int16, lo, hi uint64) int64 {
	var n int64
	var out []modelRange
	for _, r := range m.ranges {
		end := r.addr + uint64(r.size)
		a, b := max(r.addr, lo), min(end, hi)
		if r.device != dev || a >= b {
			out = append(out, r)
			continue
		}
		n += int64(b - a)
		if r.addr < a {
			out = append(out, modelRange{dev, r.addr, int64(a - r.addr)})
		}
		if b < end {
			out = append(out, modelRange{dev, b, int64(end - b)})
		}
	}
	m.ranges = out
	return n
}

// randomTrace is a hostile event stream: frees of blocks never allocated, double frees, allocs at live
// addresses, completions without requests, category changes of freed blocks, partial unmaps, segment frees
// of unknown segments, markers and heap dumps, on two devices.
func randomTrace(seed uint64, n int) []snapshot.Event {
	rng := rand.New(rand.NewPCG(seed, 1))
	addr := func() uint64 { return 0x1000 + uint64(rng.IntN(40))*0x200 }
	evs := make([]snapshot.Event, 0, n)
	iter, phase := int32(-1), snapshot.PhaseSetup
	for len(evs) < n {
		e := snapshot.Event{Seq: uint64(len(evs)), Time: int64(len(evs)), Device: int16(rng.IntN(2)), Phase: phase, Iteration: iter}
		switch r := rng.IntN(100); {
		case r < 35:
			e.Action, e.Addr = snapshot.ActionAlloc, addr()
			e.Size = int64(rng.IntN(4096))
			if rng.IntN(4) > 0 {
				e.BlockSize = (e.Size + 511) / 512 * 512
			}
			e.Category = snapshot.Category(rng.IntN(snapshot.NumCategories))
			e.Label = snapshot.StringID(rng.IntN(5))
			e.Scope = snapshot.StringID(rng.IntN(5))
			e.Stack = snapshot.StackID(rng.IntN(3))
		case r < 55:
			e.Action, e.Addr = snapshot.ActionFreeRequested, addr()
		case r < 72:
			e.Action, e.Addr = snapshot.ActionFreeCompleted, addr()
		case r < 80:
			e.Action, e.Addr = snapshot.ActionCategory, addr()
			e.Category = snapshot.Category(rng.IntN(snapshot.NumCategories))
			e.Label = snapshot.StringID(rng.IntN(3))
		case r < 84:
			e.Action, e.Addr, e.Size = snapshot.ActionSegmentAlloc, 0x100000*uint64(1+rng.IntN(8)), 0x100000
		case r < 86:
			e.Action, e.Addr, e.Size = snapshot.ActionSegmentMap, 0x10000000+0x200000*uint64(rng.IntN(6)), 0x200000
		case r < 89:
			e.Action, e.Addr = snapshot.ActionSegmentFree, 0x100000*uint64(1+rng.IntN(8))
		case r < 91:
			e.Action, e.Addr, e.Size = snapshot.ActionSegmentUnmap, 0x10000000+0x100000*uint64(rng.IntN(12)), 0x100000*int64(1+rng.IntN(3))
		case r < 94:
			e.Action = snapshot.ActionPhase
			phase = snapshot.Phase(1 + rng.IntN(snapshot.NumPhases-1))
			e.Phase = phase
		case r < 96:
			e.Action = snapshot.ActionIteration
			iter++
			e.Iteration = iter
		case r < 98:
			e.Action, e.Size, e.BlockSize = snapshot.ActionOOM, 1<<20, 2<<20
		default:
			e.Action = snapshot.ActionAnnotation
		}
		evs = append(evs, e)
	}
	return evs
}

// traces are the event streams the Timeline is checked on.
func traces(t testing.TB) map[string]*snapshot.Snapshot {
	leak := snapshottest.Tiny()
	leak.Iterations, leak.LeakLoss = 6, true
	return map[string]*snapshot.Snapshot{
		"tiny":     snapshottest.Trace(snapshottest.Tiny()),
		"leak":     snapshottest.Trace(leak),
		"hostile":  {Events: snapshot.EventsOf(randomTrace(1, 5000)...), Strings: []string{"", "a", "b", "c", "d"}},
		"hostile2": {Events: snapshot.EventsOf(randomTrace(2, 20000)...), Strings: []string{"", "a", "b", "c", "d"}},
		// Long enough for several checkpoints of the live set.
		"hostile3":   {Events: snapshot.EventsOf(randomTrace(3, 120000)...), Strings: []string{"", "a", "b", "c", "d"}},
		"gpt2-small": snapshottest.Trace(snapshottest.GPT2Small()),
	}
}

// values returns series s after every event.
func values(tl *timeline.Timeline, s timeline.Series) []int64 {
	out := make([]int64, tl.Len())
	for i := range out {
		out[i] = tl.Value(s, i)
	}
	return out
}

// changes returns the values of a series where it changes, starting with its first.
func changes(vals []int64) []int64 {
	var out []int64
	for i, v := range vals {
		if i == 0 || v != vals[i-1] {
			out = append(out, v)
		}
	}
	return out
}

func TestTimelineSeriesAndLiveSets(t *testing.T) {
	for name, s := range traces(t) {
		t.Run(name, func(t *testing.T) {
			sample := func(seq int) bool { return seq%97 == 0 || seq == s.Events.Len()-1 }
			m := runModel(s.Events.Slice(0, s.Events.Len()), sample)
			tl := timeline.New(s)
			if tl.Len() != s.Events.Len() {
				t.Fatalf("Len %d, want %d", tl.Len(), s.Events.Len())
			}
			for k, series := range []timeline.Series{timeline.Allocated, timeline.Reserved, timeline.Active} {
				for seq, want := range m.series[k] {
					if series == timeline.Active && !sample(seq) {
						continue // counted from the live set: each query costs one
					}
					if got := tl.Value(series, seq); got != want {
						t.Fatalf("%s after event %d (%s) = %d, want %d", series, seq, s.Events.At(seq).Action, got, want)
					}
				}
				if series != timeline.Active {
					var steps []int64
					for seq, v := range tl.Steps(series, 0, tl.Len()) {
						if len(steps) > 0 && v == steps[len(steps)-1] || seq > 0 && m.series[k][seq-1] == v || v != m.series[k][seq] {
							t.Fatalf("%s steps to %d after event %d, where the series goes from %d to %d", series, v, seq, m.series[k][max(seq-1, 0)], m.series[k][seq])
						}
						steps = append(steps, v)
					}
					if want := changes(m.series[k]); !slices.Equal(steps, want) {
						t.Fatalf("%s has %d steps, want %d", series, len(steps), len(want))
					}
				}
				want := timeline.Peak{Bytes: slices.Max(m.series[k]), Seq: slices.Index(m.series[k], slices.Max(m.series[k]))}
				if p := tl.Peak(series); p != want {
					t.Errorf("%s peak %+v, want %+v", series, p, want)
				}
			}
			for seq, want := range m.states {
				checkLive(t, tl, seq, want)
			}
		})
	}
}

func checkLive(t *testing.T, tl *timeline.Timeline, seq int, want []modelBlock) {
	t.Helper()
	active := tl.ActiveAt(seq, nil)
	live := tl.LiveAt(seq, nil)
	if len(active) != len(want) {
		t.Fatalf("after event %d: %d active blocks, want %d", seq, len(active), len(want))
	}
	var sumLive, sumActive int64
	j := 0
	for i, b := range active {
		w := want[i]
		if b.Alloc != w.alloc || b.Addr != w.addr || b.Device != w.device || b.Size != w.size || b.Category != w.category || b.Label != w.label {
			t.Fatalf("after event %d: active block %d is %+v, want %+v", seq, i, b, w)
		}
		if pending := b.Free >= 0 && b.Free <= seq; pending != w.requested {
			t.Fatalf("after event %d: block allocated at %d pending %v, want %v", seq, b.Alloc, pending, w.requested)
		}
		sumActive += b.Size
		if !w.requested {
			if j >= len(live) || live[j].Alloc != b.Alloc {
				t.Fatalf("after event %d: live set misses the block allocated at %d", seq, b.Alloc)
			}
			sumLive += b.Size
			j++
		}
	}
	if j != len(live) {
		t.Fatalf("after event %d: %d live blocks, want %d", seq, len(live), j)
	}
	if sumLive != tl.Allocated(seq) || sumActive != tl.Active(seq) {
		t.Fatalf("after event %d: live blocks sum to %d and %d, series say %d and %d", seq, sumLive, sumActive, tl.Allocated(seq), tl.Active(seq))
	}
}

// TestTimelineUpdate indexes a snapshot as it grows, in uneven pieces, and compares with indexing it whole.
func TestTimelineUpdate(t *testing.T) {
	for name, s := range traces(t) {
		t.Run(name, func(t *testing.T) {
			whole := timeline.New(s)
			grown := &snapshot.Snapshot{Meta: s.Meta, Strings: s.Strings, Frames: s.Frames, Stacks: s.Stacks}
			tl := timeline.New(grown)
			rng := rand.New(rand.NewPCG(3, 4))
			for grown.Events.Len() < s.Events.Len() {
				n := min(s.Events.Len()-grown.Events.Len(), 1+rng.IntN(3000))
				for _, e := range s.Events.Range(grown.Events.Len(), grown.Events.Len()+n) {
					grown.Events.Append(&e)
				}
				if got := tl.Update(); got != n {
					t.Fatalf("Update indexed %d events, want %d", got, n)
				}
			}
			for _, series := range []timeline.Series{timeline.Allocated, timeline.Reserved, timeline.Active} {
				for seq := range tl.Len() {
					if (series != timeline.Active || seq%101 == 0) && tl.Value(series, seq) != whole.Value(series, seq) {
						t.Fatalf("%s differs after event %d", series, seq)
					}
				}
				if a, b := tl.Range(series, 0, tl.Len()), whole.Range(series, 0, whole.Len()); a != b {
					t.Fatalf("%s range %v, want %v", series, a, b)
				}
				if a, b := tl.Peak(series), whole.Peak(series); a != b {
					t.Fatalf("%s peak %v, want %v", series, a, b)
				}
			}
			if !slices.Equal(tl.Phases(), whole.Phases()) || !slices.Equal(tl.Iterations(), whole.Iterations()) ||
				!slices.Equal(tl.HeapDumps(), whole.HeapDumps()) || tl.Stats() != whole.Stats() {
				t.Fatal("spans, heap dumps or stats differ")
			}
			for seq := 0; seq < s.Events.Len(); seq += 211 {
				if a, b := tl.LiveAt(seq, nil), whole.LiveAt(seq, nil); !slices.Equal(a, b) {
					t.Fatalf("live sets after event %d differ", seq)
				}
			}
			if tl.Update() != 0 {
				t.Error("Update with no new events indexed some")
			}
		})
	}
}

func TestTimelineRanges(t *testing.T) {
	s := traces(t)["hostile2"]
	m := runModel(s.Events.Slice(0, s.Events.Len()), func(int) bool { return false })
	tl := timeline.New(s)
	rng := rand.New(rand.NewPCG(5, 6))
	for range 2000 {
		from := rng.IntN(tl.Len())
		to := from + 1 + rng.IntN(tl.Len()-from)
		if rng.IntN(4) == 0 {
			to = min(tl.Len(), from+1+rng.IntN(40))
		}
		for k, series := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
			vals := m.series[k][from:to]
			want := timeline.Extent{Min: slices.Min(vals), Max: slices.Max(vals)}
			if got := tl.Range(series, from, to); got != want {
				t.Fatalf("%s range [%d, %d) = %v, want %v", series, from, to, got, want)
			}
			wantPeak := timeline.Peak{Bytes: want.Max, Seq: from + slices.Index(vals, want.Max)}
			if got := tl.PeakIn(series, from, to); got != wantPeak {
				t.Fatalf("%s peak in [%d, %d) = %+v, want %+v", series, from, to, got, wantPeak)
			}
		}
	}
	if got := tl.Range(timeline.Allocated, 10, 10); got != (timeline.Extent{}) {
		t.Errorf("empty range = %v", got)
	}
	if got := tl.PeakIn(timeline.Allocated, 5, 2); got.Seq != -1 {
		t.Errorf("peak of an empty range = %+v", got)
	}
}

func TestTimelineColumns(t *testing.T) {
	s := traces(t)["hostile"]
	vals := runModel(s.Events.Slice(0, s.Events.Len()), func(int) bool { return false }).series[0]
	tl := timeline.New(s)
	tests := map[string]struct{ from, to, width int }{
		"whole, narrow":        {0, tl.Len(), 80},
		"zoomed":               {1234, 1500, 200},
		"more columns":         {100, 130, 80},
		"one event":            {7, 8, 3},
		"past the end clipped": {tl.Len() - 10, tl.Len() + 50, 20},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			cols := tl.Columns(timeline.Allocated, tc.from, tc.to, make([]timeline.Extent, tc.width))
			to := min(tc.to, tl.Len())
			n := to - tc.from
			for c, got := range cols {
				lo, hi := tc.from+c*n/tc.width, tc.from+(c+1)*n/tc.width
				if hi <= lo {
					hi = lo + 1
				}
				hi = min(hi, to)
				want := timeline.Extent{Min: slices.Min(vals[lo:hi]), Max: slices.Max(vals[lo:hi])}
				if got != want {
					t.Fatalf("column %d = %v, want %v", c, got, want)
				}
			}
		})
	}
}

// TestTimelineSpans checks the phase and iteration spans of the generated training loop against its
// markers, and the bytes by category at their edges against the live sets.
func TestTimelineSpans(t *testing.T) {
	s := traces(t)["tiny"]
	tl := timeline.New(s)
	var markers []int
	for i, e := range s.Events.All() {
		if e.Action == snapshot.ActionPhase {
			markers = append(markers, i)
		}
	}
	phases := tl.Phases()
	if len(phases) != len(markers) {
		t.Fatalf("%d phase spans, want one per phase marker (%d)", len(phases), len(markers))
	}
	for i, p := range phases {
		if p.Start != markers[i] {
			t.Errorf("span %d starts at %d, want the marker at %d", i, p.Start, markers[i])
		}
		want := s.Events.Len() // the last span runs to the end
		if i+1 < len(markers) {
			want = markers[i+1]
		}
		if p.End != want {
			t.Errorf("span %d ends at %d, want %d", i, p.End, want)
		}
		if p.Before != timeline.CategoryBytes(tl.LiveAt(p.Start-1, nil)) || p.After != timeline.CategoryBytes(tl.LiveAt(p.End-1, nil)) {
			t.Errorf("span %d (%s %d): bytes by category at its edges disagree with the live sets", i, p.Phase, p.Iteration)
		}
		if e := s.Events.At(p.Start); e.Phase != p.Phase || e.Iteration != p.Iteration {
			t.Errorf("span %d is %s/%d, its marker %s/%d", i, p.Phase, p.Iteration, e.Phase, e.Iteration)
		}
		if got := tl.PhaseAt(p.End - 1); got != i {
			t.Errorf("PhaseAt(%d) = %d, want %d", p.End-1, got, i)
		}
	}
	its := tl.Iterations()
	want := []int32{-1, 0, 1, 2}
	if len(its) != len(want) {
		t.Fatalf("%d iteration spans, want %d", len(its), len(want))
	}
	for i, it := range its {
		if it.Iteration != want[i] {
			t.Errorf("iteration span %d is %d, want %d", i, it.Iteration, want[i])
		}
		if i > 0 && s.Events.At(it.Start).Action != snapshot.ActionIteration {
			t.Errorf("iteration %d starts at a %s event, want its marker", it.Iteration, s.Events.At(it.Start).Action)
		}
		if tl.IterationAt(it.Start) != i || tl.IterationAt(it.End-1) != i {
			t.Errorf("IterationAt disagrees with span %d", i)
		}
	}
	if tl.PhaseAt(-1) != -1 || tl.IterationAt(s.Events.Len()) != -1 {
		t.Error("PhaseAt or IterationAt found a span outside the events")
	}
}

func TestTimelineRetainers(t *testing.T) {
	s := traces(t)["leak"]
	tl := timeline.New(s)
	dumps := tl.HeapDumps()
	if len(dumps) != 6 {
		t.Fatalf("%d heap dumps, want one per iteration (6)", len(dumps))
	}
	for _, d := range dumps {
		for i := d.Seq + 1; i <= d.Seq+d.Edges; i++ {
			if s.Events.At(i).Action != snapshot.ActionRetain {
				t.Fatalf("heap dump at %d claims a %s event at %d", d.Seq, s.Events.At(i).Action, i)
			}
		}
		if next := d.Seq + d.Edges + 1; next < s.Events.Len() && s.Events.At(next).Action == snapshot.ActionRetain {
			t.Fatalf("heap dump at %d misses the retain event at %d", d.Seq, next)
		}
	}
	// The leaked losses: every "loss" block alive at the end is held by loss_history[i].
	end := tl.Len() - 1
	found := 0
	for _, b := range tl.LiveAt(end, nil) {
		if !strings.HasSuffix(s.String(b.Label), " loss") {
			continue
		}
		found++
		p, ok := tl.RetainerPath(b, end)
		if !ok {
			t.Fatalf("no retainer for the loss allocated at %d", b.Alloc)
		}
		if root := p.Root(); !strings.HasPrefix(root, "loss_history[") || len(p.Holders) != 1 || p.Dump.Seq != dumps[len(dumps)-1].Seq {
			t.Errorf("loss allocated at %d: path %+v", b.Alloc, p)
		}
	}
	if found != 6 {
		t.Errorf("%d leaked losses alive at the end, want 6", found)
	}
	// A parameter is its own root; a temporary freed before every dump has no retainer.
	params := tl.LiveAt(end, nil)[:1]
	if p, ok := tl.RetainerPath(params[0], 0); !ok || !strings.HasPrefix(p.Root(), "parameter ") || p.Dump.Seq != dumps[0].Seq {
		t.Errorf("first parameter: path %+v, %v; want the first dump's parameter root", p, ok)
	}
	for id := range tl.NumAllocations() {
		b := tl.Allocation(id, end)
		if b.Category == snapshot.CategoryTemporary && b.Free >= 0 && b.Free < dumps[0].Seq {
			if _, ok := tl.RetainerPath(b, b.Alloc); ok {
				t.Fatalf("temporary allocated at %d, freed at %d before any dump, has a retainer", b.Alloc, b.Free)
			}
			break
		}
	}
}

func TestTimelineChanges(t *testing.T) {
	s := traces(t)["hostile"]
	tl := timeline.New(s)
	rng := rand.New(rand.NewPCG(7, 8))
	for range 200 {
		from := rng.IntN(tl.Len() - 1)
		to := from + 1 + rng.IntN(min(tl.Len()-from-1, 600))
		c := tl.Changes(from, to)
		before, after := tl.LiveAt(from, nil), tl.LiveAt(to, nil)
		inBefore := map[int]bool{}
		for _, b := range before {
			inBefore[b.Alloc] = true
		}
		inAfter := map[int]bool{}
		for _, b := range after {
			inAfter[b.Alloc] = true
		}
		var added, freed []int
		for _, b := range after {
			if !inBefore[b.Alloc] {
				added = append(added, b.Alloc)
			}
		}
		for _, b := range before {
			if !inAfter[b.Alloc] {
				freed = append(freed, b.Alloc)
			}
		}
		allocs := func(bs []timeline.Allocation) []int {
			var out []int
			for _, b := range bs {
				out = append(out, b.Alloc)
			}
			return out
		}
		if !slices.Equal(allocs(c.Allocated), added) || !slices.Equal(allocs(c.Freed), freed) {
			t.Fatalf("changes (%d, %d]: allocated %v freed %v, want %v and %v", from, to, allocs(c.Allocated), allocs(c.Freed), added, freed)
		}
		var delta int64
		for _, b := range c.Allocated {
			delta += b.Size
		}
		for _, b := range c.Freed {
			delta -= b.Size
		}
		if delta != tl.Allocated(to)-tl.Allocated(from) {
			t.Fatalf("changes (%d, %d] sum to %d, allocated moved by %d", from, to, delta, tl.Allocated(to)-tl.Allocated(from))
		}
	}
}

// TestTimelinePreexisting is an imported trace that starts mid-run: frees of blocks and segments the trace
// never saw allocated are counted and leave the totals alone.
func TestTimelinePreexisting(t *testing.T) {
	evs := []snapshot.Event{
		{Action: snapshot.ActionFreeRequested, Addr: 0x10, Size: 100, BlockSize: 512},
		{Action: snapshot.ActionFreeCompleted, Addr: 0x10, Size: 100, BlockSize: 512},
		{Action: snapshot.ActionSegmentFree, Addr: 0x1000, Size: 2 << 20},
		{Action: snapshot.ActionAlloc, Addr: 0x20, Size: 700},
		{Action: snapshot.ActionFreeCompleted, Addr: 0x30, Size: 700},
		{Action: snapshot.ActionFreeRequested, Addr: 0x20, Size: 700},
	}
	for i := range evs {
		evs[i].Seq = uint64(i)
	}
	tl := timeline.New(&snapshot.Snapshot{Events: snapshot.EventsOf(evs...)})
	want := []int64{0, 0, 0, 700, 700, 0}
	if got := values(tl, timeline.Allocated); !slices.Equal(got, want) {
		t.Errorf("allocated %v, want %v (the requested size, as the trace has no block size)", got, want)
	}
	st := tl.Stats()
	if st.UnmatchedFrees != 2 || st.UnmatchedSegmentFrees != 1 || st.Blocks != 1 || st.ByAction[snapshot.ActionFreeCompleted] != 2 {
		t.Errorf("stats %+v", st)
	}
	if len(tl.Phases()) != 1 || tl.Phases()[0].Phase != snapshot.PhaseNone || len(tl.Iterations()) != 1 {
		t.Errorf("spans %+v %+v, want one pseudo-phase and one pseudo-iteration", tl.Phases(), tl.Iterations())
	}
	if segs := tl.SegmentsAt(5); segs != nil {
		t.Errorf("segments %+v of a trace that never allocated one", segs)
	}
}

// TestTimelineSegments replays the generator's caching allocator and compares the segments after the last
// event with the final state the footer records.
func TestTimelineSegments(t *testing.T) {
	s := traces(t)["leak"]
	tl := timeline.New(s)
	segs := tl.SegmentsAt(tl.Len() - 1)
	want := s.Footer.Segments
	if len(segs) != len(want) {
		t.Fatalf("%d segments, the footer has %d", len(segs), len(want))
	}
	for i, sg := range segs {
		w := want[i]
		if sg.Addr != w.Addr || sg.Size != w.Size {
			t.Fatalf("segment %d at %#x of %d, footer %#x of %d", i, sg.Addr, sg.Size, w.Addr, w.Size)
		}
		var wantBlocks []snapshot.Block
		var free int64
		for _, b := range w.Blocks {
			if b.State == "active_allocated" {
				wantBlocks = append(wantBlocks, b)
			} else {
				free += b.Size
			}
		}
		if len(sg.Blocks) != len(wantBlocks) {
			t.Fatalf("segment %#x: %d blocks, footer %d", sg.Addr, len(sg.Blocks), len(wantBlocks))
		}
		for j, b := range sg.Blocks {
			if b.Addr != wantBlocks[j].Addr || b.Size != wantBlocks[j].Size || b.Requested != wantBlocks[j].Requested {
				t.Fatalf("segment %#x block %d: %#x %d %d, footer %+v", sg.Addr, j, b.Addr, b.Size, b.Requested, wantBlocks[j])
			}
		}
		// The generator caches blocks without merging neighbours; gaps are merged free ranges, and the
		// segment's never-carved tail is a gap too.
		var gaps int64
		for _, g := range sg.Gaps {
			gaps += g.Size
		}
		if gaps != sg.Size-sg.Allocated() || gaps < free {
			t.Fatalf("segment %#x: gaps of %d bytes, %d free in the footer, %d unallocated", sg.Addr, gaps, free, sg.Size-sg.Allocated())
		}
	}
	var reserved int64
	for _, sg := range segs {
		reserved += sg.Size
	}
	if reserved != tl.Reserved(tl.Len()-1) {
		t.Errorf("segments hold %d bytes, reserved is %d", reserved, tl.Reserved(tl.Len()-1))
	}
}

// TestSegmentsExpandable maps and unmaps pages of an expandable segment: contiguous mappings are one
// segment, an unmap in the middle splits it.
func TestSegmentsExpandable(t *testing.T) {
	const base = 0x7000_0000
	mib := int64(1 << 20)
	evs := []snapshot.Event{
		{Action: snapshot.ActionSegmentMap, Addr: base, Size: 20 * mib},
		{Action: snapshot.ActionSegmentMap, Addr: base + uint64(20*mib), Size: 20 * mib},
		{Action: snapshot.ActionAlloc, Addr: base, Size: 30 * mib, BlockSize: 30 * mib},
		{Action: snapshot.ActionSegmentUnmap, Addr: base + uint64(32*mib), Size: 4 * mib},
		{Action: snapshot.ActionSegmentUnmap, Addr: base + uint64(100*mib), Size: 4 * mib},
	}
	for i := range evs {
		evs[i].Seq = uint64(i)
	}
	tl := timeline.New(&snapshot.Snapshot{Events: snapshot.EventsOf(evs...)})
	if got := values(tl, timeline.Reserved); !slices.Equal(got, []int64{20 * mib, 40 * mib, 40 * mib, 36 * mib, 36 * mib}) {
		t.Errorf("reserved %v", got)
	}
	if tl.Stats().UnmatchedSegmentFrees != 1 {
		t.Errorf("the unmap of memory never mapped was not counted: %+v", tl.Stats())
	}
	segs := tl.SegmentsAt(2)
	if len(segs) != 1 || segs[0].Size != 40*mib || !segs[0].Expandable || len(segs[0].Blocks) != 1 ||
		!slices.Equal(segs[0].Gaps, []timeline.Gap{{Addr: base + uint64(30*mib), Size: 10 * mib}}) {
		t.Fatalf("after two mappings: %+v", segs)
	}
	segs = tl.SegmentsAt(4)
	if len(segs) != 2 || segs[0].Size != 32*mib || segs[1].Addr != base+uint64(36*mib) || segs[1].Size != 4*mib {
		t.Fatalf("after the unmap: %+v", segs)
	}
}

func TestGroupBlocks(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	tl := timeline.New(s)
	peak := tl.Peak(timeline.Allocated)
	live := tl.LiveAt(peak.Seq, nil)
	for _, d := range []timeline.Dimension{timeline.ByCategory, timeline.ByPhase, timeline.ByIteration, timeline.ByScope, timeline.ByStack, timeline.ByLabel} {
		t.Run(d.String(), func(t *testing.T) {
			groups := timeline.GroupBlocks(live, d)
			var sum int64
			count := 0
			for i, g := range groups {
				sum += g.Bytes
				count += g.Count
				if i > 0 && g.Bytes > groups[i-1].Bytes {
					t.Errorf("group %d (%d bytes) after a smaller one", i, g.Bytes)
				}
				if timeline.GroupName(s, d, g.Key) == "" {
					t.Errorf("group %d has no name", i)
				}
			}
			if sum != peak.Bytes || count != len(live) {
				t.Errorf("groups hold %d bytes in %d blocks, the peak %d in %d", sum, count, peak.Bytes, len(live))
			}
		})
	}
	by := timeline.CategoryBytes(live)
	for _, g := range timeline.GroupBlocks(live, timeline.ByCategory) {
		if by[g.Key] != g.Bytes {
			t.Errorf("category %s: group of %d bytes, CategoryBytes %d", snapshot.Category(g.Key), g.Bytes, by[g.Key])
		}
	}
}

// TestAllocationAsOf checks that a block's category and label are those of the event asked about, and
// that a block is found by its place while it lives.
func TestAllocationAsOf(t *testing.T) {
	s := snapshottest.Trace(snapshottest.Tiny())
	tl := timeline.New(s)
	changed := 0
	for seq, e := range s.Events.All() {
		if e.Action != snapshot.ActionCategory {
			continue
		}
		b, ok := tl.AllocationAt(e.Device, e.Addr, seq)
		if !ok {
			t.Fatalf("category event %d: no block at %#x", seq, e.Addr)
		}
		before, after := tl.Allocation(b.ID, seq-1), tl.Allocation(b.ID, seq)
		if after.Category != e.Category || before.Category != s.Events.At(b.Alloc).Category {
			t.Fatalf("block %d: %s before the change at %d, %s after; want %s then %s", b.ID, before.Category, seq,
				after.Category, s.Events.At(b.Alloc).Category, e.Category)
		}
		changed++
		if b.Released >= 0 {
			if again, ok := tl.AllocationAt(e.Device, e.Addr, b.Released); ok && again.ID == b.ID {
				t.Fatalf("block %d still found after its release at %d", b.ID, b.Released)
			}
		}
	}
	if changed == 0 {
		t.Fatal("the trace has no category changes: the test shows nothing")
	}
	if _, ok := tl.AllocationAt(0, 0xdead, tl.Len()-1); ok {
		t.Error("a block at an address never allocated")
	}
}
