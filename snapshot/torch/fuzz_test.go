package torch

import (
	"bytes"
	"errors"
	"reflect"
	"testing"
	"testing/iotest"

	"github.com/oomdbg/oomdbg/snapshot"
)

// fuzzLimits keep each input's import small: the point is that limits hold, not that defaults are big.
var fuzzLimits = Limits{MaxInput: 1 << 20, MaxEvents: 1 << 14}

// FuzzImport checks that no input panics (TestMain lets a panic through), that every failure is an
// *ImportError wrapping one of the package's sentinels, and that every success is a well-formed snapshot:
// dense sequence numbers, defined table IDs, valid actions, phases and categories, devices listed in the
// metadata, writable in oomdbg's format, and the same when imported again. ImportReader, fed a few bytes at
// a time, must do what Import does; under a memory ceiling, an import fails with ErrMemory or does what it
// does without one. Seeds are in testdata/fuzz/FuzzImport (written by testdata/gen.py): a valid snapshot
// of each generation, truncated and corrupted ones, JSON, GLOBAL and STACK_GLOBAL opcodes, huge declared
// lengths.
func FuzzImport(f *testing.F) {
	f.Add([]byte(`{"segments": [], "device_traces": [[{"action": "alloc", "addr": 512, "size": 100}]]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := Import(data, WithLimits(fuzzLimits))
		s2, err2 := ImportReader(iotest.HalfReader(bytes.NewReader(data)), WithLimits(fuzzLimits))
		if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() || err == nil && !reflect.DeepEqual(s, s2) {
			t.Fatalf("Import: %v; ImportReader: %v", err, err2)
		}
		lim := fuzzLimits
		lim.MaxMemory = 40<<10 + 40*int64(len(data))
		s3, err3 := ImportReader(bytes.NewReader(data), WithLimits(lim))
		switch {
		case err3 == nil && (err != nil || !reflect.DeepEqual(s, s3)):
			t.Fatalf("under a ceiling: a snapshot; without: %v", err)
		case err3 != nil && !errors.Is(err3, ErrMemory) && (err == nil || err.Error() != err3.Error()):
			t.Fatalf("under a ceiling: %v; without: %v", err3, err)
		}
		if err != nil {
			var ie *ImportError
			if !errors.As(err, &ie) {
				t.Fatalf("%T %v is not an *ImportError", err, err)
			}
			known := false
			for _, s := range []error{ErrNotSnapshot, ErrSchema, ErrUnsafe, ErrTruncated, ErrLimit, ErrMalformed, ErrMemory} {
				known = known || errors.Is(err, s)
			}
			if !known {
				t.Fatalf("%v wraps none of the sentinels", err)
			}
			return
		}
		checkWellFormed(t, s)
		var buf bytes.Buffer
		if err := writeNative(&buf, s); err != nil {
			t.Fatalf("the writer refuses the import: %v", err)
		}
		again, err := Import(data, WithLimits(fuzzLimits))
		if err != nil || !reflect.DeepEqual(s, again) {
			t.Fatalf("a second import differs (%v)", err)
		}
	})
}

// checkWellFormed checks the invariants of a snapshot the rest of oomdbg relies on.
func checkWellFormed(t *testing.T, s *snapshot.Snapshot) {
	t.Helper()
	devices := map[int16]bool{}
	for _, d := range s.Meta.Devices {
		devices[int16(d.Index)] = true
	}
	if len(s.Strings) == 0 || s.Strings[0] != "" || len(s.Frames) == 0 || len(s.Stacks) == 0 || s.Stacks[0] != nil {
		t.Fatal("tables lack their zero entries")
	}
	for _, st := range s.Stacks[1:] {
		if len(st) == 0 {
			t.Fatal("an empty stack with an ID")
		}
		for _, f := range st {
			if f == 0 || int(f) >= len(s.Frames) {
				t.Fatalf("stack refers to frame %d of %d", f, len(s.Frames))
			}
		}
	}
	for _, f := range s.Frames[1:] {
		if int(f.Function) >= len(s.Strings) || int(f.File) >= len(s.Strings) {
			t.Fatal("frame refers to an undefined string")
		}
	}
	for i, e := range s.Events.All() {
		switch {
		case e.Seq != uint64(i):
			t.Fatalf("event %d has Seq %d", i, e.Seq)
		case !e.Action.Valid() || !e.Phase.Valid() || !e.Category.Valid():
			t.Fatalf("event %d: action %v phase %v category %v", i, e.Action, e.Phase, e.Category)
		case int(e.Stack) >= len(s.Stacks) || int(e.Scope) >= len(s.Strings) || int(e.Label) >= len(s.Strings) || int(e.Text) >= len(s.Strings):
			t.Fatalf("event %d refers to an undefined table entry", i)
		case !devices[e.Device]:
			t.Fatalf("event %d on device %d, not in the metadata", i, e.Device)
		case i > 0 && e.Time < s.Events.At(i-1).Time:
			t.Fatalf("event %d goes back in time", i)
		}
	}
	if s.Footer == nil || s.Footer.Summary.Events != uint64(s.Events.Len()) {
		t.Fatal("footer missing or miscounted")
	}
}
