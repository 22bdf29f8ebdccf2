package pickle

import (
	"encoding/binary"
	"fmt"
	"io"
)

// Decode decodes the pickle in data with the default Limits.
func Decode(data []byte) (any, error) { return Limits{}.Decode(data) }

// DecodeReader reads all of r, up to the default Limits.MaxInput, and decodes it.
func DecodeReader(r io.Reader) (any, error) { return Limits{}.DecodeReader(r) }

// Decode decodes the pickle in data within the limits l. The result does not alias data.
func (l Limits) Decode(data []byte) (v any, err error) {
	l = l.withDefaults()
	if int64(len(data)) > l.MaxInput {
		return nil, &DecodeError{Err: overLimit("input bytes", int64(len(data)), "MaxInput", l.MaxInput)}
	}
	d := decoder{lim: l, data: data, ar: newArena(len(data))}
	d.keys.budget = keyWorkPerByte*int64(len(data)) + keyWorkBase
	d.memo.max = l.MaxMemo
	// pickle.dump memoizes every container and str: one entry per 16 to 130 bytes of a snapshot.
	d.memo.dense = make([]any, 0, min(len(data)/16+16, l.MaxMemo, 1<<16))
	d.stack = make([]any, 0, min(len(data)/32+16, 256))
	d.marks = make([]int, 0, 16)
	defer d.recoverBug(&err)
	return d.run()
}

// DecodeReader reads all of r, up to l.MaxInput bytes, and decodes it. A longer input fails without being read
// past the limit.
func (l Limits) DecodeReader(r io.Reader) (any, error) {
	l = l.withDefaults()
	data, err := readAll(r, l.MaxInput)
	if err != nil {
		return nil, err
	}
	return l.Decode(data)
}

// panicOnBug lets tests see a decoder panic with its stack instead of the error it is turned into.
var panicOnBug = false

// recoverBug is the last line of defence: a panic is a bug in this package, and it becomes an error naming
// the opcode being decoded rather than taking the program down. Tests run with panicOnBug set.
func (d *decoder) recoverBug(err *error) {
	if panicOnBug {
		return
	}
	if r := recover(); r != nil {
		*err = d.fail(fmt.Errorf("%w: %v", errInternal, r))
	}
}

// decoder holds the state of one decode.
type decoder struct {
	lim  Limits
	data []byte
	pos  int // next byte to read
	at   int // offset of the opcode being decoded

	stack   []any
	marks   []int // stack lengths at each MARK
	fence   int   // the last mark, or 0: opcodes may not pop below it
	memo    memo
	objects int64 // values created so far

	ar          *arena
	keys        keyHasher
	strs        internCache     // short strings, boxed once
	ints        intCache        // ints above 255, boxed once
	tupleDepths map[*any]uint16 // depth of tuples that contain containers, keyed by their first element
}

// fail wraps a cause with the offset and name of the opcode being decoded.
func (d *decoder) fail(err error) error {
	if d.at >= len(d.data) {
		return &DecodeError{Offset: int64(len(d.data)), Err: err}
	}
	return &DecodeError{Offset: int64(d.at), Op: opNames[d.data[d.at]], Err: err}
}

// run decodes opcodes until STOP. The opcodes that make up most of a snapshot (memo reads, MEMOIZE, MARK) are
// decoded inline when their common case holds, on local copies of the position, stack and memo that stay in
// registers; everything else, including those opcodes' error cases, goes to step.
func (d *decoder) run() (any, error) {
	data := d.data
	pos, stack, dense := d.pos, d.stack, d.memo.dense
	maxStack := d.lim.MaxStack
	for pos < len(data) {
		op := data[pos]
		switch op {
		case opBinGet:
			if pos+1 < len(data) && int(data[pos+1]) < len(dense) && len(stack)+len(d.marks) < maxStack {
				if len(stack) == cap(stack) {
					stack = grow(stack)
				}
				stack = append(stack, dense[data[pos+1]])
				pos += 2
				continue
			}
		case opLongBinGet:
			if pos+4 < len(data) && len(stack)+len(d.marks) < maxStack {
				if i := binary.LittleEndian.Uint32(data[pos+1:]); uint64(i) < uint64(len(dense)) {
					if len(stack) == cap(stack) {
						stack = grow(stack)
					}
					stack = append(stack, dense[i])
					pos += 5
					continue
				}
			}
		case opMemoize:
			if len(stack) > d.fence && len(d.memo.sparse) == 0 && len(dense) < d.memo.max {
				if len(dense) == cap(dense) {
					dense = grow(dense)
				}
				dense = append(dense, stack[len(stack)-1])
				pos++
				continue
			}
		case opMark:
			if len(stack)+len(d.marks) < maxStack {
				d.fence = len(stack)
				d.marks = append(grow(d.marks), d.fence)
				pos++
				continue
			}
		}
		d.at, d.pos, d.stack, d.memo.dense = pos, pos+1, stack, dense
		if op == opStop {
			v, err := d.pop()
			if err != nil {
				return nil, d.fail(err)
			}
			return v, nil
		}
		if err := d.step(op); err != nil {
			return nil, d.fail(err)
		}
		pos, stack, dense = d.pos, d.stack, d.memo.dense
	}
	d.at = pos
	return nil, d.fail(fmt.Errorf("no STOP opcode: %w", errTruncated))
}
