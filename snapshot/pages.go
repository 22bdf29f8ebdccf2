package snapshot

import (
	"encoding/binary"
	"errors"
	"slices"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// Pages: a run too long to hold in memory event by event is kept as pages, each the events of a range of
// seqs in a compact encoding, compressed; a page is loaded back when a program wants its events. The shared
// rows stay with the Events the pages came from, which keeps growing while the run is read; only the
// per-event columns (action, row, time, phase and iteration, rare fields) are paged. A training loop's pages
// take 1 to 3 bytes an event. Pages live in memory only: they are not a file format.

// Page returns events [from, to) as a page: compressed, and only meaningful to LoadPage on ev or an Events
// it grew into.
func (ev *Events) Page(from, to int) []byte {
	from, to = max(from, ev.base), min(to, ev.Len())
	to = max(to, from)
	b := make([]byte, 0, 16+6*(to-from))
	b = binary.AppendUvarint(b, uint64(from))
	b = binary.AppendUvarint(b, uint64(to-from))
	for _, a := range ev.action[from-ev.base : to-ev.base] {
		b = append(b, byte(a))
	}
	for _, r := range ev.row[from-ev.base : to-ev.base] {
		b = binary.AppendUvarint(b, uint64(r))
	}
	prev := int64(0)
	for seq := from; seq < to; seq++ {
		t := ev.Time(seq)
		b = binary.AppendVarint(b, t-prev)
		prev = t
	}
	first, last := ev.run(from), ev.run(max(to-1, from))
	b = binary.AppendUvarint(b, uint64(last-first+1))
	for k := first; k <= last; k++ {
		start := max(int(ev.runStart[k]), from)
		b = binary.AppendUvarint(b, uint64(start-from))
		b = append(b, byte(ev.runPhase[k]))
		b = binary.AppendVarint(b, int64(ev.runIter[k]))
	}
	lo, _ := slices.BinarySearch(ev.xSeq, uint32(from))
	hi, _ := slices.BinarySearch(ev.xSeq, uint32(to))
	b = binary.AppendUvarint(b, uint64(hi-lo))
	at := uint32(from)
	for x := lo; x < hi; x++ {
		b = binary.AppendUvarint(b, uint64(ev.xSeq[x]-at))
		b = binary.AppendUvarint(b, uint64(ev.xRow[x]))
		at = ev.xSeq[x]
	}
	enc := pageEncoder()
	defer pageEncoders.Put(enc)
	out := enc.EncodeAll(b, make([]byte, 0, len(b)/4))
	if cap(out)-len(out) > len(out)/8 {
		out = slices.Clone(out) // a page is kept for the run's life: not with a quarter of it empty
	}
	return out
}

// errPage is what LoadPage returns for bytes Page did not make.
var errPage = errors.New("snapshot: not a page of these events")

// LoadPage returns the events of pages Page made from ev (or from the Events ev grew from), one after the
// other: a read-only Events whose Base is the first page's first seq, sharing ev's rows.
func (ev *Events) LoadPage(pages ...[]byte) (Events, error) {
	out := ev.View() // the tables, clipped: ev may still grow them
	out = Events{rows: out.rows, rare: out.rare, ctxs: out.ctxs}
	dec := pageDecoder()
	defer pageDecoders.Put(dec)
	var raw []byte
	for i, page := range pages {
		var err error
		if raw, err = dec.DecodeAll(page, raw[:0]); err != nil {
			return Events{}, errPage
		}
		if err := out.loadPage(raw, i == 0); err != nil {
			return Events{}, err
		}
	}
	return out.View(), nil
}

// loadPage appends the events of a decompressed page to ev; first says it is the first, whose seq sets Base.
func (ev *Events) loadPage(raw []byte, first bool) error {
	c := cursor{b: raw}
	from, n := int(c.uvarint()), int(c.uvarint())
	if c.bad || n > c.rest() || int64(from)+int64(n) > MaxEvents || !first && from != ev.Len() {
		return errPage
	}
	if first {
		ev.base = from
	}
	actions := c.b[c.i : c.i+n]
	c.i += n
	rows := make([]uint32, n)
	for i := range rows {
		rows[i] = uint32(c.uvarint())
	}
	times := make([]int64, n)
	prev := int64(0)
	for i := range times {
		prev += c.varint()
		times[i] = prev
	}
	nruns := int(c.uvarint())
	if c.bad || nruns > c.rest() {
		return errPage
	}
	type run struct {
		start     int
		phase     Phase
		iteration int32
	}
	runs := make([]run, nruns)
	for k := range runs {
		runs[k] = run{int(c.uvarint()), Phase(c.byte()), int32(c.varint())}
	}
	nx := int(c.uvarint())
	if c.bad || nx > c.rest() {
		return errPage
	}
	xseq, xrow := make([]int, nx), make([]int64, nx)
	at := 0
	for x := range xseq {
		at += int(c.uvarint())
		xseq[x], xrow[x] = at, int64(c.uvarint())
	}
	if c.bad || c.rest() != 0 || n > 0 && len(runs) == 0 {
		return errPage
	}
	ev.Grow(n)
	k, x := 0, 0
	for i := range n {
		for k+1 < len(runs) && runs[k+1].start <= i {
			k++
		}
		xr := int64(-1)
		if x < nx && xseq[x] == i {
			xr = xrow[x]
			x++
		}
		if int(rows[i]) >= len(ev.rows.addr) || xr >= int64(len(ev.rare.text)) {
			return errPage
		}
		ev.appendRaw(Action(actions[i]), rows[i], times[i], runs[k].phase, runs[k].iteration, xr)
	}
	return nil
}

// Forget drops the events before seq from memory (their rows stay): a reader that pages a long run keeps
// only the page it is filling. Views made before keep what they hold. An Events that was told to Forget, even
// nothing, is read page by page: a Reader does not size its columns for the whole file.
func (ev *Events) Forget(seq int) {
	ev.paging = true
	seq = min(max(seq, ev.base), ev.Len())
	if seq == ev.base {
		return
	}
	kept := Events{base: seq, rows: ev.rows, rare: ev.rare, ctxs: ev.ctxs, pack: ev.pack, paging: true}
	kept.Grow(ev.Len() - seq)
	x, _ := slices.BinarySearch(ev.xSeq, uint32(seq))
	for s := seq; s < ev.Len(); s++ {
		xr := int64(-1)
		if x < len(ev.xSeq) && int(ev.xSeq[x]) == s {
			xr = int64(ev.xRow[x])
			x++
		}
		phase, iteration := ev.Phase(s)
		kept.appendRaw(ev.action[s-ev.base], ev.row[s-ev.base], ev.Time(s), phase, iteration, xr)
	}
	*ev = kept
	if ev.pack != nil {
		ev.pack.owner = ev
	}
}

var pageEncoders, pageDecoders sync.Pool

func pageEncoder() *zstd.Encoder {
	if e, ok := pageEncoders.Get().(*zstd.Encoder); ok {
		return e
	}
	// A window of 256 KiB, not the default 8 MiB: the encoder's history buffers grow with its window and stay
	// with it in the pool, which a TUI paging a run within --max-memory 16MiB cannot spare; pages of a
	// training loop compress as well (its events repeat within an iteration, a few thousand events).
	e, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedFastest), zstd.WithEncoderConcurrency(1), zstd.WithWindowSize(1<<18))
	if err != nil {
		panic(err) // only invalid options fail
	}
	return e
}

func pageDecoder() *zstd.Decoder {
	if d, ok := pageDecoders.Get().(*zstd.Decoder); ok {
		return d
	}
	d, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1))
	if err != nil {
		panic(err)
	}
	return d
}
