package pickle

import (
	"bytes"
	"errors"
	"fmt"
	"math/big"
	"strconv"
)

// long decodes the n-byte little-endian two's-complement integer of LONG1 and LONG4: an int64 when it fits,
// else a *big.Int. Snapshot addresses and timestamps are 6 or 7 bytes and take the int64 path.
func (d *decoder) long(n int64) error {
	if n > int64(d.lim.MaxInt) {
		return overLimit("length of int", n, "MaxInt", int64(d.lim.MaxInt))
	}
	b, err := d.take(int(n))
	if err != nil {
		return err
	}
	i, x := decodeLong(b)
	var v Value
	if x != nil {
		v, err = d.big(x)
	} else {
		v, err = d.int(i)
	}
	if err != nil {
		return err
	}
	return d.pushNew(v)
}

// decodeLong decodes a little-endian two's-complement integer of any length: an int64, or a *big.Int when
// it does not fit.
func decodeLong(b []byte) (int64, *big.Int) {
	n := len(b)
	if n == 0 {
		return 0, nil
	}
	neg := b[n-1]&0x80 != 0
	// Bytes above the 8th that only repeat the sign do not change the value.
	fits := true
	if n > 8 {
		fill := byte(0)
		if neg {
			fill = 0xff
		}
		for _, c := range b[8:] {
			if c != fill {
				fits = false
				break
			}
		}
		if fits && (b[7]&0x80 != 0) != neg {
			fits = false // the 8-byte prefix has the wrong sign: the value is just outside int64
		}
	}
	if fits {
		var u uint64
		for i := min(n, 8) - 1; i >= 0; i-- {
			u = u<<8 | uint64(b[i])
		}
		if neg && n < 8 {
			u |= ^uint64(0) << (8 * n)
		}
		return int64(u), nil
	}
	be := make([]byte, n)
	for i, c := range b {
		be[n-1-i] = c
	}
	x := new(big.Int).SetBytes(be)
	if neg {
		x.Sub(x, new(big.Int).Lsh(big.NewInt(1), uint(8*n)))
	}
	return 0, x
}

// int stores an int: in the Value itself when it fits 60 bits (every snapshot address, size and time does).
func (d *decoder) int(v int64) (Value, error) {
	if v >= -1<<(tagShift-1) && v < 1<<(tagShift-1) {
		return mk(tInt, uint64(v)&payload), nil
	}
	var err error
	if d.doc.wides, err = growSlice(&d.mem, d.doc.wides, 1, 8); err != nil {
		return 0, err
	}
	d.doc.wides = append(d.doc.wides, v)
	return mk(tWide, uint64(len(d.doc.wides)-1)), nil
}

// big stores an int outside int64.
func (d *decoder) big(x *big.Int) (Value, error) {
	var err error
	if d.doc.bigs, err = growSlice(&d.mem, d.doc.bigs, 1, 8); err != nil {
		return 0, err
	}
	if err := d.mem.add(bigBytes(x)); err != nil {
		return 0, err
	}
	d.doc.bigs = append(d.doc.bigs, x)
	return mk(tBig, uint64(len(d.doc.bigs)-1)), nil
}

// bigBytes is what a *big.Int holds: the struct and its words.
func bigBytes(x *big.Int) int64 { return 32 + 8*int64(len(x.Bits())) }

// float stores a float.
func (d *decoder) float(f float64) (Value, error) {
	var err error
	if d.doc.floats, err = growSlice(&d.mem, d.doc.floats, 1, 8); err != nil {
		return 0, err
	}
	d.doc.floats = append(d.doc.floats, f)
	return mk(tFloat, uint64(len(d.doc.floats)-1)), nil
}

// line returns the text argument of a protocol 0 opcode, up to its newline, which it consumes. Text numbers
// are capped at MaxInt characters so a missing newline is found without scanning the whole input.
func (d *decoder) line() ([]byte, error) {
	most := d.lim.MaxInt + 2 // digits, an 'L' suffix and the newline
	ended := d.need(most)    // the input may well end sooner: only a line without a newline is an error
	rest := d.data[d.pos:]
	if len(rest) > most {
		rest = rest[:most]
	}
	i := bytes.IndexByte(rest, '\n')
	if i < 0 {
		if ended != nil {
			d.pos = len(d.data)
			return nil, fmt.Errorf("no newline: %w", ended)
		}
		return nil, overLimit("length of text number", int64(len(rest)), "MaxInt", int64(d.lim.MaxInt))
	}
	d.pos += i + 1
	return rest[:i], nil
}

// textNumber is INT, LONG and FLOAT: decimal text as protocols 0 and 1 write it. Python's own reader is more
// permissive (any int() literal); picklers only ever write repr().
func (d *decoder) textNumber(op byte) error {
	s, err := d.line()
	if err != nil {
		return err
	}
	if n := len(bytes.TrimLeft(bytes.TrimSuffix(s, []byte("L")), "+-")); n > d.lim.MaxInt {
		return overLimit("length of text number", int64(n), "MaxInt", int64(d.lim.MaxInt))
	}
	switch op {
	case opFloat:
		f, err := strconv.ParseFloat(string(s), 64)
		if err != nil && !errors.Is(err, strconv.ErrRange) { // out of range is ±Inf or 0, as Python's float()
			return malformed("FLOAT %q", s)
		}
		v, err := d.float(f)
		if err != nil {
			return err
		}
		return d.pushNew(v)
	case opInt:
		// Protocol 0 writes bools as INT 01 and INT 00.
		switch string(s) {
		case "01":
			return d.pushNew(mk(tTrue, 0))
		case "00":
			return d.pushNew(mk(tFalse, 0))
		}
	case opLong:
		s = bytes.TrimSuffix(s, []byte("L"))
	}
	v, err := parseDecimal(s)
	if err != nil {
		return err
	}
	var val Value
	if x, ok := v.(*big.Int); ok {
		val, err = d.big(x)
	} else {
		val, err = d.int(v.(int64))
	}
	if err != nil {
		return err
	}
	return d.pushNew(val)
}

// parseDecimal parses an optionally signed decimal integer into an int64 or, beyond that, a *big.Int.
func parseDecimal(s []byte) (any, error) {
	digits := s
	if len(digits) > 0 && (digits[0] == '-' || digits[0] == '+') {
		digits = digits[1:]
	}
	if len(digits) == 0 {
		return nil, malformed("integer %q", s)
	}
	for _, c := range digits {
		if c < '0' || c > '9' {
			return nil, malformed("integer %q", s)
		}
	}
	if len(digits) > 1 && digits[0] == '0' {
		// CPython's readers disagree on these (C reads octal, Python refuses); no pickler writes them.
		return nil, malformed("integer %q has a leading zero", s)
	}
	if v, err := strconv.ParseInt(string(s), 10, 64); err == nil {
		return v, nil
	}
	x, ok := new(big.Int).SetString(string(s), 10)
	if !ok {
		return nil, malformed("integer %q", s)
	}
	return x, nil
}

// textIndex is the decimal memo index of GET and PUT.
func (d *decoder) textIndex() (uint64, error) {
	s, err := d.line()
	if err != nil {
		return 0, err
	}
	i, err := strconv.ParseUint(string(s), 10, 64)
	if err != nil {
		return 0, malformed("memo index %q", s)
	}
	return i, nil
}
