package pickle

import (
	"encoding/binary"
	"fmt"
	"math"
)

// step decodes one opcode other than STOP.
func (d *decoder) step(op byte) error {
	switch op {
	// Memo, by frequency: BINGET and LONG_BINGET are most of a snapshot's opcodes.
	case opBinGet:
		i, err := d.u8()
		if err != nil {
			return err
		}
		return d.get(uint64(i))
	case opLongBinGet:
		i, err := d.u32()
		if err != nil {
			return err
		}
		return d.get(uint64(i))
	case opMemoize:
		return d.put(uint64(d.memoLen()))
	case opBinPut:
		i, err := d.u8()
		if err != nil {
			return err
		}
		return d.put(uint64(i))
	case opLongBinPut:
		i, err := d.u32()
		if err != nil {
			return err
		}
		return d.put(uint64(i))
	case opGet, opPut:
		i, err := d.textIndex()
		if err != nil {
			return err
		}
		if op == opGet {
			return d.get(i)
		}
		return d.put(i)

	// Stack and framing.
	case opMark:
		return d.mark()
	case opPop:
		return d.popOne()
	case opPopMark:
		_, err := d.popMark()
		return err
	case opDup:
		if len(d.stack) <= d.fence {
			return errUnderflow
		}
		return d.push(d.stack[len(d.stack)-1])
	case opProto:
		return d.proto()
	case opFrame:
		return d.frame()

	// Constants and numbers.
	case opNone:
		return d.pushNew(mk(tNone, 0))
	case opNewTrue:
		return d.pushNew(mk(tTrue, 0))
	case opNewFalse:
		return d.pushNew(mk(tFalse, 0))
	case opBinInt1:
		b, err := d.u8()
		if err != nil {
			return err
		}
		return d.pushNew(mk(tInt, uint64(b)))
	case opBinInt2:
		b, err := d.take(2)
		if err != nil {
			return err
		}
		return d.pushNew(mk(tInt, uint64(binary.LittleEndian.Uint16(b))))
	case opBinInt:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		return d.pushNew(mk(tInt, uint64(int64(int32(binary.LittleEndian.Uint32(b))))&payload))
	case opLong1:
		n, err := d.u8()
		if err != nil {
			return err
		}
		return d.long(int64(n))
	case opLong4:
		b, err := d.take(4)
		if err != nil {
			return err
		}
		n := int32(binary.LittleEndian.Uint32(b))
		if n < 0 {
			return malformed("negative byte count %d", n)
		}
		return d.long(int64(n))
	case opBinFloat:
		b, err := d.take(8)
		if err != nil {
			return err
		}
		v, err := d.float(math.Float64frombits(binary.BigEndian.Uint64(b)))
		if err != nil {
			return err
		}
		return d.pushNew(v)
	case opInt, opLong, opFloat:
		return d.textNumber(op)

	// Strings.
	case opShortBinUnicode:
		n, err := d.u8()
		if err != nil {
			return err
		}
		return d.unicode(uint64(n))
	case opBinUnicode:
		n, err := d.u32()
		if err != nil {
			return err
		}
		return d.unicode(uint64(n))
	case opBinUnicode8:
		n, err := d.u64()
		if err != nil {
			return err
		}
		return d.unicode(n)
	case opShortBinBytes, opBinBytes, opBinBytes8, opByteArray8, opShortBinString, opBinString:
		return d.bytesOp(op)

	// Containers.
	case opEmptyDict:
		return d.pushNewCont(tDict)
	case opEmptyList:
		return d.pushNewCont(tList)
	case opEmptyTuple:
		return d.newTuple(nil)
	case opEmptySet:
		return d.pushNewCont(tSet)
	case opSetItems:
		return d.intoBelowMark(tDict, "SETITEMS on", d.fill)
	case opSetItem:
		return d.intoBelowTop(2, tDict, "SETITEM on", d.fill)
	case opAppends:
		return d.intoBelowMark(tList, "APPENDS to", d.extend)
	case opAppend:
		return d.intoBelowTop(1, tList, "APPEND to", d.extend)
	case opAddItems:
		return d.intoBelowMark(tSet, "ADDITEMS to", d.addTo)
	case opDict, opList, opTuple, opFrozenSet:
		return d.fromMark(op)
	case opTuple1, opTuple2, opTuple3:
		return d.smallTuple(int(op-opTuple1) + 1)

	// Refused.
	case opGlobal, opStackGlobal, opReduce, opBuild, opInst, opObj, opNewObj, opNewObjEx,
		opPersID, opBinPersID, opExt1, opExt2, opExt4:
		return errRunsCode
	case opNextBuffer, opReadonlyBuffer:
		return errOutOfBand
	case opString, opUnicode:
		return fmt.Errorf("%w: the protocol 0 text strings", ErrUnsupported)
	}
	return malformed("unknown opcode")
}

// proto checks the protocol a PROTO opcode declares.
func (d *decoder) proto() error {
	p, err := d.u8()
	if err != nil {
		return err
	}
	if p > highestProtocol {
		return fmt.Errorf("%w: protocol %d (this decoder knows 0 to %d)", ErrUnsupported, p, highestProtocol)
	}
	return nil
}

// frame checks a FRAME opcode's frame. Frames only group opcodes for buffered reading, and the decoder
// buffers as it likes, so it only checks the frame is all there, as CPython's C unpickler does by reading
// it whole.
func (d *decoder) frame() error {
	n, err := d.u64()
	if err != nil {
		return err
	}
	if err := d.need(int(min(n, frameAhead))); err != nil {
		return fmt.Errorf("frame of %d bytes: %w", n, err)
	}
	if n > uint64(len(d.data)-d.pos) {
		if d.eof {
			return fmt.Errorf("frame of %d bytes: %w", n, d.short())
		}
		return fmt.Errorf("%w: frame of %d bytes read from a stream (at most %d are checked ahead)", ErrLimit, n, frameAhead)
	}
	return nil
}

// Readers of fixed-size arguments. They never read past the input and report truncation.

func (d *decoder) u8() (byte, error) {
	if d.pos >= len(d.data) {
		return d.u8Slow()
	}
	b := d.data[d.pos]
	d.pos++
	return b, nil
}

// u8Slow is u8 at the end of the window: small enough to inline, u8 leaves reading to it.
func (d *decoder) u8Slow() (byte, error) {
	if err := d.need(1); err != nil {
		return 0, err
	}
	b := d.data[d.pos]
	d.pos++
	return b, nil
}

func (d *decoder) u32() (uint32, error) {
	b, err := d.take(4)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint32(b), nil
}

func (d *decoder) u64() (uint64, error) {
	b, err := d.take(8)
	if err != nil {
		return 0, err
	}
	return binary.LittleEndian.Uint64(b), nil
}

// take returns the next n bytes of input, without copying. They stay valid until the next read.
func (d *decoder) take(n int) ([]byte, error) {
	if n > len(d.data)-d.pos {
		return d.takeSlow(n)
	}
	b := d.data[d.pos : d.pos+n]
	d.pos += n
	return b, nil
}

// takeSlow is take past the end of the window.
func (d *decoder) takeSlow(n int) ([]byte, error) {
	if err := d.need(n); err != nil {
		d.pos = len(d.data)
		return nil, err
	}
	b := d.data[d.pos : d.pos+n]
	d.pos += n
	return b, nil
}

// takeDeclared returns the next n bytes for a length the input declared: it is checked against the limit
// before anything is read, and a stream's window grows only as the bytes arrive.
func (d *decoder) takeDeclared(n uint64, what string) ([]byte, error) {
	if n > uint64(d.lim.MaxString) {
		return nil, overLimit("length of "+what, int64(min(n, 1<<63-1)), "MaxString", d.lim.MaxString)
	}
	if err := d.need(int(n)); err != nil {
		if err == errTruncated {
			return nil, fmt.Errorf("%s of %d bytes with %d left: %w", what, n, len(d.data)-d.pos, err)
		}
		return nil, fmt.Errorf("%s of %d bytes: %w", what, n, err)
	}
	return d.take(int(n))
}

// pushNewCont pushes a new empty container.
func (d *decoder) pushNewCont(tag uint64) error {
	v, err := d.newCont(tag)
	if err != nil {
		return err
	}
	return d.pushNew(v)
}
