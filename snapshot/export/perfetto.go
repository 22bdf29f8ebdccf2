package export

import (
	"bufio"
	"io"
	"strconv"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Perfetto writes tl's snapshot in the Chrome Trace Event Format (JSON), which ui.perfetto.dev and
// chrome://tracing open:
//
//   - counter tracks ("C" events) of allocated and reserved bytes, the device's capacity, the allocated bytes
//     of each category and any device readings (NVML), each written only when its value changes;
//   - complete slices ("X") for every iteration on one track and every phase on another, with the bytes
//     before and after and the peak inside in their args;
//   - instants ("i") for the peak, each OOM (a global instant: a line across every track), heap dumps,
//     annotations, and event mark when it is not negative (what --at names).
//
// Timestamps are microseconds from Event.Time; a snapshot whose times are event indices (Meta.TimeUnit
// "index") gets one microsecond per event. Counter tracks of a long snapshot are decimated to about a million
// events in all, keeping the lowest and the highest value of every stretch of events, so no peak is lost.
func Perfetto(w io.Writer, tl *timeline.Timeline, mark int) error {
	_, err := perfetto(w, tl, traceOptions{mark: mark, budget: maxCounterEvents})
	return err
}

// traceOptions configure a trace beyond Perfetto's arguments.
type traceOptions struct {
	mark   int // the event to mark, or -1
	budget int // counter events, about
	// seq numbers events in names and args: a device view's events by their seq in the whole snapshot.
	// nil keeps the Timeline's numbering.
	seq []int
}

// eventNumber is the number the trace shows for event i.
func (o traceOptions) eventNumber(i int) int { return origSeq(o.seq, i) }

// maxCounterEvents caps the counter events of a trace; past it, tracks are decimated.
const maxCounterEvents = 1 << 20

// Perfetto's tracks: one process, three threads.
const (
	perfettoPID   = 1
	tidIterations = 1
	tidPhases     = 2
	tidEvents     = 3
)

type traceWriter struct {
	w      *bufio.Writer
	buf    []byte
	evs    *snapshot.Events
	n      int  // events exported
	index  bool // times are event indices
	o      traceOptions
	events int
	err    error
}

// ts appends the microsecond timestamp of event time t.
func (tw *traceWriter) ts(b []byte, t int64) []byte {
	if tw.index {
		return strconv.AppendInt(b, t, 10)
	}
	return appendMicros(b, t)
}

// appendMicros writes nanoseconds as microseconds with three decimals, exactly: 2341707 is 2341.707.
func appendMicros(b []byte, ns int64) []byte {
	if ns < 0 {
		b = append(b, '-')
		ns = -ns
	}
	b = strconv.AppendInt(b, ns/1000, 10)
	frac := ns % 1000
	if frac == 0 {
		return b
	}
	b = append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
	return b
}

// begin starts one trace event: the separator, ph, pid, tid and name.
func (tw *traceWriter) begin(ph byte, tid int, name string) {
	if tw.events > 0 {
		tw.buf = append(tw.buf, ",\n"...)
	}
	tw.events++
	tw.buf = append(tw.buf, `{"ph":"`...)
	tw.buf = append(tw.buf, ph)
	tw.buf = append(tw.buf, `","pid":`...)
	tw.buf = strconv.AppendInt(tw.buf, perfettoPID, 10)
	if tid != 0 {
		tw.buf = append(tw.buf, `,"tid":`...)
		tw.buf = strconv.AppendInt(tw.buf, int64(tid), 10)
	}
	tw.buf = append(tw.buf, `,"name":`...)
	tw.buf = appendJSONString(tw.buf, name)
}

// at appends the event's timestamp: the time of event seq.
func (tw *traceWriter) at(seq int) {
	tw.buf = append(tw.buf, `,"ts":`...)
	tw.buf = tw.ts(tw.buf, tw.time(seq))
}

func (tw *traceWriter) time(seq int) int64 {
	seq = max(0, min(seq, tw.n-1))
	if tw.index {
		return int64(seq)
	}
	return tw.evs.Time(seq)
}

// end closes the event and hands full buffers to the writer.
func (tw *traceWriter) end() {
	tw.buf = append(tw.buf, '}')
	if len(tw.buf) >= 32<<10 && tw.err == nil {
		_, tw.err = tw.w.Write(tw.buf)
		tw.buf = tw.buf[:0]
	}
}

// args is a builder for an event's args object.
type args struct {
	tw    *traceWriter
	first bool
}

func (tw *traceWriter) args() args {
	tw.buf = append(tw.buf, `,"args":{`...)
	return args{tw: tw, first: true}
}

func (a *args) key(k string) {
	if !a.first {
		a.tw.buf = append(a.tw.buf, ',')
	}
	a.first = false
	a.tw.buf = appendJSONString(a.tw.buf, k)
	a.tw.buf = append(a.tw.buf, ':')
}

func (a *args) int(k string, v int64) {
	a.key(k)
	a.tw.buf = strconv.AppendInt(a.tw.buf, v, 10)
}

func (a *args) str(k, v string) {
	a.key(k)
	a.tw.buf = appendJSONString(a.tw.buf, v)
}

func (a *args) close() { a.tw.buf = append(a.tw.buf, '}') }

// perfetto writes the trace and returns how many trace events it holds.
func perfetto(w io.Writer, tl *timeline.Timeline, o traceOptions) (int, error) {
	s := tl.Snapshot()
	n := tl.Len()
	tw := &traceWriter{w: bufio.NewWriterSize(w, 64<<10), buf: make([]byte, 0, 64<<10), evs: &s.Events, n: n,
		index: s.Meta.TimeUnit == "index", o: o}
	tw.buf = append(tw.buf, `{"displayTimeUnit":"ms","otherData":{"tool":"oomdbg","title":`...)
	tw.buf = appendJSONString(tw.buf, Title(s.Meta))
	tw.buf = append(tw.buf, `,"time_unit":`...)
	tw.buf = appendJSONString(tw.buf, s.Meta.TimeUnit)
	tw.buf = append(tw.buf, "},\n\"traceEvents\":[\n"...)

	tw.metadata(s.Meta)
	if n > 0 {
		tw.counters(tl)
		tw.spans(tl)
		tw.instants(tl)
	}
	tw.buf = append(tw.buf, "\n]}\n"...)
	if tw.err == nil {
		_, tw.err = tw.w.Write(tw.buf)
	}
	if tw.err == nil {
		tw.err = tw.w.Flush()
	}
	return tw.events, tw.err
}

// metadata names the process and its threads, in the order they should be shown.
func (tw *traceWriter) metadata(m snapshot.Meta) {
	tw.begin('M', 0, "process_name")
	a := tw.args()
	a.str("name", Title(m))
	a.close()
	tw.end()
	for i, name := range []string{"iterations", "phases", "events"} {
		tid := i + 1
		tw.begin('M', tid, "thread_name")
		a := tw.args()
		a.str("name", name)
		a.close()
		tw.end()
		tw.begin('M', tid, "thread_sort_index")
		a = tw.args()
		a.int("sort_index", int64(tid))
		a.close()
		tw.end()
	}
}

// point is a counter value after event seq.
type point struct {
	seq int
	v   int64
}

// track is one counter track: its name and its change points in seq order.
type track struct {
	name   string
	points []point
}

// seriesTrack returns the change points of a series: its first value and every change.
func seriesTrack(name string, tl *timeline.Timeline, s timeline.Series) track {
	t := track{name: name}
	for seq, v := range tl.Steps(s, 0, tl.Len()) {
		t.points = append(t.points, point{seq, v})
	}
	return t
}

// categoryTracks replays the events into the allocated bytes of every category, with the accounting of the
// Timeline: a block counts from its alloc until its free is requested, in the category it has at the time
// (category events move it). It returns a track for each category that ever holds bytes.
func categoryTracks(s *snapshot.Snapshot, n int) []track {
	type block struct {
		size  int64
		cat   snapshot.Category
		ended bool // its free was requested
	}
	live := make(map[blockKey]*block)
	var cur [snapshot.NumCategories]int64
	var points [snapshot.NumCategories][]point
	used := [snapshot.NumCategories]bool{}
	change := func(seq int, c snapshot.Category, delta int64) {
		cur[c] += delta
		p := &points[c]
		if l := len(*p); l > 0 && (*p)[l-1].seq == seq {
			(*p)[l-1].v = cur[c]
		} else {
			*p = append(*p, point{seq, cur[c]})
		}
		used[c] = true
	}
	end := func(seq int, b *block) {
		if !b.ended {
			b.ended = true
			change(seq, b.cat, -b.size)
		}
	}
	for seq, ev := range s.Events.Range(0, n) {
		e := &ev
		k := blockKey{e.Device, e.Addr}
		switch e.Action {
		case snapshot.ActionAlloc:
			if old, ok := live[k]; ok {
				end(seq, old)
			}
			c := e.Category
			if !c.Valid() {
				c = snapshot.CategoryUnknown
			}
			size := e.BlockSize
			if size <= 0 {
				size = max(e.Size, 0)
			}
			b := &block{size: size, cat: c}
			live[k] = b
			change(seq, c, size)
		case snapshot.ActionFreeRequested:
			if b, ok := live[k]; ok {
				end(seq, b)
			}
		case snapshot.ActionFreeCompleted:
			if b, ok := live[k]; ok {
				end(seq, b)
				delete(live, k)
			}
		case snapshot.ActionCategory:
			if b, ok := live[k]; ok && !b.ended && e.Category.Valid() && e.Category != b.cat {
				change(seq, b.cat, -b.size)
				b.cat = e.Category
				change(seq, b.cat, b.size)
			}
		}
	}
	var out []track
	for c := range snapshot.NumCategories {
		if used[c] {
			out = append(out, track{name: "allocated: " + snapshot.Category(c).String(), points: points[c]})
		}
	}
	return out
}

// counters writes the counter tracks.
func (tw *traceWriter) counters(tl *timeline.Timeline) {
	budget := tw.o.budget
	s := tl.Snapshot()
	n := tl.Len()
	tracks := []track{
		seriesTrack("allocated", tl, timeline.Allocated),
		seriesTrack("reserved", tl, timeline.Reserved),
	}
	if len(s.Meta.Devices) == 1 && s.Meta.Devices[0].Capacity > 0 {
		c := s.Meta.Devices[0].Capacity
		tracks = append(tracks, track{name: "capacity", points: []point{{0, c}, {n - 1, c}}})
	}
	tracks = append(tracks, categoryTracks(s, n)...)
	// Device readings (NVML's used bytes next to the allocator's reserved bytes), one track per source.
	readings := make(map[snapshot.StringID]int)
	for seq, ev := range s.Events.Range(0, n) {
		e := &ev
		if e.Action != snapshot.ActionSample {
			continue
		}
		i, ok := readings[e.Text]
		if !ok {
			i = len(tracks)
			readings[e.Text] = i
			tracks = append(tracks, track{name: "device: " + cmpOr(s.String(e.Text), "reading")})
		}
		tracks[i].points = append(tracks[i].points, point{seq, e.Size})
	}

	total := 0
	for _, t := range tracks {
		total += len(t.points)
	}
	for _, t := range tracks {
		limit := len(t.points)
		if total > budget {
			limit = max(1000, int(int64(budget)*int64(len(t.points))/int64(total)))
		}
		decimate(t.points, n, limit, func(p point) {
			tw.begin('C', 0, t.name)
			tw.at(p.seq)
			a := tw.args()
			a.int("bytes", p.v)
			a.close()
			tw.end()
		})
	}
}

// decimate calls emit with the points of a step series to draw: all of them when there are at most limit,
// else, for each of limit/2 equal stretches of the n events, the lowest and the highest point in their order,
// so that the drawing keeps every peak and every trough (averaging would hide them).
func decimate(points []point, n, limit int, emit func(point)) {
	if len(points) <= limit {
		for _, p := range points {
			emit(p)
		}
		return
	}
	buckets := max(limit/2, 1)
	i := 0
	for k := 0; k < buckets && i < len(points); k++ {
		hi := int((int64(k) + 1) * int64(n) / int64(buckets))
		lo, top := points[i], points[i]
		j := i
		for ; j < len(points) && points[j].seq < hi; j++ {
			if points[j].v < lo.v {
				lo = points[j]
			}
			if points[j].v > top.v {
				top = points[j]
			}
		}
		if j == i { // no change in this stretch
			continue
		}
		i = j
		switch {
		case lo.seq == top.seq:
			emit(lo)
		case lo.seq < top.seq:
			emit(lo)
			emit(top)
		default:
			emit(top)
			emit(lo)
		}
	}
}

// spans writes a slice for every iteration and every phase.
func (tw *traceWriter) spans(tl *timeline.Timeline) {
	n := tl.Len()
	for _, it := range tl.Iterations() {
		name := "setup"
		if it.Iteration >= 0 {
			name = "iteration " + strconv.Itoa(int(it.Iteration))
		}
		tw.slice(tl, tidIterations, name, "iteration", it.Iteration, it.Start, it.End, n)
	}
	for _, p := range tl.Phases() {
		if p.Phase == snapshot.PhaseNone {
			continue
		}
		tw.slice(tl, tidPhases, p.Phase.String(), "phase", p.Iteration, p.Start, p.End, n)
	}
}

// slice writes an X event over events [start, end): from the first event's time to the time of the event
// after the last (the next span's first), with the memory it saw.
func (tw *traceWriter) slice(tl *timeline.Timeline, tid int, name, cat string, iteration int32, start, end, n int) {
	t0, t1 := tw.time(start), tw.time(min(end, n-1))
	tw.begin('X', tid, name)
	tw.buf = append(tw.buf, `,"cat":`...)
	tw.buf = appendJSONString(tw.buf, cat)
	tw.at(start)
	tw.buf = append(tw.buf, `,"dur":`...)
	tw.buf = tw.ts(tw.buf, t1-t0)
	a := tw.args()
	a.int("iteration", int64(iteration))
	a.int("first_event", int64(tw.o.eventNumber(start)))
	a.int("events", int64(end-start))
	before := int64(0)
	if start > 0 {
		before = tl.Allocated(start - 1)
	}
	a.int("allocated_before", before)
	a.int("allocated_after", tl.Allocated(end-1))
	peak := tl.PeakIn(timeline.Allocated, start, end)
	a.int("allocated_peak", peak.Bytes)
	a.int("reserved_peak", tl.PeakIn(timeline.Reserved, start, end).Bytes)
	a.close()
	tw.end()
}

// instants writes the peak, the OOMs, heap dumps, annotations and the marked event.
func (tw *traceWriter) instants(tl *timeline.Timeline) {
	mark := tw.o.mark
	s := tl.Snapshot()
	instant := func(scope byte, name string, seq int, more func(a *args)) {
		tw.begin('i', tidEvents, name)
		tw.buf = append(tw.buf, `,"s":"`...)
		tw.buf = append(tw.buf, scope, '"')
		tw.at(seq)
		a := tw.args()
		a.int("event", int64(tw.o.eventNumber(seq)))
		if more != nil {
			more(&a)
		}
		a.close()
		tw.end()
	}
	if p := tl.Peak(timeline.Allocated); p.Seq >= 0 {
		instant('t', "peak allocated "+units.FormatSize(p.Bytes), p.Seq, func(a *args) {
			a.int("allocated", p.Bytes)
			a.int("reserved", tl.Reserved(p.Seq))
		})
	}
	for _, seq := range tl.OOMs() {
		e := s.Events.At(seq)
		instant('g', "OOM allocating "+units.FormatSize(e.BlockSize), seq, func(a *args) {
			a.int("requested", e.Size)
			a.int("alloc_size", e.BlockSize)
			a.int("device_free", e.DeviceFree)
			a.str("phase", e.Phase.String())
			a.int("iteration", int64(e.Iteration))
			if v := s.String(e.Scope); v != "" {
				a.str("scope", v)
			}
			if v := s.String(e.Label); v != "" {
				a.str("tensor", v)
			}
		})
	}
	for _, d := range tl.HeapDumps() {
		instant('t', "heap dump: "+cmpOr(d.Reason, "requested"), d.Seq, func(a *args) {
			a.int("retainer_edges", int64(d.Edges))
		})
	}
	for _, seq := range tl.Annotations() {
		e := s.Events.At(seq)
		name := s.String(e.Text)
		if l := s.String(e.Label); l != "" {
			name += " (" + l + ")"
		}
		instant('t', name, seq, nil)
	}
	if mark >= 0 && mark < tl.Len() {
		instant('t', "at event "+strconv.Itoa(tw.o.eventNumber(mark)), mark, func(a *args) {
			a.int("allocated", tl.Allocated(mark))
			a.int("reserved", tl.Reserved(mark))
		})
	}
}
