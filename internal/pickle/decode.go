package pickle

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/bits"
)

// Decode decodes the pickle in data with the default Limits.
func Decode(data []byte) (any, error) { return Limits{}.Decode(data) }

// DecodeReader reads all of r, up to the default Limits.MaxInput, and decodes it.
func DecodeReader(r io.Reader) (any, error) { return Limits{}.DecodeReader(r) }

// Decode decodes the pickle in data within the limits l into Go values (see the package documentation). The
// result does not alias data.
func (l Limits) Decode(data []byte) (any, error) {
	doc, err := l.DecodeDoc(data)
	if err != nil {
		return nil, err
	}
	return doc.Any(doc.Root()), nil
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

// DecodeDoc decodes the pickle in data with the default Limits into a Doc.
func DecodeDoc(data []byte) (*Doc, error) { return Limits{}.DecodeDoc(data) }

// DecodeDoc decodes the pickle in data within the limits l into a Doc, the fast path for a large snapshot.
// The Doc does not alias data.
func (l Limits) DecodeDoc(data []byte) (doc *Doc, err error) {
	l = l.withDefaults()
	if int64(len(data)) > l.MaxInput {
		return nil, &DecodeError{Err: overLimit("input bytes", int64(len(data)), "MaxInput", l.MaxInput)}
	}
	n := len(data)
	d := decoder{lim: l, data: data, doc: newDoc(n)}
	d.keys.budget = keyWorkPerByte*int64(n) + keyWorkBase
	d.mat.doc = d.doc
	// pickle.dump memoizes every container and str: one entry per 16 to 130 bytes of a snapshot, 35 in f4.
	d.memo = make([]Value, 0, min(n/32+64, l.MaxMemo, 1<<16))
	d.stack = make([]Value, 0, min(n/32+16, 256))
	d.marks = make([]int, 0, 16)
	d.meta = make([]uint16, 0, min(n/32+16, 1<<16))
	defer d.recoverBug(&err)
	root, err := d.run()
	if err != nil {
		return nil, err
	}
	d.doc.root = root
	return d.doc, nil
}

// newDoc returns a Doc whose slices suit an input of n bytes: a snapshot has 0.2 to 0.5 container elements
// and a container per 35 to 45 bytes, a few hundred distinct strs at most, and a small one is mostly strs.
func newDoc(n int) *Doc {
	d := &Doc{
		pool:  make([]Value, 0, min(n/2+16, 1<<26)),
		spans: make([]span, 0, min(n/24+16, 512)),
		text:  make([]byte, 0, min(n/2+64, n/64+4096)),
	}
	d.conts = append(make([][]cont, 0, 4), make([]cont, 0, min(n/32+8, contBlock)))
	d.intern.rehash(d, 1<<bits.Len(uint(min(max(n/16, 32), 1024))))
	return d
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

	stack   []Value
	marks   []int // stack lengths at each MARK
	fence   int   // the last mark, or 0: opcodes may not pop below it
	memo    []Value
	sparse  map[uint64]Value // memo entries put out of order, at indices >= len(memo)
	objects int64            // values created so far

	doc        *Doc
	meta       []uint16 // by container: depth, and sharedBit once placed in another
	keys       keyHasher
	mat        materializer // Go forms of non-str keys, for hashing
	emptyTuple Value        // the one empty tuple, once made
}

// fail wraps a cause with the offset and name of the opcode being decoded.
func (d *decoder) fail(err error) error {
	if d.at >= len(d.data) {
		return &DecodeError{Offset: int64(len(d.data)), Err: err}
	}
	return &DecodeError{Offset: int64(d.at), Op: opNames[d.data[d.at]], Err: err}
}

// run decodes opcodes until STOP. The opcodes that make up most of a snapshot (memo reads, MEMOIZE, MARK, small
// ints) are decoded inline when their common case holds, on local copies of the position, stack and memo
// that stay in registers; everything else, including those opcodes' error cases, goes to step.
func (d *decoder) run() (Value, error) {
	data := d.data
	pos, stack, memo := d.pos, d.stack, d.memo
	maxStack := d.lim.MaxStack
	for pos < len(data) {
		op := data[pos]
		switch op {
		case opBinGet:
			if pos+1 < len(data) && int(data[pos+1]) < len(memo) && len(stack)+len(d.marks) < maxStack {
				stack = append(grow(stack), memo[data[pos+1]])
				pos += 2
				continue
			}
		case opLongBinGet:
			if pos+4 < len(data) && len(stack)+len(d.marks) < maxStack {
				if i := binary.LittleEndian.Uint32(data[pos+1:]); uint64(i) < uint64(len(memo)) {
					stack = append(grow(stack), memo[i])
					pos += 5
					continue
				}
			}
		case opMemoize:
			if len(stack) > d.fence && len(d.sparse) == 0 && len(memo) < d.lim.MaxMemo {
				memo = append(grow(memo), stack[len(stack)-1])
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
		case opBinInt1:
			if pos+1 < len(data) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				stack = append(grow(stack), mk(tInt, uint64(data[pos+1])))
				pos += 2
				continue
			}
		case opBinInt2:
			if pos+2 < len(data) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				stack = append(grow(stack), mk(tInt, uint64(binary.LittleEndian.Uint16(data[pos+1:]))))
				pos += 3
				continue
			}
		case opBinInt:
			if pos+4 < len(data) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				i := int64(int32(binary.LittleEndian.Uint32(data[pos+1:])))
				stack = append(grow(stack), mk(tInt, uint64(i)&payload))
				pos += 5
				continue
			}
		case opLong1: // snapshot addresses and sizes: up to 7 bytes, always an int that fits a Value
			if pos+1 < len(data) {
				if n := int(data[pos+1]); n > 0 && n < 8 && pos+2+n <= len(data) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects && n <= d.lim.MaxInt {
					var u uint64
					for _, c := range data[pos+2 : pos+2+n] {
						u = u>>8 | uint64(c)<<56
					}
					i := int64(u) >> (64 - 8*n) // sign-extends from the top byte read
					d.objects++
					stack = append(grow(stack), mk(tInt, uint64(i)&payload))
					pos += 2 + n
					continue
				}
			}
		case opEmptyDict, opEmptyList:
			if len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				tag := tDict
				if op == opEmptyList {
					tag = tList
				}
				stack = append(grow(stack), d.newCont(tag))
				pos++
				continue
			}
		}
		d.at, d.pos, d.stack, d.memo = pos, pos+1, stack, memo
		if op == opStop {
			v, err := d.pop()
			if err != nil {
				return 0, d.fail(err)
			}
			return v, nil
		}
		if err := d.step(op); err != nil {
			return 0, d.fail(err)
		}
		pos, stack, memo = d.pos, d.stack, d.memo
	}
	d.at = pos
	return 0, d.fail(fmt.Errorf("no STOP opcode: %w", errTruncated))
}
