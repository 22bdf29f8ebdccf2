package snapshot_test

import (
	"bytes"
	"errors"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// writeEvents writes a snapshot of the given events, closed with footer f (nil: none), in chunks of one
// event, so that a reader keeps every chunk before a bad one.
func writeEvents(t *testing.T, events []snapshot.Event, f *snapshot.Footer) []byte {
	t.Helper()
	var buf bytes.Buffer
	w, err := snapshot.NewWriter(&buf, testMeta(), snapshot.WithChunkEvents(1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		if err := w.Write(&events[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(f); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestSizesPastWhatAnyDeviceHolds: a file may carry any int64 as a size, and two live blocks of 2^62 bytes
// make every total the analysis takes wrap to -2^63. The reader refuses the first event whose size no device
// holds (over 2^50 bytes, or below 0), and the first that takes the sizes together past 2^55 bytes; what came
// before it stays readable.
func TestSizesPastWhatAnyDeviceHolds(t *testing.T) {
	alloc := func(addr uint64, size int64) snapshot.Event {
		return snapshot.Event{Action: snapshot.ActionAlloc, Addr: addr, Size: size, BlockSize: size}
	}
	var many []snapshot.Event // blocks of 2^50 bytes: each alloc names 2^51 (size and block size)
	for i := range 20 {
		many = append(many, alloc(uint64(i)<<51, 1<<50))
	}
	for name, c := range map[string]struct {
		events []snapshot.Event
		footer *snapshot.Footer
		kept   int // events read before the refusal
	}{
		"two live blocks of 2^62 bytes": {events: []snapshot.Event{alloc(1<<40, 1<<62), alloc(1<<41, 1<<62)}, kept: 0},
		"a negative size":               {events: []snapshot.Event{alloc(1<<40, 512), alloc(1<<41, -512)}, kept: 1},
		// 16 allocations reach 2^55 exactly; the 17th passes it.
		"sizes adding up past 2^55 bytes": {events: many, kept: 16},
		"a final segment of 2^63-1 bytes": {events: []snapshot.Event{alloc(1<<40, 512)}, kept: 1,
			footer: &snapshot.Footer{Segments: []snapshot.Segment{{Addr: 1 << 40, Size: 1<<63 - 1}}}},
		// Each segment of 2^50 bytes names 3 x 2^50 (itself, its block and the block's request): the eleventh
		// passes 2^55.
		"a final state adding up past 2^55 bytes": {events: []snapshot.Event{alloc(1<<40, 512)}, kept: 1,
			footer: &snapshot.Footer{Segments: bigSegments(11)}},
	} {
		t.Run(name, func(t *testing.T) {
			data := writeEvents(t, c.events, c.footer)
			s, err := snapshot.Read(bytes.NewReader(data))
			if !errors.Is(err, snapshot.ErrSizes) {
				t.Fatalf("err = %v, want ErrSizes", err)
			}
			if s == nil || s.Events.Len() != c.kept {
				t.Fatalf("read %v events before the refusal, want %d", s, c.kept)
			}
			// The same file read with the cap off holds every event as written: the format is not at fault.
			all, err := snapshot.Read(bytes.NewReader(data), snapshot.WithLimits(snapshot.Limits{SizeBytes: -1}))
			if err != nil || all.Events.Len() != len(c.events) {
				t.Fatalf("without the cap: %v, %v", all, err)
			}
		})
	}
}

// bigSegments is n segments of 2^50 bytes, each one block in use.
func bigSegments(n int) []snapshot.Segment {
	segs := make([]snapshot.Segment, n)
	for i := range segs {
		addr := uint64(i+1) << 51
		segs[i] = snapshot.Segment{Addr: addr, Size: 1 << 50, Pool: "large",
			Blocks: []snapshot.Block{{Addr: addr, Size: 1 << 50, Requested: 1 << 50, State: "active_allocated"}}}
	}
	return segs
}
