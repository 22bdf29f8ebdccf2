package snapshot_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// TestFlippedBits flips one bit in every byte of a multi-chunk file. A flip in a chunk is a checksum error
// at that chunk, after the events of the chunks before it; a flip in the file header fails NewReader.
func TestFlippedBits(t *testing.T) {
	data, full := multiChunk(t)
	headerLen, chunks := layout(t, data)
	for off := range data {
		damaged := bytes.Clone(data)
		damaged[off] ^= 1 << (off % 8)
		s, err := snapshot.Read(bytes.NewReader(damaged))
		if off < headerLen {
			if s != nil || !(errors.Is(err, snapshot.ErrChecksum) || errors.Is(err, snapshot.ErrNotSnapshot) ||
				errors.Is(err, snapshot.ErrUnsupportedVersion) || errors.Is(err, snapshot.ErrLimit) ||
				errors.Is(err, snapshot.ErrTruncated)) {
				t.Fatalf("flip at %d in the header: %v", off, err)
			}
			continue
		}
		var de *snapshot.DecodeError
		if !errors.As(err, &de) || !errors.Is(err, snapshot.ErrChecksum) {
			t.Fatalf("flip at %d: err = %v, want a *DecodeError wrapping ErrChecksum", off, err)
		}
		want := 0
		var at int
		for _, c := range chunks {
			if c.end <= off {
				want += c.events
			} else {
				at = c.start
				break
			}
		}
		if de.Offset != int64(at) {
			t.Fatalf("flip at %d: error at offset %d, want the chunk at %d", off, de.Offset, at)
		}
		sameEvents(t, s.Events, full.Events.Slice(0, want))
	}
}
