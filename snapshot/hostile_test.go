package snapshot_test

import (
	"bytes"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/klauspost/compress/zstd"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

func TestNotSnapshot(t *testing.T) {
	for name, data := range map[string][]byte{
		"text":            []byte("hello, world\n"),
		"png":             []byte("\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR"),
		"zstd frame":      {0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0},
		"python pickle":   {0x80, 0x04, 0x95, 0x10, 0, 0, 0, 0, 0, 0, 0, 0x7d, 0x94, 0x8c, 0x08, 's'},
		"short junk":      []byte("OO"),
		"wrong last byte": []byte("\x89OOMDBG\r____________"),
	} {
		t.Run(name, func(t *testing.T) {
			_, err := snapshot.NewReader(bytes.NewReader(data))
			var de *snapshot.DecodeError
			if !errors.Is(err, snapshot.ErrNotSnapshot) || !errors.As(err, &de) {
				t.Fatalf("err = %v, want a *DecodeError wrapping ErrNotSnapshot", err)
			}
			if _, err := snapshot.Read(bytes.NewReader(data)); !errors.Is(err, snapshot.ErrNotSnapshot) {
				t.Fatalf("Read: err = %v", err)
			}
		})
	}
}

func TestUnsupportedVersion(t *testing.T) {
	future := file(fileHeader(snapshot.Version+1, []byte(`{"tool":"oomdbg 9"}`)), endChunk())
	flags := validHeader()
	flags[10] = 1
	for name, data := range map[string][]byte{"future": future, "zero": fileHeader(0, []byte("{}")), "header flags": flags} {
		t.Run(name, func(t *testing.T) {
			_, err := snapshot.NewReader(bytes.NewReader(data))
			if !errors.Is(err, snapshot.ErrUnsupportedVersion) {
				t.Fatalf("err = %v, want ErrUnsupportedVersion", err)
			}
		})
	}
}

// TestHostileLengths declares lengths far beyond the input and the limits: the reader must refuse them, or
// find the input short, without allocating what they declare.
func TestHostileLengths(t *testing.T) {
	const huge = 0xFFFF_FFF0
	h := validHeader()
	withMeta := func(n uint32) []byte {
		b := bytes.Clone(h[:16])
		b[12], b[13], b[14], b[15] = byte(n), byte(n>>8), byte(n>>16), byte(n>>24)
		return append(b, make([]byte, 100)...)
	}
	tables := func(section []byte) []byte {
		p := eventsPayload(section, nil, nil, nil)
		return file(h, storedChunk(1, 0, p), endChunk())
	}
	tests := map[string]struct {
		data []byte
		err  error // nil: the input is short, a truncation warning
	}{
		"metadata length":        {withMeta(huge), snapshot.ErrLimit},
		"metadata within limit":  {withMeta(1 << 20), snapshot.ErrTruncated},
		"chunk stored length":    {file(h, chunkHeader(1, 0, huge, huge, 0, nil)), snapshot.ErrLimit},
		"chunk decoded length":   {file(h, chunkHeader(1, 1, 100, huge, 0, nil)), snapshot.ErrLimit},
		"chunk events":           {file(h, chunkHeader(1, 0, 100, 100, huge, nil)), snapshot.ErrLimit},
		"chunk within limit":     {file(h, chunkHeader(1, 0, 60<<20, 60<<20, 0, nil), make([]byte, 100)), nil},
		"string count":           {tables(uv(nil, 1<<40)), snapshot.ErrCorrupt},
		"string length":          {tables(uv(nil, 1, 1<<40)), snapshot.ErrCorrupt},
		"string length in limit": {tables(uv(nil, 1, 100<<10)), snapshot.ErrCorrupt},
		"frame count":            {tables(uv(nil, 0, 1<<40)), snapshot.ErrCorrupt},
		"stack count":            {tables(uv(nil, 0, 0, 1<<40)), snapshot.ErrCorrupt},
		"stack depth":            {tables(uv(nil, 0, 0, 1, 1<<40)), snapshot.ErrCorrupt},
		"event count":            {file(h, storedChunk(1, 60000, eventsPayload(noTables, []byte{1}, nil, []byte{0}))), snapshot.ErrCorrupt},
		"event density":          {file(h, storedChunk(1, 1<<20, eventsPayload(noTables, []byte{1}, nil, []byte{0}))), snapshot.ErrLimit},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var s *snapshot.Snapshot
			var err error
			n := allocated(func() { s, err = snapshot.Read(bytes.NewReader(tt.data)) })
			if n > 2<<20 {
				t.Errorf("allocated %d bytes for a %d-byte input", n, len(tt.data))
			}
			switch {
			case tt.err == nil:
				if err != nil || s.Warning == nil {
					t.Fatalf("err = %v, warning = %v; want a truncation warning", err, s.Warning)
				}
			case !errors.Is(err, tt.err):
				t.Fatalf("err = %v, want %v", err, tt.err)
			}
		})
	}
}

// TestLimits applies small limits to a real file.
func TestLimits(t *testing.T) {
	data, _ := encode(t, random(2, 3000), nil, snapshot.WithChunkEvents(500))
	for name, lim := range map[string]snapshot.Limits{
		"strings":      {Strings: 10},
		"frames":       {Frames: 5},
		"stacks":       {Stacks: 3},
		"stack depth":  {StackDepth: 2},
		"string bytes": {StringBytes: 1},
		"table bytes":  {TableBytes: 100},
		"chunk bytes":  {ChunkBytes: 1000},
		"chunk events": {ChunkEvents: 2},
		"metadata":     {MetaBytes: 10},
		"events":       {Events: 1000},
	} {
		t.Run(name, func(t *testing.T) {
			lim.SizeBytes = -1 // the random events' sizes span all of int64
			s, err := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(lim))
			if !errors.Is(err, snapshot.ErrLimit) {
				t.Fatalf("err = %v, want ErrLimit", err)
			}
			if name == "events" && (s == nil || s.Events.Len() > 1000) {
				t.Fatalf("the events limit must keep the prefix within it")
			}
		})
	}
	if _, err := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(snapshot.Limits{SizeBytes: -1})); err != nil {
		t.Fatalf("zero limits mean the defaults: %v", err)
	}
}

// TestWindowLimit: a zstd stream declaring a window beyond the limit is refused before its history is
// allocated.
func TestWindowLimit(t *testing.T) {
	payload := eventsPayload(noTables, []byte{byte(snapshot.ActionSnapshot)}, nil, []byte{0})
	var z bytes.Buffer
	enc, err := zstd.NewWriter(&z, zstd.WithWindowSize(256<<20), zstd.WithEncoderConcurrency(1))
	if err != nil {
		t.Fatal(err)
	}
	enc.Write(payload)
	enc.Flush()
	c := append(chunkHeader(1, 1, uint32(z.Len()), uint32(len(payload)), 1, z.Bytes()), z.Bytes()...)
	data := file(validHeader(), c, endChunk())
	var rerr error
	n := allocated(func() { _, rerr = snapshot.Read(bytes.NewReader(data)) })
	if !errors.Is(rerr, snapshot.ErrCorrupt) {
		t.Fatalf("err = %v, want ErrCorrupt", rerr)
	}
	if n > 8<<20 {
		t.Errorf("allocated %d bytes", n)
	}
	// With a limit that allows the window, the same file reads.
	s, err := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(snapshot.Limits{WindowBytes: 256 << 20}))
	if err != nil || s.Events.Len() != 1 {
		t.Fatalf("with a larger window limit: %v, %d events", err, s.Events.Len())
	}
}

// TestCraftedPayloads checks well-framed chunks (checksums right) whose contents are wrong.
func TestCraftedPayloads(t *testing.T) {
	const (
		alloc  = byte(snapshot.ActionAlloc)
		free   = byte(snapshot.ActionFreeRequested)
		ring   = 1 << 5
		delta  = 3 << 5
		ext    = 0x80
		fScope = 1 << 3
		fStack = 1 << 2
		fCat   = 1 << 4
		fPhase = 1 << 7
		fCtx   = 1 << 8
	)
	oneString := uv(nil, 1, 1, 'a', 0, 0)
	ev := func(tables, ops, fields, times []byte, events uint32) []byte {
		return file(validHeader(), storedChunk(1, events, eventsPayload(tables, ops, fields, times)), endChunk())
	}
	tests := map[string]struct {
		data []byte
		err  error // nil: reads
		n    int   // events then
	}{
		"valid":                     {ev(oneString, []byte{alloc | ext, fScope}, uv(nil, zz(1)), []byte{2}, 1), nil, 1},
		"invalid action":            {ev(noTables, []byte{0}, nil, []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"future action":             {ev(noTables, []byte{byte(snapshot.NumActions)}, nil, []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"unknown flag":              {ev(noTables, []byte{alloc | ext, 0x80, 0x40}, nil, []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"ring before any alloc":     {ev(noTables, []byte{free | ring}, uv(nil, 1), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"ring distance zero":        {ev(noTables, []byte{alloc, free | ring}, uv(nil, 0), []byte{0, 0}, 2), snapshot.ErrCorrupt, 0},
		"ring distance too far":     {ev(noTables, []byte{alloc, free | ring}, uv(nil, 2), []byte{0, 0}, 2), snapshot.ErrCorrupt, 0},
		"ring distance one":         {ev(noTables, []byte{alloc, free | ring}, uv(nil, 1), []byte{0, 0}, 2), nil, 2},
		"undefined scope":           {ev(oneString, []byte{alloc | ext, fScope}, uv(nil, zz(2)), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"negative scope":            {ev(oneString, []byte{alloc | ext, fScope}, uv(nil, zz(-1)), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"undefined stack":           {ev(noTables, []byte{alloc | ext, fStack}, uv(nil, zz(1)), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"invalid category":          {ev(noTables, []byte{alloc | ext, fCat}, []byte{200}, []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"invalid phase":             {ev(noTables, []byte{alloc | ext, 0x80, 1}, uv([]byte{99}, 0), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"iteration out of range":    {ev(noTables, []byte{alloc | ext, 0x80, 1}, uv([]byte{1}, zz(1<<40)), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"device out of range":       {ev(noTables, []byte{alloc | ext, 0x80, 2}, uv(nil, zz(1<<20), 0), []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"fields end early":          {ev(noTables, []byte{alloc | delta}, nil, []byte{0}, 1), snapshot.ErrCorrupt, 0},
		"times end early":           {ev(noTables, []byte{alloc, alloc}, nil, []byte{0, 0x80}, 2), snapshot.ErrCorrupt, 0},
		"varint overflow":           {ev(noTables, []byte{alloc}, nil, bytes.Repeat([]byte{0xff}, 11), 1), snapshot.ErrCorrupt, 0},
		"trailing bytes":            {ev(noTables, []byte{alloc, alloc}, nil, []byte{0, 0}, 1), snapshot.ErrCorrupt, 0},
		"frame of undefined string": {ev(uv(nil, 0, 1, 1, 0, 0, 0), nil, nil, nil, 0), snapshot.ErrCorrupt, 0},
		"stack of undefined frame":  {ev(uv(nil, 0, 0, 1, 1, 1), nil, nil, nil, 0), snapshot.ErrCorrupt, 0},
		"empty stack":               {ev(uv(nil, 0, 0, 1, 0), nil, nil, nil, 0), snapshot.ErrCorrupt, 0},
		"streams past the chunk":    {ev(noTables, nil, uv(nil, 100), nil, 0), snapshot.ErrCorrupt, 0},
		"unknown codec":             {file(validHeader(), append(chunkHeader(1, 7, 3, 3, 0, noTables), noTables...)), snapshot.ErrCorrupt, 0},
		"stored lengths differ":     {file(validHeader(), append(chunkHeader(1, 0, 3, 4, 0, noTables), noTables...)), snapshot.ErrCorrupt, 0},
		"unknown required kind":     {file(validHeader(), storedChunk(3, 0, nil), endChunk()), snapshot.ErrCorrupt, 0},
		"unknown optional kind":     {file(validHeader(), storedChunk(0x83, 0, []byte("future index")), endChunk()), nil, 0},
		"end chunk with events":     {file(validHeader(), storedChunk(2, 1, nil)), snapshot.ErrCorrupt, 0},
		"bad footer":                {file(validHeader(), storedChunk(2, 0, []byte("{not json"))), snapshot.ErrCorrupt, 0},
		"bad metadata":              {file(fileHeader(1, []byte("[1,2")), endChunk()), snapshot.ErrCorrupt, 0},
		"zstd that is not zstd":     {file(validHeader(), append(chunkHeader(1, 1, 4, 4, 0, []byte("abcd")), "abcd"...)), snapshot.ErrCorrupt, 0},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			s, err := snapshot.Read(bytes.NewReader(tt.data))
			if tt.err == nil {
				if err != nil || s.Warning != nil || s.Events.Len() != tt.n {
					t.Fatalf("err = %v, warning = %v, %d events; want %d events", err, s.Warning, s.Events.Len(), tt.n)
				}
				return
			}
			var de *snapshot.DecodeError
			if !errors.Is(err, tt.err) || !errors.As(err, &de) {
				t.Fatalf("err = %v, want a *DecodeError wrapping %v", err, tt.err)
			}
			if s != nil && s.Events.Len() != tt.n {
				t.Fatalf("%d events before the error, want %d", s.Events.Len(), tt.n)
			}
		})
	}
}

// TestStickyError: after an error, the Reader keeps returning it.
func TestStickyError(t *testing.T) {
	data := file(validHeader(), storedChunk(1, 1, eventsPayload(noTables, []byte{0}, nil, []byte{0})))
	r, err := snapshot.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	_, err1 := r.Next()
	var evs snapshot.Events
	err2 := r.ReadChunk(&evs)
	if err1 == nil || err1 == io.EOF || err1 != err2 {
		t.Fatalf("errors %v then %v; want the same decode error", err1, err2)
	}
}

// TestBombs reads files of a few kilobytes that declare millions of events: the reader refuses them by their
// density at the first chunk that breaks it, having decoded little, instead of holding what they expand to.
func TestBombs(t *testing.T) {
	for name, tt := range map[string]struct{ chunks, perChunk int }{
		"67M events in 17 KB":  {64, 1 << 20},
		"10M events in 2.8 KB": {10, 1 << 20},
		"many small chunks":    {2000, 1 << 15},
	} {
		t.Run(name, func(t *testing.T) {
			data := snapshottest.Bomb(tt.chunks, tt.perChunk)
			if len(data) > tt.chunks*400+300 {
				t.Fatalf("the bomb is %d bytes; it should be under 400 per chunk", len(data))
			}
			var s *snapshot.Snapshot
			var err error
			n := allocated(func() { s, err = snapshot.Read(bytes.NewReader(data)) })
			if !errors.Is(err, snapshot.ErrLimit) {
				t.Fatalf("err = %v, want ErrLimit", err)
			}
			if max := uint64(snapshot.DensityAllowance) + 64*uint64(len(data)); s == nil || uint64(s.Events.Len()) > max {
				t.Fatalf("read %d events before refusing; the density cap allows %d", s.Events.Len(), max)
			}
			// What was decoded, plus the decoder's buffers: nowhere near what the file declares.
			if n > 64<<20 {
				t.Errorf("allocated %d MiB for a %d-byte file", n>>20, len(data))
			}
		})
	}
	// The bombs are valid files: under limits that allow their density they read back whole.
	data := snapshottest.Bomb(3, 1<<16)
	s, err := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(snapshot.Limits{EventsPerByte: 1 << 20, ChunkRatio: 1 << 20}))
	if err != nil || s.Events.Len() != 3<<16 || !errors.Is(s.Warning, snapshot.ErrTruncated) {
		t.Fatalf("read %d events, err %v, warning %v; want %d events cut short", s.Events.Len(), err, s.Warning, 3<<16)
	}
	for i, e := range s.Events.All() {
		if e.Action != snapshot.ActionAnnotation || e.Seq != uint64(i) {
			t.Fatalf("event %d is %+v, want an annotation", i, e)
		}
	}
}

// TestChunkRatio refuses a compressed chunk that expands beyond the ratio cap before decompressing it.
func TestChunkRatio(t *testing.T) {
	data := snapshottest.Bomb(1, 1<<20) // 2 MiB decoded from about 300 bytes
	_, err := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(snapshot.Limits{EventsPerByte: 1 << 20}))
	if !errors.Is(err, snapshot.ErrLimit) || !strings.Contains(err.Error(), "expands more than 1024 times") {
		t.Fatalf("err = %v, want the ratio cap", err)
	}
}
