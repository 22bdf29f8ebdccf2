package pickle

import "math"

// Limits bound the memory and work one decode may use. A zero field takes its default (see DefaultLimits), so
// Limits{MaxInput: 64 << 20} tightens one bound and keeps the rest.
//
// The defaults admit snapshots of several GiB. A snapshot decodes into a Doc of about twice its file size, up
// to 5 times for a small one, whose Doc is sized for the file at the start (Doc.Footprint of the real
// snapshots and an 87 MB one); no input makes DecodeDoc allocate more than about 96 bytes per
// input byte, or Decode, which also builds Go values, more than about 256. So MaxMemory, or MaxInput and
// MaxObjects, are the limits to set for input from a network or a fuzzer.
//
// Every other quantity is bounded by the input size: each opcode creates at most one value and pushes at most
// one stack slot, and strings are copied from the input, never expanded. The one exception, hashing dict keys
// and set elements that are not short strings (a memoized tuple of tuples can spell out an exponential key),
// may do at most 16 bytes of work per input byte decoded so far, plus 1 MiB, before failing with ErrLimit.
type Limits struct {
	MaxInput   int64 // bytes of input a decode may need, up to STOP (a stream is not read further); default 8 GiB
	MaxString  int64 // bytes in one str, bytes or bytearray; default 1 GiB
	MaxInt     int   // bytes of one LONG1/LONG4, digits of one text INT/LONG/FLOAT; default 4096
	MaxMemo    int   // memo entries; default 1<<28
	MaxStack   int   // values and marks on the unpickling stack at once; default 1<<27
	MaxItems   int   // items in one list, tuple, set or dict; default 1<<28, at most 2^31-1
	MaxDepth   int   // nesting of lists, dicts, tuples and sets; default 1000, at most 32767
	MaxObjects int64 // values created by the whole decode (BINGET and DUP create none); default 1<<28, at most 2^32-1
	// MaxMemory is the most bytes a decode may hold at once: its read buffer, the Doc it builds (and, for
	// Decode, the Go values), the stack and the memo, counted before each is allocated, with both the old
	// and the new buffer while one is copied into a larger one. Past it a decode fails with ErrMemory.
	// The default, 0, sets no ceiling beyond what the other limits imply.
	MaxMemory int64
}

// DefaultLimits returns the limits a zero Limits field stands for.
func DefaultLimits() Limits {
	return Limits{
		MaxInput:   8 << 30,
		MaxString:  1 << 30,
		MaxInt:     4096, // Python itself refuses to parse ints of more than 4300 digits
		MaxMemo:    1 << 28,
		MaxStack:   1 << 27,
		MaxItems:   1 << 28,
		MaxDepth:   1000, // about Python's recursion limit: pickle.dump cannot write deeper data
		MaxObjects: 1 << 28,
	}
}

// withDefaults fills the zero (or negative) fields of l from DefaultLimits and clamps the rest to what the
// decoder's representation holds.
func (l Limits) withDefaults() Limits {
	d := DefaultLimits()
	if l.MaxInput <= 0 {
		l.MaxInput = d.MaxInput
	}
	if l.MaxString <= 0 {
		l.MaxString = d.MaxString
	}
	if l.MaxInt <= 0 {
		l.MaxInt = d.MaxInt
	}
	if l.MaxMemo <= 0 {
		l.MaxMemo = d.MaxMemo
	}
	if l.MaxStack <= 0 {
		l.MaxStack = d.MaxStack
	}
	if l.MaxItems <= 0 {
		l.MaxItems = d.MaxItems
	}
	if l.MaxDepth <= 0 {
		l.MaxDepth = d.MaxDepth
	}
	if l.MaxObjects <= 0 {
		l.MaxObjects = d.MaxObjects
	}
	l.MaxItems = min(l.MaxItems, math.MaxInt32)      // dict positions are int32
	l.MaxDepth = min(l.MaxDepth, depthMask)          // depths take 15 bits; key hashing recurses once per level
	l.MaxObjects = min(l.MaxObjects, math.MaxUint32) // dicts and lists are numbered with uint32 IDs
	return l
}
