package pickle

import (
	"bytes"
	"unicode/utf8"
)

// Strings. pickle.dump memoizes each distinct str object, so a snapshot from Python stores every key once;
// other writers, or Python data whose equal strings are distinct objects, repeat them. A small direct-mapped
// cache of short strings makes each repeat cost a hash and a compare instead of two allocations, and never
// grows, so it cannot be abused.

const (
	internMaxLen   = 48  // the longest snapshot key is 33 bytes; long strings rarely repeat without the memo
	internMaxSlots = 512 // a power of two
)

// internCache maps a short string's bytes to the boxed string last seen in its slot. It has a power-of-two
// number of slots, fewer for a small input.
type internCache []struct {
	s string
	v any
}

func newInternCache(inputLen int) internCache {
	n := 16
	for n < internMaxSlots && n*512 < inputLen {
		n *= 2
	}
	return make(internCache, n)
}

// slot hashes b (FNV-1a) to a cache slot.
func (c internCache) slot(b []byte) int {
	h := uint32(2166136261)
	for _, x := range b {
		h = (h ^ uint32(x)) * 16777619
	}
	return int(h & uint32(len(c)-1))
}

// unicode is SHORT_BINUNICODE, BINUNICODE and BINUNICODE8: n bytes of UTF-8.
func (d *decoder) unicode(n uint64) error {
	b, err := d.takeDeclared(n, "str")
	if err != nil {
		return err
	}
	v, err := d.str(b)
	if err != nil {
		return err
	}
	return d.pushNew(v)
}

// str converts UTF-8 bytes to a boxed string, through the intern cache when short.
func (d *decoder) str(b []byte) (any, error) {
	if len(b) > internMaxLen {
		if !validUTF8(b) {
			return nil, malformed("str is not valid UTF-8")
		}
		return string(b), nil
	}
	if d.strs == nil {
		d.strs = newInternCache(len(d.data))
	}
	e := &d.strs[d.strs.slot(b)]
	if e.v != nil && e.s == string(b) { // the conversion in a comparison does not allocate
		return e.v, nil
	}
	if !validUTF8(b) {
		return nil, malformed("str is not valid UTF-8")
	}
	e.s = string(b)
	e.v = e.s
	return e.v, nil
}

// validUTF8 reports whether b is UTF-8 as Python decodes pickled str: with "surrogatepass", so the 3-byte
// encodings of U+D800..U+DFFF (which pickle.dump writes for lone surrogates) are accepted.
func validUTF8(b []byte) bool {
	if utf8.Valid(b) {
		return true
	}
	for len(b) > 0 {
		if b[0] < utf8.RuneSelf {
			b = b[1:]
			continue
		}
		if r, size := utf8.DecodeRune(b); r != utf8.RuneError || size > 1 {
			b = b[size:]
			continue
		}
		// A surrogate: ED A0..BF 80..BF.
		if len(b) >= 3 && b[0] == 0xED && b[1] >= 0xA0 && b[1] <= 0xBF && b[2] >= 0x80 && b[2] <= 0xBF {
			b = b[3:]
			continue
		}
		return false
	}
	return true
}

// bytesOp is SHORT_BINBYTES, BINBYTES, BINBYTES8, BYTEARRAY8, and the Python 2 strings SHORT_BINSTRING and
// BINSTRING (which Python 3 loads as str with its default ASCII encoding).
func (d *decoder) bytesOp(op byte) error {
	var n uint64
	switch op {
	case opShortBinBytes, opShortBinString:
		b, err := d.u8()
		if err != nil {
			return err
		}
		n = uint64(b)
	case opBinBytes:
		b, err := d.u32()
		if err != nil {
			return err
		}
		n = uint64(b)
	case opBinString:
		b, err := d.u32()
		if err != nil {
			return err
		}
		if int32(b) < 0 {
			return malformed("negative byte count %d", int32(b))
		}
		n = uint64(b)
	default: // BINBYTES8, BYTEARRAY8
		b, err := d.u64()
		if err != nil {
			return err
		}
		n = b
	}
	what := "bytes"
	if op == opShortBinString || op == opBinString {
		what = "str"
	}
	b, err := d.takeDeclared(n, what)
	if err != nil {
		return err
	}
	switch op {
	case opShortBinString, opBinString:
		for _, c := range b {
			if c >= utf8.RuneSelf {
				return malformed("Python 2 str is not ASCII (Python 3 loads it only with encoding='latin1' or 'bytes')")
			}
		}
		v, err := d.str(b)
		if err != nil {
			return err
		}
		return d.pushNew(v)
	case opByteArray8:
		return d.pushNew(ByteArray(bytes.Clone(b)))
	}
	return d.pushNew(bytes.Clone(b))
}
