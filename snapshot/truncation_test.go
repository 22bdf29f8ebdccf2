package snapshot_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// chunkInfo is a chunk as the framing describes it (docs/format.md §4), parsed without the package's reader.
type chunkInfo struct {
	start, end int // byte range, header included
	kind       byte
	events     int
}

// layout parses a snapshot's framing: the header's length and the chunks.
func layout(t testing.TB, data []byte) (headerLen int, chunks []chunkInfo) {
	t.Helper()
	headerLen = 16 + int(binary.LittleEndian.Uint32(data[12:])) + 4
	for off := headerLen; off < len(data); {
		stored := int(binary.LittleEndian.Uint32(data[off+4:]))
		c := chunkInfo{start: off, end: off + 24 + stored, kind: data[off], events: int(binary.LittleEndian.Uint32(data[off+12:]))}
		chunks = append(chunks, c)
		off = c.end
	}
	if last := chunks[len(chunks)-1]; last.end != len(data) || last.kind != 2 {
		t.Fatalf("framing does not end with the end chunk at the end of the data")
	}
	return headerLen, chunks
}

// multiChunk is a real trace in many chunks, with a footer.
func multiChunk(t testing.TB) ([]byte, *snapshot.Snapshot) {
	cfg := snapshottest.Tiny()
	cfg.Iterations = 2
	var buf bytes.Buffer
	if err := snapshottest.Encode(&buf, cfg, snapshot.WithChunkEvents(50)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes(), snapshottest.Trace(cfg)
}

// TestTruncateEveryOffset cuts a file at every byte: what reads back is the events of the whole chunks
// before the cut, a warning unless nothing was cut, and an error only inside the header.
func TestTruncateEveryOffset(t *testing.T) {
	data, full := multiChunk(t)
	headerLen, chunks := layout(t, data)
	if len(chunks) < 10 {
		t.Fatalf("only %d chunks; the test wants many", len(chunks))
	}
	for cut := 0; cut <= len(data); cut++ {
		s, err := snapshot.Read(bytes.NewReader(data[:cut]))
		if cut < headerLen {
			var de *snapshot.DecodeError
			if !errors.As(err, &de) || !errors.Is(err, snapshot.ErrTruncated) || s != nil {
				t.Fatalf("cut %d inside the header: err = %v, want a *DecodeError wrapping ErrTruncated", cut, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("cut %d: %v", cut, err)
		}
		// The events of the whole chunks before the cut.
		want, boundary := 0, headerLen
		for _, c := range chunks {
			if c.end <= cut {
				want += c.events
				boundary = c.end
			}
		}
		sameEvents(t, s.Events, full.Events.Slice(0, want))
		if cut == len(data) {
			if s.Warning != nil || s.Footer == nil {
				t.Fatalf("whole file: warning %v, footer %v", s.Warning, s.Footer)
			}
			continue
		}
		var tw *snapshot.TruncatedError
		if !errors.As(s.Warning, &tw) || !errors.Is(s.Warning, snapshot.ErrTruncated) {
			t.Fatalf("cut %d: warning = %v, want a *TruncatedError", cut, s.Warning)
		}
		if tw.Offset != int64(boundary) || tw.Events != uint64(want) {
			t.Fatalf("cut %d: warning says offset %d, %d events; want %d, %d", cut, tw.Offset, tw.Events, boundary, want)
		}
		if s.Footer != nil {
			t.Fatalf("cut %d: a footer from a cut file", cut)
		}
	}
}

// TestTruncateStreaming checks the same through Next, at the chunk boundaries and in between.
func TestTruncateStreaming(t *testing.T) {
	data, full := multiChunk(t)
	_, chunks := layout(t, data)
	for _, c := range chunks[:len(chunks)-1] {
		for _, cut := range []int{c.end, c.end + 1, c.end + 23, c.end + 24, c.end + 30} {
			r, err := snapshot.NewReader(bytes.NewReader(data[:min(cut, len(data))]))
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for {
				e, err := r.Next()
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("cut %d: %v", cut, err)
				}
				if e != full.Events.At(n) {
					t.Fatalf("cut %d: event %d differs", cut, n)
				}
				n++
			}
			if r.Warning() == nil || r.Footer() != nil {
				t.Fatalf("cut %d: warning %v footer %v", cut, r.Warning(), r.Footer())
			}
			if r.Offset() != int64(c.end) && cut >= c.end {
				// Everything up to the last whole chunk was consumed.
				var tw *snapshot.TruncatedError
				errors.As(r.Warning(), &tw)
				if tw.Offset != r.Offset() {
					t.Fatalf("cut %d: Offset %d, warning offset %d", cut, r.Offset(), tw.Offset)
				}
			}
		}
	}
}

func TestTruncatedHeader(t *testing.T) {
	data, _ := multiChunk(t)
	headerLen, _ := layout(t, data)
	for name, cut := range map[string]int{
		"empty": 0, "part of the magic": 3, "magic only": 8, "fixed header": 16, "half the metadata": (16 + headerLen) / 2,
		"no checksum": headerLen - 4, "half the checksum": headerLen - 2,
	} {
		t.Run(name, func(t *testing.T) {
			_, err := snapshot.NewReader(bytes.NewReader(data[:cut]))
			var de *snapshot.DecodeError
			if !errors.As(err, &de) || !errors.Is(err, snapshot.ErrTruncated) {
				t.Fatalf("err = %v, want a *DecodeError wrapping ErrTruncated", err)
			}
		})
	}
}

// TestZeroFilledTail: after a crash some file systems leave zeros where the last writes should have gone.
func TestZeroFilledTail(t *testing.T) {
	data, full := multiChunk(t)
	_, chunks := layout(t, data)
	cut := chunks[3].end
	damaged := append(bytes.Clone(data[:cut+10]), make([]byte, 4096)...)
	copy(damaged[cut:], make([]byte, 10)) // the cut chunk's header is zeroed too
	s, err := snapshot.Read(bytes.NewReader(damaged))
	if err != nil {
		t.Fatal(err)
	}
	want := 0
	for _, c := range chunks[:4] {
		want += c.events
	}
	sameEvents(t, s.Events, full.Events.Slice(0, want))
	var tw *snapshot.TruncatedError
	if !errors.As(s.Warning, &tw) || tw.Offset != int64(cut) {
		t.Fatalf("warning = %v, want truncation at %d", s.Warning, cut)
	}
}
