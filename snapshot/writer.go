package snapshot

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"hash/crc32"
	"io"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Writer streams events into a snapshot file (docs/format.md). It buffers events in a chunk and writes the
// chunk, compressed and checksummed, when it is full, when it has aged past the age limit, and right after a
// phase or iteration marker, so that a reader following the file sees every phase as soon as it ends.
//
// A Writer is not safe for concurrent use: the recorder serializes its calls.
type Writer struct {
	w      io.Writer
	cfg    writerConfig
	tables *internTables
	enc    *eventEncoder
	zenc   *zstd.Encoder // nil when compression is off
	zbuf   bytes.Buffer  // the compressed payload of the chunk being written
	raw    []byte        // the decoded payload of the chunk being written
	frame  []byte        // chunk header and payload, written in one call

	chunkEvents int   // events in the current chunk
	chunkStart  int64 // Event.Time of the current chunk's first event
	events      uint64
	err         error // sticky: the first write error
	closed      bool
}

// writerConfig holds the WriterOptions.
type writerConfig struct {
	chunkEvents int
	chunkAge    time.Duration
	level       int
}

// WriterOption configures a Writer.
type WriterOption func(*writerConfig)

// WithChunkEvents sets how many events a chunk holds at most (default 65536, at most 1<<20). Smaller chunks
// reach a follower sooner and lose less on a crash; larger ones compress a little better.
func WithChunkEvents(n int) WriterOption {
	return func(c *writerConfig) { c.chunkEvents = max(1, min(n, DefaultLimits().ChunkEvents)) }
}

// WithChunkAge sets how long a chunk may collect events: a Write of an event more than d after the chunk's
// first event writes the chunk out (default 200ms). Zero turns the limit off.
//
// Age is measured on Event.Time, which the recorder takes from a monotonic clock as it records: the Writer
// reads no clock of its own (a clock read would cost a fifth of Write) and its output is a pure function of
// the events.
func WithChunkAge(d time.Duration) WriterOption {
	return func(c *writerConfig) { c.chunkAge = max(0, d) }
}

// WithCompressionLevel sets the zstd level, on zstd's scale: 1-2 fastest, 3-5 default, 6-9 better, 10 and up
// best. Level 0 stores chunks uncompressed, for debugging the format.
func WithCompressionLevel(level int) WriterOption {
	return func(c *writerConfig) { c.level = max(0, level) }
}

// Soft limits on a chunk's contents; together they stay far below Limits.ChunkBytes.
const (
	chunkStreamBytes = 8 << 20  // event streams: write the chunk once they pass this
	chunkTableBytes  = 16 << 20 // table entries: more go into chunks of their own
)

// NewWriter writes a snapshot header with meta to w and returns a Writer for the events.
func NewWriter(w io.Writer, meta Meta, opts ...WriterOption) (*Writer, error) {
	cfg := writerConfig{chunkEvents: 1 << 16, chunkAge: 200 * time.Millisecond, level: 3}
	for _, o := range opts {
		o(&cfg)
	}
	metaJSON, err := json.Marshal(meta)
	if err != nil {
		return nil, fmt.Errorf("snapshot: encode metadata: %w", err)
	}
	if len(metaJSON) > DefaultLimits().MetaBytes {
		return nil, fmt.Errorf("snapshot: metadata is %d bytes: %w (%d)", len(metaJSON), ErrLimit, DefaultLimits().MetaBytes)
	}
	sw := &Writer{w: w, cfg: cfg, tables: newInternTables(), enc: newEventEncoder()}
	if cfg.level > 0 {
		// One goroutine: the output is then a pure function of the input (golden files), and the recorder's
		// machine keeps its cores for the workload.
		sw.zenc, err = zstd.NewWriter(&sw.zbuf,
			zstd.WithEncoderLevel(zstd.EncoderLevelFromZstd(cfg.level)),
			zstd.WithEncoderConcurrency(1),
			zstd.WithWindowSize(writerWindow),
			zstd.WithEncoderCRC(false))
		if err != nil {
			return nil, fmt.Errorf("snapshot: %w", err)
		}
	}

	hdr := make([]byte, 0, fileHeaderSize+len(metaJSON)+4)
	hdr = append(hdr, Magic...)
	hdr = binary.LittleEndian.AppendUint16(hdr, Version)
	hdr = binary.LittleEndian.AppendUint16(hdr, 0) // flags
	hdr = binary.LittleEndian.AppendUint32(hdr, uint32(len(metaJSON)))
	hdr = append(hdr, metaJSON...)
	hdr = binary.LittleEndian.AppendUint32(hdr, crc32.Checksum(hdr, crcTable))
	if _, err := w.Write(hdr); err != nil {
		return nil, fmt.Errorf("snapshot: write header: %w", err)
	}
	return sw, nil
}

// InternString returns the ID of s in the string table, adding it if needed; "" is 0. Strings longer than
// the format's limit (64 KiB) are stored truncated.
func (w *Writer) InternString(s string) StringID { return w.tables.internString(s) }

// InternFrame returns the ID of the frame (function, file, line), adding it if needed.
func (w *Writer) InternFrame(function, file string, line int) FrameID {
	return w.tables.internFrame(function, file, line)
}

// InternStack returns the ID of the stack of frames, innermost first, adding it if needed; an empty stack is
// 0. The frames must be IDs from InternFrame (otherwise the stack is 0 and the next Write fails). Stacks deeper
// than the format's limit (1024) keep their innermost frames. A repeated stack costs a map lookup and no
// allocation.
func (w *Writer) InternStack(frames []FrameID) StackID { return w.tables.internStack(frames) }

// Events returns how many events were written: the Seq the next event gets.
func (w *Writer) Events() uint64 { return w.events }

// Write assigns e.Seq and adds e to the current chunk, writing the chunk out when it is full, old, or e is a
// phase or iteration marker. An invalid event is rejected with ErrInvalidEvent and the Writer stays usable;
// an error from the underlying writer is returned by every later call.
func (w *Writer) Write(e *Event) error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return ErrWriterClosed
	}
	if w.tables.err != nil {
		err := w.tables.err
		w.tables.err = nil
		return err
	}
	if err := w.check(e); err != nil {
		return err
	}
	e.Seq = w.events
	if w.chunkEvents == 0 {
		w.chunkStart = e.Time
	}
	old := w.cfg.chunkAge > 0 && e.Time-w.chunkStart >= int64(w.cfg.chunkAge)
	w.enc.encode(e)
	w.events++
	w.chunkEvents++
	if old || w.chunkEvents >= w.cfg.chunkEvents || w.enc.size() >= chunkStreamBytes ||
		e.Action == ActionPhase || e.Action == ActionIteration {
		return w.Flush()
	}
	return nil
}

// check rejects what the format cannot hold.
func (w *Writer) check(e *Event) error {
	t := w.tables
	switch {
	case !e.Action.Valid():
		return fmt.Errorf("%w: action %d", ErrInvalidEvent, e.Action)
	case !e.Phase.Valid():
		return fmt.Errorf("%w: phase %d", ErrInvalidEvent, e.Phase)
	case !e.Category.Valid():
		return fmt.Errorf("%w: category %d", ErrInvalidEvent, e.Category)
	case int(e.Scope) > len(t.strings) || int(e.Label) > len(t.strings) || int(e.Text) > len(t.strings):
		return fmt.Errorf("%w: string ID (scope %d, label %d, text %d) was not interned", ErrInvalidEvent, e.Scope, e.Label, e.Text)
	case int(e.Stack) > len(t.stackEnds):
		return fmt.Errorf("%w: stack %d was not interned", ErrInvalidEvent, e.Stack)
	}
	return nil
}

// Flush writes the buffered events, and table entries interned since the last chunk, as a chunk.
func (w *Writer) Flush() error {
	if w.err != nil {
		return w.err
	}
	if w.closed {
		return ErrWriterClosed
	}
	if w.chunkEvents == 0 && !w.tables.pending() {
		return nil
	}
	// Tables too large for one chunk go first in chunks of their own.
	for {
		w.raw = w.raw[:0]
		var all bool
		w.raw, all = w.tables.appendPending(w.raw, chunkTableBytes)
		if all {
			break
		}
		w.raw = append(w.raw, 0, 0) // no ops, no fields, no times
		if err := w.writeChunk(kindEvents, 0); err != nil {
			return err
		}
	}
	w.raw = binary.AppendUvarint(w.raw, uint64(len(w.enc.ops)))
	w.raw = append(w.raw, w.enc.ops...)
	w.raw = binary.AppendUvarint(w.raw, uint64(len(w.enc.fields)))
	w.raw = append(w.raw, w.enc.fields...)
	w.raw = append(w.raw, w.enc.times...)
	if err := w.writeChunk(kindEvents, w.chunkEvents); err != nil {
		return err
	}
	w.enc.reset()
	w.chunkEvents = 0
	return nil
}

// writeChunk compresses w.raw and writes it as a chunk of the given kind.
func (w *Writer) writeChunk(kind byte, events int) error {
	payload, codec := w.raw, byte(codecStored)
	if w.zenc != nil && len(w.raw) > 0 {
		w.zbuf.Reset()
		if _, err := w.zenc.Write(w.raw); err != nil {
			w.err = fmt.Errorf("snapshot: compress: %w", err)
			return w.err
		}
		// Flush ends the chunk on a zstd block boundary: a reader decodes it with what came before, without
		// waiting for what comes after.
		if err := w.zenc.Flush(); err != nil {
			w.err = fmt.Errorf("snapshot: compress: %w", err)
			return w.err
		}
		payload, codec = w.zbuf.Bytes(), codecZstd
	}
	var h [chunkHeaderSize]byte
	h[0] = kind
	h[1] = codec
	binary.LittleEndian.PutUint32(h[4:], uint32(len(payload)))
	binary.LittleEndian.PutUint32(h[8:], uint32(len(w.raw)))
	binary.LittleEndian.PutUint32(h[12:], uint32(events))
	binary.LittleEndian.PutUint32(h[16:], crc32.Checksum(payload, crcTable))
	binary.LittleEndian.PutUint32(h[20:], crc32.Checksum(h[:20], crcTable))
	w.frame = append(append(w.frame[:0], h[:]...), payload...)
	// One Write per chunk: a reader of a growing file rarely sees half a chunk, and a crash loses at most one.
	if _, err := w.w.Write(w.frame); err != nil {
		w.err = fmt.Errorf("snapshot: write chunk: %w", err)
		return w.err
	}
	return nil
}

// Close writes the buffered events and the end chunk holding f (nil: no footer). It does not close the
// underlying writer. Every later call returns ErrWriterClosed. An interning error not yet reported by Write
// is returned after the file was closed properly.
func (w *Writer) Close(f *Footer) error {
	if w.closed {
		return ErrWriterClosed
	}
	if err := w.Flush(); err != nil {
		return err
	}
	w.raw = w.raw[:0]
	if f != nil {
		b, err := json.Marshal(f)
		if err != nil {
			return fmt.Errorf("snapshot: encode footer: %w", err)
		}
		if len(b) > DefaultLimits().ChunkBytes {
			return fmt.Errorf("snapshot: footer is %d bytes: %w", len(b), ErrLimit)
		}
		w.raw = append(w.raw, b...)
	}
	if err := w.writeChunk(kindEnd, 0); err != nil {
		return err
	}
	w.closed = true
	return w.tables.err
}
