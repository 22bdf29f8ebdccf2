package snapshot

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Reader decodes a snapshot from a file, a growing file (WithFollow) or a pipe, one chunk at a time, in bounded
// memory: the tables, two chunk buffers and the zstd window, all capped by Limits.
//
// A snapshot cut short (a killed recording, a full disk) reads up to its last whole chunk; then Next returns
// io.EOF and Warning says where the data ended. Damaged or hostile bytes make Next return a *DecodeError after
// the events of the chunks before them. A Reader never panics on bad input.
//
// A Reader is not safe for concurrent use.
type Reader struct {
	r      io.Reader
	lim    Limits
	ctx    context.Context // the follow context, or nil
	meta   Meta
	off    int64 // bytes of the input consumed: the header and whole chunks
	tables tables
	model  model
	sizes  Sizes // what the events and the footer add up to

	zdec   *zstd.Decoder // created at the first compressed chunk
	zsrc   chunkSource
	stored []byte // a chunk's payload as stored
	raw    []byte // a chunk's payload decoded

	buf []Event // the current chunk's events, for Next
	pos int
	hdr [chunkHeaderSize]byte // the chunk header being read; a field so that it is not allocated per chunk

	size int64 // the input's size when it is a file, else 0

	footer  *Footer
	warning error
	err     error // sticky
	done    bool  // the end chunk was read, or the input ended
}

// readerConfig holds the ReaderOptions.
type readerConfig struct {
	limits   Limits
	ctx      context.Context
	interval time.Duration
}

// ReaderOption configures a Reader.
type ReaderOption func(*readerConfig)

// WithLimits sets the caps the Reader enforces; zero fields keep their defaults (DefaultLimits).
func WithLimits(l Limits) ReaderOption {
	return func(c *readerConfig) { c.limits = l }
}

// NewReader reads the snapshot header from r. It fails with a *DecodeError wrapping ErrNotSnapshot,
// ErrUnsupportedVersion, ErrTruncated (the input ends inside the header), ErrChecksum or ErrLimit.
func NewReader(r io.Reader, opts ...ReaderOption) (*Reader, error) {
	var cfg readerConfig
	for _, o := range opts {
		o(&cfg)
	}
	rd := &Reader{r: r, lim: cfg.limits.orDefault(), tables: newTables()}
	rd.sizes.Max = uint64(max(rd.lim.SizeBytes, 0))
	if cfg.ctx != nil {
		rd.ctx = cfg.ctx
		rd.r = newFollower(cfg.ctx, r, cfg.interval)
	}
	if f, ok := r.(interface{ Stat() (os.FileInfo, error) }); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode().IsRegular() {
			rd.size = fi.Size()
		}
	}
	if err := rd.readHeader(); err != nil {
		return nil, err
	}
	return rd, nil
}

// readHeader reads and checks the file header (docs/format.md §3).
func (r *Reader) readHeader() error {
	const op = "read header"
	var h [fileHeaderSize]byte
	n, err := io.ReadFull(r.r, h[:])
	if n < len(Magic) && !bytes.HasPrefix([]byte(Magic), h[:n]) || n >= len(Magic) && string(h[:len(Magic)]) != Magic {
		return &DecodeError{Offset: 0, Op: op, Err: ErrNotSnapshot}
	}
	if err != nil {
		return r.headerReadError(op, int64(n), err)
	}
	v := binary.LittleEndian.Uint16(h[8:])
	if v == 0 || v > Version {
		return &DecodeError{Offset: 8, Op: op, Err: fmt.Errorf("%w: version %d (this reader knows versions 1 to %d)", ErrUnsupportedVersion, v, Version)}
	}
	r.model.lastPhase = numPhases - 1
	if v == 1 {
		r.model.lastPhase = lastPhaseV1
	}
	if f := binary.LittleEndian.Uint16(h[10:]); f != 0 {
		return &DecodeError{Offset: 10, Op: op, Err: fmt.Errorf("%w: unknown header flags %#x", ErrUnsupportedVersion, f)}
	}
	metaLen := binary.LittleEndian.Uint32(h[12:])
	if uint64(metaLen) > uint64(r.lim.MetaBytes) {
		return &DecodeError{Offset: 12, Op: op, Err: limitf("metadata of %d bytes (limit %d)", metaLen, r.lim.MetaBytes)}
	}
	body, got, err := readFull(r.r, nil, int(metaLen)+4)
	if err != nil {
		return r.headerReadError(op, fileHeaderSize+int64(got), err)
	}
	meta := body[:metaLen]
	crc := crc32.Update(crc32.Checksum(h[:], crcTable), crcTable, meta)
	if crc != binary.LittleEndian.Uint32(body[metaLen:]) {
		return &DecodeError{Offset: 0, Op: op, Err: ErrChecksum}
	}
	if err := json.Unmarshal(meta, &r.meta); err != nil {
		return &DecodeError{Offset: fileHeaderSize, Op: "decode metadata", Err: corruptf("%v", err)}
	}
	r.off = fileHeaderSize + int64(metaLen) + 4
	return nil
}

func (r *Reader) headerReadError(op string, off int64, err error) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return &DecodeError{Offset: off, Op: op, Err: fmt.Errorf("%w: the input ends inside the header", ErrTruncated)}
	}
	if r.ctx != nil && r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	return &DecodeError{Offset: off, Op: op, Err: err}
}

// Meta returns the snapshot's metadata.
func (r *Reader) Meta() Meta { return r.meta }

// Next returns the next event, or io.EOF after the last one (check Warning then). Other errors are
// *DecodeError, or the follow context's error.
func (r *Reader) Next() (Event, error) {
	if r.pos >= len(r.buf) {
		buf, err := r.readEvents(r.buf[:0])
		r.buf, r.pos = buf, 0
		if err != nil {
			return Event{}, err
		}
	}
	r.pos++
	return r.buf[r.pos-1], nil
}

// ReadChunk appends the events of the next chunk (or what Next left of the current one) to dst. It is the
// fast way to read a snapshot. At the end it appends nothing and returns io.EOF.
//
// Reading a file, ReadChunk sizes dst's columns from the file's size and the events per byte of the chunks
// read so far, so that they are copied seldom as they grow.
func (r *Reader) ReadChunk(dst *Events) error {
	if r.pos >= len(r.buf) {
		buf, err := r.readEvents(r.buf[:0])
		r.buf, r.pos = buf, 0
		if err != nil {
			return err
		}
	}
	r.presize(dst)
	for i := r.pos; i < len(r.buf); i++ {
		dst.Append(&r.buf[i])
	}
	r.pos = len(r.buf)
	return nil
}

// presize grows dst to hold the events the whole file is expected to hold, judged by the events per byte
// so far, when the events about to be appended would not fit. It waits for a few chunks so that the ratio is
// a fair one, and adds a little, so that a ratio that drifts costs a few copies at most. Events read page by
// page (Forget) are not sized for the whole file.
func (r *Reader) presize(dst *Events) {
	if r.size <= 0 || r.model.events < 1<<16 || r.off <= 0 || dst.paging || dst.Len()+len(r.buf)-r.pos <= dst.Cap() {
		return
	}
	want := float64(r.model.events) * float64(max(r.size, r.off)) / float64(r.off) * 1.03
	if want < float64(MaxEvents) {
		dst.Grow(max(int(want)-dst.Len(), len(r.buf)))
	}
}

// String returns the string with the given ID, "" for 0 or an ID not read yet.
func (r *Reader) String(id StringID) string { return r.tables.string(id) }

// Frame returns the frame with the given ID, the zero Frame for one not read yet.
func (r *Reader) Frame(id FrameID) Frame { return r.tables.frame(id) }

// Stack returns the frames of a stack, innermost first; nil for 0 or an ID not read yet. The slice is shared:
// do not modify it.
func (r *Reader) Stack(id StackID) []FrameID { return r.tables.stack(id) }

// Footer returns the snapshot's footer once the end chunk was read; nil before, or if the writer wrote none.
func (r *Reader) Footer() *Footer { return r.footer }

// Warning returns a *TruncatedError if the input ended before the end chunk, nil otherwise.
func (r *Reader) Warning() error { return r.warning }

// Offset returns how many bytes of the input were consumed: the header and the chunks read so far.
func (r *Reader) Offset() int64 { return r.off }

// readEvents reads chunks until one with events, decodes them onto dst and returns it. At the end of the
// snapshot it returns dst and io.EOF.
func (r *Reader) readEvents(dst []Event) ([]Event, error) {
	for {
		if r.err != nil {
			return dst, r.err
		}
		if r.done {
			return dst, io.EOF
		}
		out, more, err := r.readChunk(dst)
		if err != nil {
			r.err = err
		}
		if r.err != nil || r.done {
			r.releaseDecoder()
			r.model.release()
		}
		if err != nil {
			return dst, err
		}
		if more {
			return out, nil
		}
	}
}

// readChunk reads one chunk (docs/format.md §4). It reports whether it appended events.
func (r *Reader) readChunk(dst []Event) ([]Event, bool, error) {
	start := r.off
	h := &r.hdr
	n, err := io.ReadFull(r.r, h[:])
	if err != nil {
		return dst, false, r.endOrFail(start, n, err, "end of input after a whole chunk", "incomplete chunk header")
	}
	if *h == [chunkHeaderSize]byte{} {
		// Some file systems leave a zero-filled tail after a crash: the end of what was written.
		r.truncated(start, "zero-filled tail")
		return dst, false, nil
	}
	fail := func(op string, err error) ([]Event, bool, error) {
		return dst, false, &DecodeError{Offset: start, Op: op, Err: err}
	}
	if crc32.Checksum(h[:20], crcTable) != binary.LittleEndian.Uint32(h[20:]) {
		return fail("read chunk header", ErrChecksum)
	}
	kind, codec := h[0], h[1]
	storedLen := binary.LittleEndian.Uint32(h[4:])
	rawLen := binary.LittleEndian.Uint32(h[8:])
	count := binary.LittleEndian.Uint32(h[12:])
	switch {
	case binary.LittleEndian.Uint16(h[2:]) != 0:
		return fail("read chunk header", corruptf("reserved bytes are not zero"))
	case codec != codecStored && codec != codecZstd:
		return fail("read chunk header", corruptf("unknown codec %d", codec))
	case codec == codecStored && storedLen != rawLen:
		return fail("read chunk header", corruptf("stored chunk of %d bytes declares %d decoded bytes", storedLen, rawLen))
	case uint64(storedLen) > uint64(r.lim.ChunkBytes) || uint64(rawLen) > uint64(r.lim.ChunkBytes):
		return fail("read chunk header", limitf("chunk of %d bytes, %d decoded (limit %d)", storedLen, rawLen, r.lim.ChunkBytes))
	case uint64(count) > uint64(r.lim.ChunkEvents):
		return fail("read chunk header", limitf("chunk of %d events (limit %d)", count, r.lim.ChunkEvents))
	case count > 0 && kind != kindEvents:
		return fail("read chunk header", corruptf("chunk of kind %d declares %d events", kind, count))
	case kind != kindEvents && kind != kindEnd && kind&kindOptional == 0:
		return fail("read chunk header", corruptf("unknown chunk kind %d", kind))
	case r.model.events+uint64(count) > densityCap(r.lim, start+chunkHeaderSize+int64(storedLen)):
		return fail("read chunk header", limitf("%d events in the first %d bytes: more than %d per byte of input, "+
			"which no recording packs (a decompression bomb?)", r.model.events+uint64(count), start+chunkHeaderSize+int64(storedLen), r.lim.EventsPerByte))
	case codec == codecZstd && uint64(rawLen) > max(RatioAllowance, uint64(r.lim.ChunkRatio)*uint64(storedLen)):
		return fail("read chunk header", limitf("chunk of %d bytes decodes to %d: expands more than %d times "+
			"(a decompression bomb?)", storedLen, rawLen, r.lim.ChunkRatio))
	case r.model.events+uint64(count) > r.lim.Events:
		return fail("read chunk header", fmt.Errorf("%w: more than %d", ErrEventLimit, r.lim.Events))
	}

	r.stored, n, err = readFull(r.r, r.stored, int(storedLen))
	if err != nil {
		return dst, false, r.endOrFail(start, chunkHeaderSize+n, err, "incomplete chunk", "incomplete chunk")
	}
	if crc32.Checksum(r.stored, crcTable) != binary.LittleEndian.Uint32(h[16:]) {
		return fail("read chunk", ErrChecksum)
	}
	raw := r.stored
	if codec == codecZstd {
		if raw, err = r.inflate(r.stored, int(rawLen)); err != nil {
			return fail("decompress chunk", err)
		}
	}
	r.off = start + chunkHeaderSize + int64(storedLen)

	switch kind {
	case kindEvents:
		out, err := r.decodeEventsChunk(dst, raw, int(count))
		if err != nil {
			return fail("decode chunk", err)
		}
		for i := len(dst); i < len(out) && r.lim.SizeBytes >= 0; i++ {
			if err := r.sizes.Add(int(out[i].Seq), &out[i]); err != nil {
				return fail("decode chunk", err)
			}
		}
		return out, count > 0, nil
	case kindEnd:
		if len(raw) > 0 {
			f := new(Footer)
			if err := json.Unmarshal(raw, f); err != nil {
				return fail("decode footer", corruptf("%v", err))
			}
			if err := r.sizes.AddFooter(f); err != nil && r.lim.SizeBytes >= 0 {
				return fail("decode footer", err)
			}
			r.footer = f
		}
		r.done = true
		return dst, false, nil
	}
	return dst, false, nil // an optional chunk this reader does not know
}

// decodeEventsChunk decodes an events chunk's payload (docs/format.md §5): table entries, then the streams.
func (r *Reader) decodeEventsChunk(dst []Event, p []byte, count int) ([]Event, error) {
	p, err := r.tables.decodeSection(p, &r.lim)
	if err != nil {
		return dst, err
	}
	c := cursor{b: p}
	opsLen := c.uvarint()
	if c.bad || opsLen > uint64(c.rest()) {
		return dst, corruptf("ops stream runs past the chunk")
	}
	ops := p[c.i : c.i+int(opsLen)]
	c.i += int(opsLen)
	fieldsLen := c.uvarint()
	if c.bad || fieldsLen > uint64(c.rest()) {
		return dst, corruptf("fields stream runs past the chunk")
	}
	fields := p[c.i : c.i+int(fieldsLen)]
	times := p[c.i+int(fieldsLen):]
	return r.model.decodeEvents(dst, count, ops, fields, times, r.tables.numStrings(), r.tables.numStacks())
}

// inflate decodes a compressed payload with the file's zstd stream.
func (r *Reader) inflate(payload []byte, rawLen int) ([]byte, error) {
	if r.zdec == nil {
		d, err := getDecoder(&r.zsrc, r.lim.WindowBytes)
		if err != nil {
			return nil, err
		}
		r.zdec = d
	}
	r.zsrc.b = payload
	raw, _, err := readFull(r.zdec, r.raw, rawLen)
	r.raw = raw
	if err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
			return nil, corruptf("compressed payload decodes to fewer than the %d bytes declared", rawLen)
		}
		return nil, corruptf("zstd: %v", err)
	}
	if len(r.zsrc.b) != 0 {
		return nil, corruptf("compressed payload has %d bytes beyond the %d declared", len(r.zsrc.b), rawLen)
	}
	return raw, nil
}

// decoders reuse zstd decoders, and their window-sized history buffers, across Readers: opening many
// snapshots (tests, diffs, a fuzzer) would otherwise allocate a window per file.
var decoders sync.Pool

// getDecoder returns a decoder reading from src. One goroutine and a bounded window: a hostile frame header
// cannot make the decoder allocate more than window bytes of history.
func getDecoder(src io.Reader, window int) (*zstd.Decoder, error) {
	w := uint64(max(window, zstd.MinWindowSize))
	opts := []zstd.DOption{zstd.WithDecoderMaxWindow(w), zstd.WithDecoderMaxMemory(w)}
	if d, ok := decoders.Get().(*zstd.Decoder); ok {
		if err := d.ResetWithOptions(src, opts...); err == nil {
			return d, nil
		}
	}
	d, err := zstd.NewReader(nil, append(opts, zstd.WithDecoderConcurrency(1))...)
	if err != nil {
		return nil, err
	}
	if err := d.Reset(src); err != nil {
		return nil, err
	}
	return d, nil
}

// releaseDecoder returns the Reader's decoder to the pool once the Reader is done with it.
func (r *Reader) releaseDecoder() {
	if r.zdec == nil {
		return
	}
	if r.zdec.Reset(nil) == nil {
		decoders.Put(r.zdec)
	}
	r.zdec = nil
}

// endOrFail turns a short read at the chunk starting at start into the truncation warning, or another read
// error into the error to return.
func (r *Reader) endOrFail(start int64, got int, err error, atBoundary, inside string) error {
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		reason := inside
		if got == 0 {
			reason = atBoundary
		}
		r.truncated(start, reason)
		return nil
	}
	if r.ctx != nil && r.ctx.Err() != nil {
		return r.ctx.Err()
	}
	return &DecodeError{Offset: start + int64(got), Op: "read chunk", Err: err}
}

func (r *Reader) truncated(off int64, reason string) {
	r.warning = &TruncatedError{Offset: off, Events: r.model.events, Reason: reason}
	r.done = true
}

// chunkSource feeds one chunk's compressed payload to the zstd decoder. It ends where the chunk ends, so the
// decoder never reads ahead into bytes that have not arrived.
type chunkSource struct{ b []byte }

func (s *chunkSource) Read(p []byte) (int, error) {
	if len(s.b) == 0 {
		return 0, io.EOF
	}
	n := copy(p, s.b)
	s.b = s.b[n:]
	return n, nil
}

// densityCap is the most events a Reader with limits lim decodes from the first n bytes of its input.
func densityCap(lim Limits, n int64) uint64 {
	return DensityAllowance + uint64(lim.EventsPerByte)*uint64(max(n, 0))
}

// readFull reads n bytes into buf (reusing its memory) and returns them and how many arrived. It grows buf
// as bytes arrive rather than to n at once, so a false length in a short input costs no more memory than
// the input.
func readFull(r io.Reader, buf []byte, n int) ([]byte, int, error) {
	buf = buf[:0]
	for len(buf) < n {
		want := n - len(buf)
		if cap(buf) < n {
			want = min(want, max(64<<10, len(buf)))
		}
		buf = slices.Grow(buf, want)
		m, err := io.ReadFull(r, buf[len(buf):len(buf)+want])
		buf = buf[:len(buf)+m]
		if err != nil {
			if errors.Is(err, io.EOF) && len(buf) > 0 {
				err = io.ErrUnexpectedEOF
			}
			return buf, len(buf), err
		}
	}
	return buf, n, nil
}
