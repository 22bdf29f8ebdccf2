package snapshot

import (
	"hash/crc32"
	"unsafe"
)

// The byte-level constants of the file format; docs/format.md is their specification.
const (
	// Magic starts every snapshot. The high first byte marks it as binary; the final newline catches
	// line-ending conversion.
	Magic = "\x89OOMDBG\n"
	// Version is the format version this package writes and the newest it reads. Version 2 is version 1 with
	// one more phase, load; a reader reads both, and a version-1 file with a load phase is corrupt.
	Version = 2

	// lastPhaseV1 is the last phase version 1 defines.
	lastPhaseV1 = PhaseEval

	fileHeaderSize  = 16 // magic, version, flags, metadata length
	chunkHeaderSize = 24 // kind, codec, reserved, stored length, decoded length, events, payload CRC, header CRC
)

// Chunk kinds. A kind with the optional bit set may be skipped by a reader that does not know it.
const (
	kindEvents   = 1    // new table entries and a run of events
	kindEnd      = 2    // the last chunk: the footer as JSON, or nothing
	kindOptional = 0x80 // the bit that marks a kind a reader may skip
)

// Chunk codecs: how a chunk's payload is stored.
const (
	codecStored = 0 // the payload is the decoded bytes
	codecZstd   = 1 // the payload continues the file's single zstd stream, flushed at the chunk's end
)

// writerWindow is the zstd window the writer uses. Training loops repeat every iteration; a window that spans
// a few iterations of encoded events is where most of the compression comes from.
const writerWindow = 1 << 20

// crcTable is CRC-32C (Castagnoli): hardware-accelerated by hash/crc32 on amd64 and arm64, and the checksum
// ext4, iSCSI and LevelDB-style logs use for the same job.
var crcTable = crc32.MakeTable(crc32.Castagnoli)

// EventBytes is the memory one Event takes in a slice of events, as Read holds them.
const EventBytes = int64(unsafe.Sizeof(Event{}))

// Limits caps what a Reader accepts, so that a hostile file cannot make it allocate without bound. A zero
// field means the default from DefaultLimits. The Writer never exceeds the defaults.
type Limits struct {
	MetaBytes   int // JSON metadata in the header
	ChunkBytes  int // a chunk's stored payload and its decoded payload, each
	ChunkEvents int // events in one chunk
	StringBytes int // one string
	Strings     int // strings in the table
	Frames      int // frames in the table
	Stacks      int // stacks in the table
	StackDepth  int // frames in one stack
	WindowBytes int // zstd window (history the decoder keeps)
	// TableBytes caps the tables' memory, counted as string bytes with their length prefixes, plus 16 bytes
	// per string, 12 per frame, and 4 per stack and per stack entry.
	TableBytes int64
	// Events caps the events a Reader decodes, and so the events Read and ReadFile hold in memory. Programs
	// lower it to fit their memory (oomdbg's --max-memory).
	Events uint64
	// EventsPerByte caps how densely a file may pack events: after n bytes of input a Reader has decoded at
	// most DensityAllowance + EventsPerByte x n events, so the events a file yields, and the memory they take,
	// are bounded by its size. A recording holds about one event per two bytes (the times alone take a byte or
	// two per event); a few kilobytes that zstd would expand into millions of events are refused at the chunk
	// header, before anything is decompressed.
	EventsPerByte int
	// ChunkRatio caps a compressed chunk's expansion: its decoded length may be at most ChunkRatio times its
	// stored length, or RatioAllowance, whichever is larger. oomdbg's chunks expand 3 to 30 times.
	ChunkRatio int
	// SizeBytes caps the sizes the events and the footer name (Sizes): each at most it and all together too
	// (default MaxBytes). Below 0 it sets no cap, for a program that copies events as they are (the format holds
	// any int64); an analysis must not read such a file, whose totals can wrap.
	SizeBytes int64
}

// The allowances that let small inputs through the density caps of Limits.EventsPerByte and
// Limits.ChunkRatio: one default chunk of events, and a 1 MiB chunk however small its payload.
const (
	DensityAllowance = 1 << 16
	RatioAllowance   = 1 << 20
)

// DefaultLimits returns the limits a Reader applies unless told otherwise. They are far above what oomdbg
// writes and low enough that a reader's memory stays bounded: tables, two chunk buffers and the zstd window,
// well under a gigabyte. Read additionally holds up to Events events (at most about 60 bytes each in the
// columns of Events, about 11 for a training loop), and never more than the input's size allows
// (EventsPerByte); docs/format.md §9 gives the bound.
func DefaultLimits() Limits {
	return Limits{
		MetaBytes:     1 << 20,
		ChunkBytes:    64 << 20,
		ChunkEvents:   1 << 20,
		StringBytes:   64 << 10,
		Strings:       1 << 24,
		Frames:        1 << 24,
		Stacks:        1 << 24,
		StackDepth:    1024,
		TableBytes:    256 << 20,
		WindowBytes:   32 << 20,
		Events:        1 << 26,
		EventsPerByte: 64,
		ChunkRatio:    1024,
		SizeBytes:     MaxBytes,
	}
}

// orDefault fills zero fields of l from DefaultLimits.
func (l Limits) orDefault() Limits {
	d := DefaultLimits()
	if l.MetaBytes <= 0 {
		l.MetaBytes = d.MetaBytes
	}
	if l.ChunkBytes <= 0 {
		l.ChunkBytes = d.ChunkBytes
	}
	if l.ChunkEvents <= 0 {
		l.ChunkEvents = d.ChunkEvents
	}
	if l.StringBytes <= 0 {
		l.StringBytes = d.StringBytes
	}
	if l.Strings <= 0 {
		l.Strings = d.Strings
	}
	if l.Frames <= 0 {
		l.Frames = d.Frames
	}
	if l.Stacks <= 0 {
		l.Stacks = d.Stacks
	}
	if l.StackDepth <= 0 {
		l.StackDepth = d.StackDepth
	}
	if l.TableBytes <= 0 {
		l.TableBytes = d.TableBytes
	}
	if l.WindowBytes <= 0 {
		l.WindowBytes = d.WindowBytes
	}
	if l.Events == 0 {
		l.Events = d.Events
	}
	if l.EventsPerByte <= 0 {
		l.EventsPerByte = d.EventsPerByte
	}
	if l.ChunkRatio <= 0 {
		l.ChunkRatio = d.ChunkRatio
	}
	if l.SizeBytes == 0 {
		l.SizeBytes = d.SizeBytes
	}
	return l
}
