package snapshot

import (
	"iter"
	"slices"
)

// Events holds a snapshot's events in columns, in Seq order, with no pointers for the garbage collector to
// follow. An Event is materialised when it is asked for: At for one, Range for a run of them.
//
// A training loop repeats itself, and so do its events' fields: the same blocks are allocated at the same
// addresses, from the same stacks, in every iteration. So an event holds its action, its time and a reference
// to a row of the other fields (device, stream, address, sizes, category, scope, label, stack) that every
// event with the same values shares. Phase and iteration are kept as runs; the fields most events leave zero
// (Text, DeviceFree, Holder, Parent) are kept, shared the same way, only for the events that set one. A
// recorded training loop costs about 9 bytes an event; events that share nothing cost about 60.
//
// The columns only grow: what Append writes never changes afterwards. So a View, a copy of the first Len
// events, may be read by one goroutine while another appends to the Events it came from. The zero Events is
// empty and ready to use. An Events must not be copied while it is appended to; View makes the copy to read.
type Events struct {
	base   int // the seq of the first event held: 0 but for a page of a longer run
	n      int // events held
	expect int // the events (in all, from seq 0) Grow made room for

	action []Action
	row    []uint32 // the event's row in rows

	// Time: a base per block of timeBlock events held and an offset from it; an offset that does not fit is
	// timeSpill, and the time is in the exceptions, by seq.
	timeBase []int64
	timeOff  []uint32
	excSeq   []uint32
	excTime  []int64

	// Phase and iteration, as runs: run i starts at event runStart[i] (or before the first held, for run 0).
	runStart []uint32
	runPhase []Phase
	runIter  []int32

	rows rowColumns
	ctxs []devStream // device and stream, by index

	// The rarely set fields, for the events that set one, by seq: their row in rare.
	xSeq []uint32
	xRow []uint32
	rare rareColumns

	pack   *packer // the appending side's state; nil in a view
	paging bool    // Forget was called: a reader does not size the columns for a whole file
}

const (
	timeBlockBits = 10
	timeBlock     = 1 << timeBlockBits
	timeSpill     = ^uint32(0)
)

// rowColumns are the fields events share, by row. Row 0 is all zeros.
type rowColumns struct {
	addr      []uint64
	size      []int64
	blockSize []int64
	scope     []StringID
	label     []StringID
	stack     []StackID
	category  []Category
	ctx       []uint32
}

// rareColumns are the fields few events set, by row.
type rareColumns struct {
	text   []StringID
	free   []int64
	holder []uint64
	parent []uint64
}

// devStream is an event's device and stream.
type devStream struct {
	device int16
	stream int64
}

// packer is the state that lets Append share rows: hash tables of the rows by value, the previous event's
// row, and the device-stream pairs by value.
type packer struct {
	owner    *Events
	rows     rowIndex
	rare     rowIndex
	prevRow  uint32
	ctxs     map[devStream]uint32
	prevCtx  devStream // the previous event's device and stream, index prevCtxI: events come in runs of one
	prevCtxI uint32
	distinct bool // no search for an equal row: each event's row is new, but a free_completed's (DistinctEventsOf)
}

// MaxEvents is the most events an Events holds: seqs and rows are 32-bit.
const MaxEvents = 1<<32 - 2

// Len returns the seq after the last event: the number of events, when ev holds a whole run.
func (ev *Events) Len() int { return ev.base + ev.n }

// Base returns the seq of the first event held: 0 but for a page of a longer run (LoadPage, Forget). Events
// before it cannot be asked for.
func (ev *Events) Base() int { return ev.base }

// Cap returns the number of events room was made for: more than Len when a reader sized the columns for the
// events a file is expected to hold. An index built as the events arrive sizes its own columns by it.
func (ev *Events) Cap() int { return max(ev.expect, ev.Len()) }

// Grow makes room for n more events, so that appending them does not copy the columns.
func (ev *Events) Grow(n int) {
	if n <= 0 {
		return
	}
	ev.packer() // the room belongs to ev: a copy of it that appends copies the columns first
	ev.expect = max(ev.expect, ev.Len()+n)
	ev.action = slices.Grow(ev.action, n)
	ev.row = slices.Grow(ev.row, n)
	ev.timeOff = slices.Grow(ev.timeOff, n)
	ev.timeBase = slices.Grow(ev.timeBase, n/timeBlock+1)
}

// GrowRows makes room for n more distinct rows (what events share: address, sizes, stack, tags, device and
// stream; an allocation and its frees share one), for a writer that knows about how many its events hold.
func (ev *Events) GrowRows(n int) {
	if n <= 0 {
		return
	}
	p := ev.packer()
	r := &ev.rows
	r.addr, r.size, r.blockSize = slices.Grow(r.addr, n), slices.Grow(r.size, n), slices.Grow(r.blockSize, n)
	r.scope, r.label, r.stack = slices.Grow(r.scope, n), slices.Grow(r.label, n), slices.Grow(r.stack, n)
	r.category, r.ctx = slices.Grow(r.category, n), slices.Grow(r.ctx, n)
	p.rows.grow(len(r.addr)+n, ev.rows.hashRow)
}

// View returns a read-only copy of the first Len events. It shares the columns, which only grow, so it stays
// valid while ev is appended to.
func (ev *Events) View() Events {
	r, x := &ev.rows, &ev.rare
	return Events{
		base: ev.base, n: ev.n, expect: ev.expect, action: clip(ev.action), row: clip(ev.row), timeBase: clip(ev.timeBase), timeOff: clip(ev.timeOff),
		excSeq: clip(ev.excSeq), excTime: clip(ev.excTime), runStart: clip(ev.runStart), runPhase: clip(ev.runPhase),
		runIter: clip(ev.runIter), ctxs: clip(ev.ctxs), xSeq: clip(ev.xSeq), xRow: clip(ev.xRow),
		rows: rowColumns{addr: clip(r.addr), size: clip(r.size), blockSize: clip(r.blockSize), scope: clip(r.scope),
			label: clip(r.label), stack: clip(r.stack), category: clip(r.category), ctx: clip(r.ctx)},
		rare: rareColumns{text: clip(x.text), free: clip(x.free), holder: clip(x.holder), parent: clip(x.parent)},
	}
}

func clip[S ~[]E, E any](s S) S { return s[:len(s):len(s)] }

// EventsOf returns the events evs in columns; their Seq fields are ignored.
func EventsOf(evs ...Event) Events { return eventsOf(evs, false) }

// DistinctEventsOf is EventsOf for events whose shared fields seldom repeat, such as a transformed trace whose
// every allocation has an address of its own: each event takes a row of its own (a free_completed shares its
// free_requested's), which spares a search of every row for an equal one that is not there, a cache miss an
// event on a large trace.
func DistinctEventsOf(evs ...Event) Events { return eventsOf(evs, true) }

func eventsOf(evs []Event, distinct bool) Events {
	var ev Events
	ev.Grow(len(evs))
	// A free_completed shares its free_requested's row; most other events may need one of their own. Room
	// for them all up front spares the columns' and the index's growing, which costs more than filling them.
	rows := 0
	for i := range evs {
		if evs[i].Action != ActionFreeCompleted {
			rows++
		}
	}
	ev.GrowRows(rows)
	ev.packer().distinct = distinct
	for i := range evs {
		ev.Append(&evs[i])
	}
	return ev.View()
}

// Append adds e as event Len(); e.Seq is ignored. It panics past MaxEvents: readers cap events far below.
func (ev *Events) Append(e *Event) {
	p := ev.packer()

	// The shared fields: the previous event's row (a free_completed after its free_requested), an equal row,
	// or a new one.
	ctx := p.devStream(ev, e.Device, e.Stream)
	row := p.prevRow
	switch {
	case ev.rows.matches(row, e, ctx):
	case p.distinct:
		row = ev.rows.add(e, ctx)
		p.prevRow = row
	default:
		h := ev.rows.hash(e, ctx)
		var ok bool
		if row, ok = p.findRow(ev, h, e, ctx); !ok {
			row = ev.rows.add(e, ctx)
			p.rows.insert(h, row, func(r uint32) uint64 { return ev.rows.hashRow(r) })
		}
		p.prevRow = row
	}

	// The rare fields.
	xrow := int64(-1)
	if e.Text != 0 || e.DeviceFree != 0 || e.Holder != 0 || e.Parent != 0 {
		x := &ev.rare
		h := rareHash(e.Text, e.DeviceFree, e.Holder, e.Parent)
		match := func(r uint32) bool {
			return x.text[r] == e.Text && x.free[r] == e.DeviceFree && x.holder[r] == e.Holder && x.parent[r] == e.Parent
		}
		r, ok := p.rare.find(h, match)
		if !ok {
			r = uint32(len(x.text))
			x.text, x.free = append(x.text, e.Text), append(x.free, e.DeviceFree)
			x.holder, x.parent = append(x.holder, e.Holder), append(x.parent, e.Parent)
			p.rare.insert(h, r, func(r uint32) uint64 { return rareHash(x.text[r], x.free[r], x.holder[r], x.parent[r]) })
		}
		xrow = int64(r)
	}
	ev.appendRaw(e.Action, row, e.Time, e.Phase, e.Iteration, xrow)
}

// appendRaw adds an event whose row (and rare row, -1 for none) is known.
func (ev *Events) appendRaw(a Action, row uint32, t int64, phase Phase, iteration int32, xrow int64) {
	if int64(ev.Len()) >= MaxEvents {
		panic("snapshot: more than MaxEvents events")
	}
	i, seq := ev.n, uint32(ev.Len())
	ev.action = append(ev.action, a)
	ev.row = append(ev.row, row)
	if i&(timeBlock-1) == 0 {
		ev.timeBase = append(ev.timeBase, t)
	}
	if d := uint64(t - ev.timeBase[i>>timeBlockBits]); d < uint64(timeSpill) {
		ev.timeOff = append(ev.timeOff, uint32(d))
	} else {
		ev.timeOff = append(ev.timeOff, timeSpill)
		ev.excSeq = append(ev.excSeq, seq)
		ev.excTime = append(ev.excTime, t)
	}
	if k := len(ev.runStart) - 1; k < 0 || ev.runPhase[k] != phase || ev.runIter[k] != iteration {
		ev.runStart = append(ev.runStart, seq)
		ev.runPhase = append(ev.runPhase, phase)
		ev.runIter = append(ev.runIter, iteration)
	}
	if xrow >= 0 {
		ev.xSeq = append(ev.xSeq, seq)
		ev.xRow = append(ev.xRow, uint32(xrow))
	}
	ev.n++
}

// packer returns the appending state, starting one when ev is new, a view or a copy. A copy's columns are
// clipped first, so that appending to it cannot write into memory the original's views read.
func (ev *Events) packer() *packer {
	if p := ev.pack; p != nil && p.owner == ev {
		return p
	}
	paging := ev.paging
	*ev = ev.View()
	ev.paging = paging
	p := &packer{owner: ev, ctxs: map[devStream]uint32{}}
	if len(ev.ctxs) == 0 {
		ev.ctxs = append(ev.ctxs, devStream{})
	}
	for i, c := range ev.ctxs {
		p.ctxs[c] = uint32(i)
	}
	p.prevCtx = ev.ctxs[0]
	if len(ev.rows.addr) == 0 {
		ev.rows.add(&Event{}, 0)
	}
	for r := range len(ev.rows.addr) {
		p.rows.insert(ev.rows.hashRow(uint32(r)), uint32(r), ev.rows.hashRow)
	}
	x := &ev.rare
	rareRow := func(r uint32) uint64 { return rareHash(x.text[r], x.free[r], x.holder[r], x.parent[r]) }
	for r := range len(x.text) {
		p.rare.insert(rareRow(uint32(r)), uint32(r), rareRow)
	}
	ev.pack = p
	return p
}

// releasePacker drops the appending state once no more events will come: its hash tables are memory for
// nothing then. Appending again starts a new one.
func (ev *Events) releasePacker() { ev.pack = nil }

// devStream returns the index of (device, stream), adding it if new.
func (p *packer) devStream(ev *Events, device int16, stream int64) uint32 {
	c := devStream{device, stream}
	if c == p.prevCtx {
		return p.prevCtxI
	}
	i, ok := p.ctxs[c]
	if !ok {
		i = uint32(len(ev.ctxs))
		ev.ctxs = append(ev.ctxs, c)
		p.ctxs[c] = i
	}
	p.prevCtx, p.prevCtxI = c, i
	return i
}

func (r *rowColumns) add(e *Event, ctx uint32) uint32 {
	r.addr = append(r.addr, e.Addr)
	r.size = append(r.size, e.Size)
	r.blockSize = append(r.blockSize, e.BlockSize)
	r.scope = append(r.scope, e.Scope)
	r.label = append(r.label, e.Label)
	r.stack = append(r.stack, e.Stack)
	r.category = append(r.category, e.Category)
	r.ctx = append(r.ctx, ctx)
	return uint32(len(r.addr) - 1)
}

func (r *rowColumns) matches(i uint32, e *Event, ctx uint32) bool {
	return int(i) < len(r.addr) && r.addr[i] == e.Addr && r.size[i] == e.Size && r.blockSize[i] == e.BlockSize &&
		r.scope[i] == e.Scope && r.label[i] == e.Label && r.stack[i] == e.Stack && r.category[i] == e.Category &&
		r.ctx[i] == ctx
}

func (r *rowColumns) hash(e *Event, ctx uint32) uint64 {
	return rowHash(e.Addr, e.Size, e.BlockSize, e.Scope, e.Label, e.Stack, e.Category, ctx)
}

func (r *rowColumns) hashRow(i uint32) uint64 {
	return rowHash(r.addr[i], r.size[i], r.blockSize[i], r.scope[i], r.label[i], r.stack[i], r.category[i], r.ctx[i])
}

func rowHash(addr uint64, size, blockSize int64, scope, label StringID, stack StackID, c Category, ctx uint32) uint64 {
	h := mix(addr, uint64(size))
	h = mix(h, uint64(blockSize))
	h = mix(h, uint64(scope)|uint64(label)<<32)
	return mix(h, uint64(stack)|uint64(c)<<32|uint64(ctx)<<40)
}

func rareHash(text StringID, free int64, holder, parent uint64) uint64 {
	return mix(mix(mix(uint64(text), uint64(free)), holder), parent)
}

// mix folds v into h: a multiply-xorshift step, enough to spread addresses that differ in a few bits.
func mix(h, v uint64) uint64 {
	h ^= v + 0x9E3779B97F4A7C15 + h<<6 + h>>2
	h *= 0xBF58476D1CE4E5B9
	return h ^ h>>31
}

// findRow finds the row equal to e's shared fields, whose hash is h: rowIndex.find, written out for the
// rows, since most events take this path.
func (p *packer) findRow(ev *Events, h uint64, e *Event, ctx uint32) (uint32, bool) {
	x := &p.rows
	if len(x.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			return 0, false
		}
		if s>>32 == h>>32 && ev.rows.matches(uint32(s)-1, e, ctx) {
			return uint32(s) - 1, true
		}
	}
}

// rowIndex finds rows by their hash: open addressing over row numbers, with the hash's top bits kept to
// skip most unequal rows without reading them.
type rowIndex struct {
	slots []uint64 // row+1 in the low 32 bits (0: empty), the hash's top 32 bits above
	n     int
}

// find returns the row with hash h for which eq holds.
func (x *rowIndex) find(h uint64, eq func(uint32) bool) (uint32, bool) {
	if len(x.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(x.slots) - 1)
	for i := h & mask; ; i = (i + 1) & mask {
		s := x.slots[i]
		if s == 0 {
			return 0, false
		}
		if s>>32 == h>>32 && eq(uint32(s)-1) {
			return uint32(s) - 1, true
		}
	}
}

// insert adds row r with hash h; rehash gives the hash of a row when the table grows.
func (x *rowIndex) insert(h uint64, r uint32, rehash func(uint32) uint64) {
	if 2*(x.n+1) > len(x.slots) {
		x.grow(x.n+1, rehash)
	}
	x.put(h, h>>32<<32|uint64(r)+1)
}

// grow makes room for n rows in all, at most half the slots full, rehashing those held.
func (x *rowIndex) grow(n int, rehash func(uint32) uint64) {
	size := max(64, len(x.slots))
	for 2*n > size {
		size *= 2
	}
	if size == len(x.slots) {
		return
	}
	old := x.slots
	x.slots = make([]uint64, size)
	x.n = 0
	for _, s := range old {
		if s != 0 {
			x.put(rehash(uint32(s)-1), s)
		}
	}
}

func (x *rowIndex) put(h, slot uint64) {
	mask := uint64(len(x.slots) - 1)
	i := h & mask
	for x.slots[i] != 0 {
		i = (i + 1) & mask
	}
	x.slots[i] = slot
	x.n++
}

// Action returns the action of event seq.
func (ev *Events) Action(seq int) Action { return ev.action[seq-ev.base] }

// Actions returns the action of every event held, from Base on: the column hot loops scan. Do not modify it.
func (ev *Events) Actions() []Action { return ev.action[:ev.n:ev.n] }

// Time returns the time of event seq.
func (ev *Events) Time(seq int) int64 {
	i := seq - ev.base
	off := ev.timeOff[i]
	if off == timeSpill {
		x, _ := slices.BinarySearch(ev.excSeq, uint32(seq))
		return ev.excTime[x]
	}
	return ev.timeBase[i>>timeBlockBits] + int64(off)
}

// Phase returns the phase and iteration of event seq.
func (ev *Events) Phase(seq int) (Phase, int32) {
	run := max(ev.run(seq), 0)
	return ev.runPhase[run], ev.runIter[run]
}

// run returns the run holding event seq.
func (ev *Events) run(seq int) int {
	run, _ := slices.BinarySearch(ev.runStart, uint32(seq)+1)
	return max(run-1, 0)
}

// At returns event seq.
func (ev *Events) At(seq int) Event {
	var e Event
	ev.fill(&e, seq)
	e.Phase, e.Iteration = ev.Phase(seq)
	if x, ok := slices.BinarySearch(ev.xSeq, uint32(seq)); ok {
		ev.fillRare(&e, x)
	}
	return e
}

// Request is the part of an event an allocator replay reads: what was asked of which allocator, and where.
type Request struct {
	Action    Action
	Device    int16
	Stream    int64
	Addr      uint64
	Size      int64
	BlockSize int64
	Label     StringID
}

// Request returns the request of event seq. It reads only the columns a Request holds, so a loop over
// millions of events that needs no more pays for no more.
func (ev *Events) Request(seq int) Request {
	r := &ev.rows
	row := ev.row[seq-ev.base]
	c := ev.ctxs[r.ctx[row]]
	return Request{Action: ev.action[seq-ev.base], Device: c.device, Stream: c.stream, Addr: r.addr[row],
		Size: r.size[row], BlockSize: r.blockSize[row], Label: r.label[row]}
}

// fill sets the fields of e that come from the action, time and row columns.
func (ev *Events) fill(e *Event, seq int) {
	r := &ev.rows
	row := ev.row[seq-ev.base]
	c := ev.ctxs[r.ctx[row]]
	*e = Event{
		Seq: uint64(seq), Time: ev.Time(seq), Action: ev.action[seq-ev.base], Device: c.device, Stream: c.stream,
		Addr: r.addr[row], Size: r.size[row], BlockSize: r.blockSize[row], Category: r.category[row],
		Scope: r.scope[row], Label: r.label[row], Stack: r.stack[row],
	}
}

func (ev *Events) fillRare(e *Event, x int) {
	r, rare := ev.xRow[x], &ev.rare
	e.Text, e.DeviceFree, e.Holder, e.Parent = rare.text[r], rare.free[r], rare.holder[r], rare.parent[r]
}

// All returns every event held in order, with its seq.
func (ev *Events) All() iter.Seq2[int, Event] { return ev.Range(ev.base, ev.Len()) }

// Range returns events [from, to) in order, with their seqs. Bounds past the events are clipped.
func (ev *Events) Range(from, to int) iter.Seq2[int, Event] {
	return func(yield func(int, Event) bool) {
		from, to := max(from, ev.base), min(to, ev.Len())
		if from >= to {
			return
		}
		run := ev.run(from)
		x, _ := slices.BinarySearch(ev.xSeq, uint32(from))
		var e Event
		for seq := from; seq < to; seq++ {
			for run+1 < len(ev.runStart) && int(ev.runStart[run+1]) <= seq {
				run++
			}
			ev.fill(&e, seq)
			e.Phase, e.Iteration = ev.runPhase[run], ev.runIter[run]
			if x < len(ev.xSeq) && int(ev.xSeq[x]) == seq {
				ev.fillRare(&e, x)
				x++
			}
			if !yield(seq, e) {
				return
			}
		}
	}
}

// Fill materialises events from, from+1, ... into dst, as many as fit and exist, and returns how many: the
// way for a hot loop to read events in batches, without a call per event.
func (ev *Events) Fill(dst []Event, from int) int {
	if from < ev.base || from >= ev.Len() {
		return 0
	}
	dst = dst[:min(len(dst), ev.Len()-from)]
	run := ev.run(from)
	x, _ := slices.BinarySearch(ev.xSeq, uint32(from))
	for i := range dst {
		seq := from + i
		for run+1 < len(ev.runStart) && int(ev.runStart[run+1]) <= seq {
			run++
		}
		e := &dst[i]
		ev.fill(e, seq)
		e.Phase, e.Iteration = ev.runPhase[run], ev.runIter[run]
		if x < len(ev.xSeq) && int(ev.xSeq[x]) == seq {
			ev.fillRare(e, x)
			x++
		}
	}
	return len(dst)
}

// Slice returns events [from, to) as a slice of Event, for code that wants them so (tests, exports of a
// few events). It copies: a long range costs 112 bytes an event.
func (ev *Events) Slice(from, to int) []Event {
	from, to = max(from, ev.base), min(to, ev.Len())
	if from >= to {
		return nil
	}
	out := make([]Event, 0, to-from)
	for _, e := range ev.Range(from, to) {
		out = append(out, e)
	}
	return out
}

// Equal reports whether ev and o hold the same events.
func (ev *Events) Equal(o *Events) bool {
	if ev.n != o.n || ev.base != o.base {
		return false
	}
	var a, b [256]Event
	for from := ev.base; from < ev.Len(); from += len(a) {
		n := ev.Fill(a[:], from)
		if o.Fill(b[:n], from) != n || !slices.Equal(a[:n], b[:n]) {
			return false
		}
	}
	return true
}

// MapStacks replaces every event's stack s with f(s). It changes the columns in place: no View of ev may be in
// use.
func (ev *Events) MapStacks(f func(StackID) StackID) {
	for i, s := range ev.rows.stack {
		ev.rows.stack[i] = f(s)
	}
}

// Bytes returns the memory the columns hold, in bytes (their capacity, which Grow and appending set).
func (ev *Events) Bytes() int64 {
	r, x := &ev.rows, &ev.rare
	n := cap(ev.action) + 4*cap(ev.row) + 8*cap(ev.timeBase) + 4*cap(ev.timeOff) + 4*cap(ev.excSeq) + 8*cap(ev.excTime) +
		4*cap(ev.runStart) + cap(ev.runPhase) + 4*cap(ev.runIter) + 16*cap(ev.ctxs) + 4*cap(ev.xSeq) + 4*cap(ev.xRow) +
		8*cap(r.addr) + 8*cap(r.size) + 8*cap(r.blockSize) + 4*cap(r.scope) + 4*cap(r.label) + 4*cap(r.stack) +
		cap(r.category) + 4*cap(r.ctx) + 4*cap(x.text) + 8*cap(x.free) + 8*cap(x.holder) + 8*cap(x.parent)
	return int64(n)
}
