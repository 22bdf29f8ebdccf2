package pickle

import (
	"bytes"
	"errors"
	"testing"
)

// fuzzLimits keep each fuzz input's decode small: the point is that limits hold, not that defaults are big.
var fuzzLimits = Limits{
	MaxInput: 1 << 20, MaxString: 1 << 16, MaxInt: 256, MaxMemo: 1 << 12, MaxStack: 1 << 12,
	MaxItems: 1 << 12, MaxDepth: 64, MaxObjects: 1 << 16,
}

// FuzzDecode checks that no input panics (TestMain lets a panic through), that every failure is a
// *DecodeError, that a success is a well-formed tree within the limits, and that the io.Reader entry point
// agrees with the []byte one. Seeds are in testdata/fuzz/FuzzDecode (written by testdata/gen.py).
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
	})
}
