package pickle

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"testing"
)

// fuzzLimits keep each fuzz input's decode small: the point is that limits hold, not that defaults are big.
var fuzzLimits = Limits{
	MaxInput: 1 << 20, MaxString: 1 << 16, MaxInt: 256, MaxMemo: 1 << 12, MaxStack: 1 << 12,
	MaxItems: 1 << 12, MaxDepth: 64, MaxObjects: 1 << 16,
}

// FuzzDecode checks that no input panics (TestMain lets a panic through), that every failure is a
// *DecodeError, that a success is a well-formed tree within the limits, and that the stream entry points,
// fed in one piece or a few bytes at a time, agree with the []byte ones. Under a memory ceiling, a decode
// either fails with ErrMemory, never having held more than the ceiling, or does what it does without one.
// Seeds are in testdata/fuzz/FuzzDecode (written by testdata/gen.py).
func FuzzDecode(f *testing.F) {
	f.Add([]byte("\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00}\x94\x8c\x01a\x94K\x01s."))
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := fuzzLimits.Decode(data)
		if err != nil {
			var de *DecodeError
			if !errors.As(err, &de) {
				t.Fatalf("%v is not a *DecodeError", err)
			}
			if errors.Is(err, errInternal) {
				t.Fatalf("internal error: %v", err)
			}
		} else {
			checkTree(t, v, fuzzLimits.MaxDepth)
			d, err := fuzzLimits.DecodeDoc(data)
			if err != nil {
				t.Fatalf("Decode succeeded, DecodeDoc: %v", err)
			}
			checkDoc(t, d, d.Root(), d.Any(d.Root()), 0)
		}
		_, err2 := fuzzLimits.DecodeReader(bytes.NewReader(data))
		if (err == nil) != (err2 == nil) || err != nil && err.Error() != err2.Error() {
			t.Fatalf("Decode: %v; DecodeReader: %v", err, err2)
		}
		d, err3 := fuzzLimits.DecodeDocReader(&smallReads{data, rand.New(rand.NewPCG(uint64(len(data)), 7))})
		if (err == nil) != (err3 == nil) || err != nil && err.Error() != err3.Error() {
			t.Fatalf("Decode: %v; DecodeDocReader in small reads: %v", err, err3)
		}
		if err3 == nil {
			checkDoc(t, d, d.Root(), v, 0)
		}

		// Under a ceiling that some inputs pass: the slice, then the stream, which also holds its buffer.
		for _, extra := range []int64{0, 2 * window} {
			lim := fuzzLimits
			lim.MaxMemory = extra + 4<<10 + 12*int64(len(data))
			dec, err3 := lim.withDefaults().slice(data)
			if extra > 0 {
				dec, err3 = lim.withDefaults().stream(&smallReads{data, rand.New(rand.NewPCG(3, 4))})
			}
			if err3 != nil {
				t.Fatalf("a decoder within %d bytes: %v", lim.MaxMemory, err3)
			}
			d, err3 := dec.decode()
			switch {
			case dec.mem.peak > lim.MaxMemory:
				t.Fatalf("held %d bytes under a ceiling of %d", dec.mem.peak, lim.MaxMemory)
			case err3 == nil && err != nil:
				t.Fatalf("under a ceiling: success; without: %v", err)
			case err3 == nil:
				checkDoc(t, d, d.Root(), v, 0)
			case !errors.Is(err3, ErrMemory) && (err == nil || err.Error() != err3.Error()):
				t.Fatalf("under a ceiling: %v; without: %v", err3, err)
			}
		}
	})
}
