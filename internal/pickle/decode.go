package pickle

import (
	"encoding/binary"
	"fmt"
	"io"
	"io/fs"
	"math/bits"
)

// Decode decodes the pickle in data with the default Limits.
func Decode(data []byte) (any, error) { return Limits{}.Decode(data) }

// DecodeReader decodes the pickle r streams, with the default Limits.
func DecodeReader(r io.Reader) (any, error) { return Limits{}.DecodeReader(r) }

// Decode decodes the pickle in data within the limits l into Go values (see the package documentation). The
// result does not alias data.
func (l Limits) Decode(data []byte) (any, error) {
	l = l.withDefaults()
	d, err := l.slice(data)
	if err != nil {
		return nil, err
	}
	return d.tree()
}

// DecodeReader decodes the pickle r streams within the limits l into Go values, as Decode does (see
// DecodeDocReader for how it reads).
func (l Limits) DecodeReader(r io.Reader) (any, error) {
	l = l.withDefaults()
	d, err := l.stream(r)
	if err != nil {
		return nil, err
	}
	return d.tree()
}

// DecodeDoc decodes the pickle in data with the default Limits into a Doc.
func DecodeDoc(data []byte) (*Doc, error) { return Limits{}.DecodeDoc(data) }

// DecodeDocReader decodes the pickle r streams with the default Limits into a Doc.
func DecodeDocReader(r io.Reader) (*Doc, error) { return Limits{}.DecodeDocReader(r) }

// DecodeDoc decodes the pickle in data within the limits l into a Doc, the fast path for a large snapshot
// already in memory. The Doc does not alias data.
func (l Limits) DecodeDoc(data []byte) (*Doc, error) {
	l = l.withDefaults()
	d, err := l.slice(data)
	if err != nil {
		return nil, err
	}
	return d.decode()
}

// DecodeDocReader decodes the pickle r streams within the limits l into a Doc. It reads r through a buffer of
// 4 to 128 KiB (more only while a long string is read), never the whole input at once, and stops reading at
// STOP (what follows is left unread) or at the first error, so a file that is not a pickle fails after one
// buffer. The result, and the error for a bad input, are those DecodeDoc gives for the same bytes, with one
// exception no pickler's output meets: a FRAME that claims more than 1 MiB is refused when the stream has
// more than 1 MiB left, since checking it would mean holding it all.
func (l Limits) DecodeDocReader(r io.Reader) (*Doc, error) {
	l = l.withDefaults()
	d, err := l.stream(r)
	if err != nil {
		return nil, err
	}
	return d.decode()
}

// slice returns a decoder of the whole input data. Of an input longer than MaxInput it sees only that much,
// so a pickle that needs more fails on MaxInput as a stream would.
func (l Limits) slice(data []byte) (*decoder, error) {
	d, err := newDecoder(l, len(data), 0)
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > l.MaxInput {
		data, d.over = data[:l.MaxInput], true
	}
	d.data = data
	return d, nil
}

// stream returns a decoder of what r streams. It starts sized for what r has left when r can tell (a
// regular file, a bytes.Reader), up to maxHint, and small otherwise: the Doc's slices double as they fill.
func (l Limits) stream(r io.Reader) (*decoder, error) {
	hint, win := firstWindow, firstWindow
	if n := sizeOf(r); n >= 0 {
		hint = int(min(n, maxHint))
		win = min(max(hint+1, 512), window) // +1: the read that finds the end
	}
	d, err := newDecoder(l, hint, int64(win))
	if err != nil {
		return nil, err
	}
	d.r, d.eof = r, false
	d.data = make([]byte, 0, win)
	return d, nil
}

// maxHint bounds the size a stream decoder starts with: a file's length is only a claim (a sparse file
// has any length), so the Doc starts with what a snapshot of 256 KiB needs, about 1 MiB, and grows from
// there.
const maxHint = 256 << 10

// sizeOf returns the bytes r has left to read when it can tell, else -1.
func sizeOf(r io.Reader) int64 {
	switch x := r.(type) {
	case interface{ Len() int }: // bytes.Reader, strings.Reader, bytes.Buffer
		return int64(x.Len())
	case interface {
		Stat() (fs.FileInfo, error)
		io.Seeker
	}:
		fi, err := x.Stat()
		if err != nil || !fi.Mode().IsRegular() {
			return -1
		}
		at, err := x.Seek(0, io.SeekCurrent)
		if err != nil {
			return -1
		}
		return max(fi.Size()-at, 0)
	}
	return -1
}

// newDecoder returns a decoder sized for an input of about n bytes, and holding extra bytes besides (a
// stream's buffer), or an error when the ceiling allows not even that.
func newDecoder(l Limits, n int, extra int64) (*decoder, error) {
	d := &decoder{lim: l, mem: newMeter(l.MaxMemory), eof: true} // no more input than data, until stream says
	memo, stack, meta := min(n/32+64, l.MaxMemo, 1<<16), min(n/32+16, 256), min(n/32+16, 1<<16)
	const marks = 16
	start := docStart(n).bytes() + 8*int64(memo+stack+marks) + 2*int64(meta) + extra
	if err := d.mem.add(start); err != nil {
		return nil, &DecodeError{Err: err}
	}
	d.doc = docStart(n).doc()
	d.keys.budget = keyWorkBase
	d.keys.mem = &d.mem
	d.mat = materializer{doc: d.doc, mem: &d.mem}
	// pickle.dump memoizes every container and str: one entry per 16 to 130 bytes of a snapshot, 35 in f4.
	d.memo = make([]Value, 0, memo)
	d.stack = make([]Value, 0, stack)
	d.marks = make([]int, 0, marks)
	d.meta = make([]uint16, 0, meta)
	return d, nil
}

// decode runs the decoder to STOP and returns its Doc.
func (d *decoder) decode() (doc *Doc, err error) {
	defer d.recoverBug(&err)
	root, err := d.run()
	if err != nil {
		return nil, err
	}
	d.doc.root = root
	d.doc.size = d.base + int64(d.pos)
	return d.doc, nil
}

// tree runs the decoder to STOP and returns the Go values of its Doc.
func (d *decoder) tree() (any, error) {
	doc, err := d.decode()
	if err != nil {
		return nil, err
	}
	m := materializer{doc: doc, mem: &d.mem}
	v := m.value(doc.root)
	if m.err != nil {
		return nil, &DecodeError{Offset: doc.size, Err: m.err}
	}
	return v, nil
}

// docStart is the capacities a Doc starts with for an input of n bytes: a snapshot has 0.2 to 0.5 container
// elements and a container per 35 to 45 bytes, a few hundred distinct strs at most, and a small one is
// mostly strs.
type docStart int

func (n docStart) chunk() int  { return min(int(n)/2+16, chunkMax) }
func (n docStart) spans() int  { return min(int(n)/24+16, 512) }
func (n docStart) text() int   { return min(int(n)/2+64, int(n)/64+4096) }
func (n docStart) conts() int  { return min(int(n)/32+8, contBlock) }
func (n docStart) intern() int { return 1 << bits.Len(uint(min(max(int(n)/16, 32), 1024))) }

func (n docStart) bytes() int64 {
	return 8*int64(n.chunk()) + spanBytes*int64(n.spans()) + int64(n.text()) + contBytes*int64(n.conts()) + 8*int64(n.intern()) +
		shapeBytes*initialShapes
}

func (n docStart) doc() *Doc {
	d := &Doc{
		chunks: [][]Value{make([]Value, 0, n.chunk())},
		shapes: newShapes(),
		spans:  make([]span, 0, n.spans()),
		text:   make([]byte, 0, n.text()),
	}
	d.conts = append(make([][]cont, 0, 4), make([]cont, 0, n.conts()))
	d.intern.rehash(d, n.intern())
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
	lim Limits
	mem meter

	// The input: all of it in data, or a stream r read through data, a window that starts at offset base.
	r     io.Reader
	data  []byte
	base  int64
	eof   bool  // data ends where the input does, or where MaxInput cuts it
	over  bool  // the input goes on past MaxInput
	rerr  error // the error that ended reading r, reported when the bytes it withheld are needed
	zeros int   // reads in a row that returned nothing
	pos   int   // next byte to read, in data
	at    int   // the opcode being decoded, in data

	stack   []Value
	marks   []int // stack lengths at each MARK
	fence   int   // the last mark, or 0: opcodes may not pop below it
	memo    []Value
	sparse  map[uint64]Value // memo entries put out of order, at indices >= len(memo)
	objects int64            // values created so far

	doc        *Doc
	meta       []uint16 // by container: depth, and sharedBit once placed in another
	keys       keyHasher
	credited   int64        // input bytes whose key work has been added to keys.budget
	mat        materializer // Go forms of non-str keys, for hashing
	emptyTuple Value        // the one empty tuple, once made
	recent     [4]uint16    // the shapes the last dicts filled in one go took, latest first
}

// fail wraps a cause with the offset and name of the opcode being decoded.
func (d *decoder) fail(err error) error {
	if d.at >= len(d.data) {
		return &DecodeError{Offset: d.base + int64(len(d.data)), Err: err}
	}
	return &DecodeError{Offset: d.base + int64(d.at), Op: opNames[d.data[d.at]], Err: err}
}

// run decodes opcodes until STOP. The opcodes that make up most of a snapshot (memo reads, MEMOIZE, MARK, small
// ints) are decoded inline when their common case holds, on local copies of the position, stack and memo
// that stay in registers; everything else, including those opcodes' error cases, their growing the stack and
// the input running out, goes to step.
func (d *decoder) run() (Value, error) {
	data := d.data
	pos, stack, memo := d.pos, d.stack, d.memo
	maxStack := d.lim.MaxStack
	for {
		if pos >= len(data) {
			d.at, d.pos = pos, pos
			if err := d.need(1); err != nil {
				d.at = len(d.data)
				return 0, d.fail(fmt.Errorf("no STOP opcode: %w", err))
			}
			pos, data = d.pos, d.data
		}
		op := data[pos]
		switch op {
		case opBinGet:
			if pos+1 < len(data) && int(data[pos+1]) < len(memo) && len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack {
				stack = append(stack, memo[data[pos+1]])
				pos += 2
				continue
			}
		case opLongBinGet:
			if pos+4 < len(data) && len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack {
				if i := binary.LittleEndian.Uint32(data[pos+1:]); uint64(i) < uint64(len(memo)) {
					stack = append(stack, memo[i])
					pos += 5
					continue
				}
			}
		case opMemoize:
			if len(stack) > d.fence && len(d.sparse) == 0 && len(memo) < cap(memo) && len(memo) < d.lim.MaxMemo {
				memo = append(memo, stack[len(stack)-1])
				pos++
				continue
			}
		case opMark:
			if len(d.marks) < cap(d.marks) && len(stack)+len(d.marks) < maxStack {
				d.fence = len(stack)
				d.marks = append(d.marks, d.fence)
				pos++
				continue
			}
		case opBinInt1:
			if pos+1 < len(data) && len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				stack = append(stack, mk(tInt, uint64(data[pos+1])))
				pos += 2
				continue
			}
		case opBinInt2:
			if pos+2 < len(data) && len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				stack = append(stack, mk(tInt, uint64(binary.LittleEndian.Uint16(data[pos+1:]))))
				pos += 3
				continue
			}
		case opBinInt:
			if pos+4 < len(data) && len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				d.objects++
				i := int64(int32(binary.LittleEndian.Uint32(data[pos+1:])))
				stack = append(stack, mk(tInt, uint64(i)&payload))
				pos += 5
				continue
			}
		case opLong1: // snapshot addresses and sizes: up to 7 bytes, always an int that fits a Value
			if pos+1 < len(data) {
				if n := int(data[pos+1]); n > 0 && n < 8 && pos+2+n <= len(data) && len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects && n <= d.lim.MaxInt {
					var u uint64
					for _, c := range data[pos+2 : pos+2+n] {
						u = u>>8 | uint64(c)<<56
					}
					i := int64(u) >> (64 - 8*n) // sign-extends from the top byte read
					d.objects++
					stack = append(stack, mk(tInt, uint64(i)&payload))
					pos += 2 + n
					continue
				}
			}
		case opEmptyDict, opEmptyList:
			if len(stack) < cap(stack) && len(stack)+len(d.marks) < maxStack && d.objects < d.lim.MaxObjects {
				tag := tDict
				if op == opEmptyList {
					tag = tList
				}
				v, err := d.newCont(tag)
				if err != nil {
					d.at = pos
					return 0, d.fail(err)
				}
				d.objects++
				stack = append(stack, v)
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
		pos, stack, memo, data = d.pos, d.stack, d.memo, d.data
	}
}
