package export

import (
	"encoding/binary"
	"io"
	"math"
	"strings"
	"unicode/utf8"
)

// The pickle opcodes this writer uses: plain data only, the set PyTorch's own snapshots hold and memory_viz's
// JavaScript unpickler reads. Nothing here names a class or calls one (no GLOBAL, REDUCE, BUILD), so any
// unpickler loads the file as data.
const (
	opProto           = 0x80 // protocol version
	opFrame           = 0x95 // protocol 4 framing: the next frame's length
	opStop            = '.'
	opMark            = '('
	opEmptyDict       = '}'
	opEmptyList       = ']'
	opSetItems        = 'u'
	opAppends         = 'e'
	opMemoize         = 0x94
	opBinGet          = 'h'
	opLongBinGet      = 'j'
	opBinInt          = 'J'
	opBinInt1         = 'K'
	opBinInt2         = 'M'
	opLong1           = 0x8a
	opBinFloat        = 'G'
	opShortBinUnicode = 0x8c
	opBinUnicode      = 'X'
	opNewTrue         = 0x88
	opNewFalse        = 0x89
	opNone            = 'N'
	opTuple2          = 0x86
)

const (
	pickleProtocol = 4
	// frameTarget is the frame size CPython's pickler aims for (_FRAME_SIZE_TARGET).
	frameTarget = 64 << 10
	// batchSize is how many items go between a MARK and its SETITEMS or APPENDS, as in CPython (_BATCHSIZE).
	batchSize = 1000
)

// refKind names a family of shared values: values of one kind are memoized by an ID of that kind.
type refKind uint8

const (
	refFrame refKind = iota // a frame dict, by snapshot.FrameID
	refStack                // a list of frame dicts, by snapshot.StackID
	numRefKinds
)

// docEncoder writes a tree of Python values in document order. Values inside a dict follow the key() that
// names them; a list's items follow beginList. The torch document builder drives it; pickleEncoder and
// jsonEncoder write the two forms of the same document.
type docEncoder interface {
	beginDict()
	key(k string)
	endDict()
	beginList()
	endList()
	str(s string)
	int(v int64)
	uint(v uint64)
	float(f float64)
	bool(b bool)
	none()
	intPair(a, b int64) // a tuple of two ints: segment_pool_id
	// shared begins the value (kind, id). It returns true when that value was written before and a
	// reference to it has been written instead: the caller then writes nothing more. Otherwise the caller
	// writes the value, which must start with beginList or beginDict.
	shared(kind refKind, id uint32) bool
	// close finishes the document and reports the first error of the underlying writer.
	close() error
}

// container is an open dict or list of a pickleEncoder.
type container struct {
	dict   bool
	marked bool // a MARK is open for the current batch
	n      int  // items in the current batch
}

// pickleEncoder writes a protocol 4 pickle, in frames of about 64 KiB as CPython does. Strings and the values
// marked shared are memoized, so a traceback shared by thousands of trace entries is written once and
// referenced with a 2 or 5 byte BINGET after: this is what keeps PyTorch's own snapshot pickles small.
type pickleEncoder struct {
	w     io.Writer
	frame []byte // the current frame's opcodes
	err   error

	stack   []container
	memoLen uint32
	strs    map[string]uint32
	refs    [numRefKinds]map[uint32]uint32
	// pending says a shared value's container is about to begin, to be memoized under pendKey.
	pending bool
	pendKey struct {
		kind refKind
		id   uint32
	}
}

func newPickleEncoder(w io.Writer) *pickleEncoder {
	e := &pickleEncoder{w: w, frame: make([]byte, 0, frameTarget+4096), strs: make(map[string]uint32)}
	for i := range e.refs {
		e.refs[i] = make(map[uint32]uint32)
	}
	// PROTO stands before the first frame, as CPython writes it.
	_, e.err = w.Write([]byte{opProto, pickleProtocol})
	return e
}

// flush writes the current frame when it has reached the target size, or always when final is set. It is
// called only between opcodes, so no opcode straddles two frames.
func (e *pickleEncoder) flush(final bool) {
	if len(e.frame) < frameTarget && !final || len(e.frame) == 0 || e.err != nil {
		return
	}
	if len(e.frame) >= 4 { // CPython leaves tiny frames unframed (_FRAME_SIZE_MIN)
		var hdr [9]byte
		hdr[0] = opFrame
		binary.LittleEndian.PutUint64(hdr[1:], uint64(len(e.frame)))
		if _, e.err = e.w.Write(hdr[:]); e.err != nil {
			return
		}
	}
	_, e.err = e.w.Write(e.frame)
	e.frame = e.frame[:0]
}

// item is called before every value: it counts list items and closes a full batch.
func (e *pickleEncoder) item() {
	e.flush(false)
	if n := len(e.stack); n > 0 && !e.stack[n-1].dict {
		e.count(&e.stack[n-1], opAppends)
	}
}

// count opens the MARK of a batch, or closes a full batch and opens the next.
func (e *pickleEncoder) count(c *container, closer byte) {
	switch {
	case !c.marked:
		e.frame = append(e.frame, opMark)
		c.marked = true
	case c.n == batchSize:
		e.frame = append(e.frame, closer, opMark)
		c.n = 0
	}
	c.n++
}

func (e *pickleEncoder) memoize() uint32 {
	e.frame = append(e.frame, opMemoize)
	e.memoLen++
	return e.memoLen - 1
}

func (e *pickleEncoder) get(idx uint32) {
	if idx < 256 {
		e.frame = append(e.frame, opBinGet, byte(idx))
		return
	}
	e.frame = append(e.frame, opLongBinGet)
	e.frame = binary.LittleEndian.AppendUint32(e.frame, idx)
}

func (e *pickleEncoder) begin(op byte, dict bool) {
	e.item()
	e.frame = append(e.frame, op)
	if e.pending {
		e.refs[e.pendKey.kind][e.pendKey.id] = e.memoize()
		e.pending = false
	}
	e.stack = append(e.stack, container{dict: dict})
}

func (e *pickleEncoder) end(closer byte) {
	c := e.stack[len(e.stack)-1]
	e.stack = e.stack[:len(e.stack)-1]
	if c.marked {
		e.frame = append(e.frame, closer)
	}
}

func (e *pickleEncoder) beginDict() { e.begin(opEmptyDict, true) }
func (e *pickleEncoder) endDict()   { e.end(opSetItems) }
func (e *pickleEncoder) beginList() { e.begin(opEmptyList, false) }
func (e *pickleEncoder) endList()   { e.end(opAppends) }

func (e *pickleEncoder) key(k string) {
	e.flush(false)
	e.count(&e.stack[len(e.stack)-1], opSetItems)
	e.text(k)
}

func (e *pickleEncoder) str(s string) {
	e.item()
	e.text(s)
}

// text writes a string, or a reference to the same string written before. Python strings are Unicode: bytes
// that are not UTF-8 become U+FFFD, or the file would not load.
func (e *pickleEncoder) text(s string) {
	if idx, ok := e.strs[s]; ok {
		e.get(idx)
		return
	}
	key := s
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	switch {
	case len(s) < 256:
		e.frame = append(e.frame, opShortBinUnicode, byte(len(s)))
		e.frame = append(e.frame, s...)
	case len(s) < frameTarget:
		e.frame = append(e.frame, opBinUnicode)
		e.frame = binary.LittleEndian.AppendUint32(e.frame, uint32(len(s)))
		e.frame = append(e.frame, s...)
	default:
		// A string of a frame or more goes between frames, as CPython writes it: no copy into the frame.
		e.flush(true)
		var hdr [5]byte
		hdr[0] = opBinUnicode
		binary.LittleEndian.PutUint32(hdr[1:], uint32(min(uint64(len(s)), math.MaxUint32)))
		if e.err == nil {
			_, e.err = e.w.Write(hdr[:])
		}
		if e.err == nil {
			_, e.err = io.WriteString(e.w, s[:min(uint64(len(s)), math.MaxUint32)])
		}
	}
	e.strs[key] = e.memoize()
}

func (e *pickleEncoder) int(v int64) {
	e.item()
	e.frame = appendPickleInt(e.frame, v)
}

func (e *pickleEncoder) uint(v uint64) {
	e.item()
	if v <= math.MaxInt64 {
		e.frame = appendPickleInt(e.frame, int64(v))
		return
	}
	// Beyond int64: eight little-endian bytes and a zero byte that keeps the sign positive.
	e.frame = append(e.frame, opLong1, 9)
	e.frame = binary.LittleEndian.AppendUint64(e.frame, v)
	e.frame = append(e.frame, 0)
}

// appendPickleInt writes v with the smallest opcode CPython would choose: BININT1, BININT2, BININT (signed
// 32-bit), else LONG1 with the minimal little-endian two's complement (6 bytes for a 47-bit address).
func appendPickleInt(b []byte, v int64) []byte {
	switch {
	case v >= 0 && v <= math.MaxUint8:
		return append(b, opBinInt1, byte(v))
	case v >= 0 && v <= math.MaxUint16:
		return append(b, opBinInt2, byte(v), byte(v>>8))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		b = append(b, opBinInt)
		return binary.LittleEndian.AppendUint32(b, uint32(int32(v)))
	}
	var le [8]byte
	binary.LittleEndian.PutUint64(le[:], uint64(v))
	n := 8
	// Drop the high bytes that only repeat the sign, as Python's encode_long does.
	for n > 1 && (le[n-1] == 0 && le[n-2]&0x80 == 0 || le[n-1] == 0xff && le[n-2]&0x80 != 0) {
		n--
	}
	b = append(b, opLong1, byte(n))
	return append(b, le[:n]...)
}

func (e *pickleEncoder) float(f float64) {
	e.item()
	e.frame = append(e.frame, opBinFloat)
	e.frame = binary.BigEndian.AppendUint64(e.frame, math.Float64bits(f))
}

func (e *pickleEncoder) bool(b bool) {
	e.item()
	if b {
		e.frame = append(e.frame, opNewTrue)
	} else {
		e.frame = append(e.frame, opNewFalse)
	}
}

func (e *pickleEncoder) none() {
	e.item()
	e.frame = append(e.frame, opNone)
}

func (e *pickleEncoder) intPair(a, b int64) {
	e.item()
	e.frame = appendPickleInt(e.frame, a)
	e.frame = appendPickleInt(e.frame, b)
	e.frame = append(e.frame, opTuple2)
}

func (e *pickleEncoder) shared(kind refKind, id uint32) bool {
	if idx, ok := e.refs[kind][id]; ok {
		e.item()
		e.get(idx)
		return true
	}
	e.pending = true
	e.pendKey.kind, e.pendKey.id = kind, id
	return false
}

func (e *pickleEncoder) close() error {
	e.frame = append(e.frame, opStop)
	e.flush(true)
	return e.err
}
