package pickle

import (
	"unicode/utf8"
	"unsafe"
)

// Strings. pickle.dump memoizes each distinct str object, so a snapshot from Python stores every key once;
// other writers, or Python data whose equal strings are distinct objects, repeat them. Every short str is
// interned: a repeat costs a hash lookup and no copy, and equal short strs are one Value, which is what lets a
// dict find a key by comparing Values.

// internMaxLen is the longest str interned: the longest snapshot key is 33 bytes, and long strings rarely
// repeat without the memo.
const internMaxLen = 48

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

// str stores UTF-8 bytes as a str, interning it when short.
func (d *decoder) str(b []byte) (Value, error) {
	doc := d.doc
	if len(b) > internMaxLen {
		if !validUTF8(b) {
			return 0, malformed("str is not valid UTF-8")
		}
		return d.addText(tStr, b)
	}
	v, slot := doc.intern.find(doc, unsafe.String(unsafe.SliceData(b), len(b))) // b is not kept
	if v != 0 {
		return v, nil
	}
	if !validUTF8(b) {
		return 0, malformed("str is not valid UTF-8")
	}
	v, err := d.addText(tStr, b)
	if err != nil {
		return 0, err
	}
	if err := doc.intern.add(doc, v, slot, &d.mem); err != nil {
		return 0, err
	}
	return v, nil
}

// addText copies b into the Doc's text and returns it as a value with the given tag.
func (d *decoder) addText(tag uint64, b []byte) (Value, error) {
	doc := d.doc
	if len(doc.spans) == cap(doc.spans) || len(doc.text)+len(b) > cap(doc.text) {
		if err := d.growText(len(b)); err != nil {
			return 0, err
		}
	}
	doc.spans = append(doc.spans, span{off: len(doc.text), n: len(b)})
	doc.text = append(doc.text, b...)
	return mk(tag, uint64(len(doc.spans)-1)), nil
}

// growText makes room for one more span and n more bytes of text.
func (d *decoder) growText(n int) error {
	doc := d.doc
	var err error
	if doc.spans, err = growSlice(&d.mem, doc.spans, 1, spanBytes); err != nil {
		return err
	}
	doc.text, err = growSlice(&d.mem, doc.text, n, 1)
	return err
}

// spanBytes is the size of a span.
const spanBytes = 16

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
	}
	tag := tBytes
	if op == opByteArray8 {
		tag = tByteArray
	}
	v, err := d.addText(tag, b)
	if err != nil {
		return err
	}
	return d.pushNew(v)
}
