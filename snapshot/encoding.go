package snapshot

import (
	"math/bits"
	"sync"
)

// The event encoding (docs/format.md §6). Encoder and decoder run the same model: each field of an event is
// predicted from events already coded, and only the fields that differ from their prediction are stored, as
// zig-zag varint deltas. Predictions are chosen to be exact for what a training loop does most: a free or a
// category change refers to a block allocated earlier (its size and tags come from that alloc), a block is
// reused at an address allocated one iteration ago, consecutive events share device, stream, phase and
// iteration.

// The op byte that starts every event in the ops stream.
const (
	opActionMask = 0x1f // bits 0-4: the Action
	opModeShift  = 5    // bits 5-6: the address mode
	opModeMask   = 0x3
	opExt        = 0x80 // bit 7: a flags uvarint follows
)

// Address modes: where Addr, and the block's size and tags, are predicted from.
const (
	modeBase  = 0 // Addr is the action's base address; no payload
	modeRing  = 1 // the block of an earlier alloc: a uvarint distance back in the alloc ring follows
	modePrev  = 2 // the block of the previous event; no payload
	modeDelta = 3 // Addr is the base address plus a zig-zag delta that follows
)

// Field flags: a set bit means the field differs from its prediction and its delta follows in the fields
// stream. The order of the bits is by frequency, so that most events need one flags byte at most.
const (
	flagSize       = 1 << iota // Size
	flagLabel                  // Label
	flagStack                  // Stack
	flagScope                  // Scope
	flagCategory               // Category (a byte, not a delta)
	flagText                   // Text
	flagBlockSize              // BlockSize
	flagPhase                  // Phase (a byte) and Iteration (a delta)
	flagContext                // Device and Stream
	flagDeviceFree             // DeviceFree
	flagHolder                 // Holder
	flagParent                 // Parent
	flagsKnown     = 1<<iota - 1
)

// The alloc ring: the last ringSize allocs, which modeRing refers to. A fixed size keeps a reader's memory
// bounded; 8192 allocs cover the activations of a forward pass that backward frees.
const (
	ringBits = 13
	ringSize = 1 << ringBits
	ringMask = ringSize - 1
)

// blockRef is what an alloc leaves in the ring, and what a reference predicts.
type blockRef struct {
	addr      uint64
	size      int64
	blockSize int64
	scope     StringID
	label     StringID
	stack     StackID
	category  Category
}

func refOf(e *Event) blockRef {
	return blockRef{addr: e.Addr, size: e.Size, blockSize: e.BlockSize, scope: e.Scope, label: e.Label,
		stack: e.Stack, category: e.Category}
}

// model is the decoder's state. It depends only on events already decoded. The encoder keeps the same state
// in a form of its own (eventEncoder).
type model struct {
	prev   Event             // the previous event, of any action
	last   [NumActions]Event // the previous event of each action
	ring   []blockRef        // allocated on the first alloc
	allocs uint64            // allocs so far: the ring's write position
	events uint64            // events so far: the next Seq
	// lastPhase is the last phase the file's version defines (the zero value is read as the newest's).
	lastPhase Phase
}

// ringRef returns the alloc d allocs back (1 is the latest), or false if the ring does not hold it.
func (m *model) ringRef(d uint64) (*blockRef, bool) {
	if d == 0 || d > m.allocs || d > ringSize {
		return nil, false
	}
	return &m.ring[(m.allocs-d)&ringMask], true
}

// rings reuses alloc rings across Readers, like decoders.
var rings sync.Pool

// newRing returns an alloc ring. Its contents do not matter: an entry is read only after it was written.
func newRing() []blockRef {
	if r, ok := rings.Get().(*[]blockRef); ok && len(*r) == ringSize {
		return *r
	}
	return make([]blockRef, ringSize)
}

// release gives the ring back for reuse; the model must not be used after.
func (m *model) release() {
	if m.ring != nil {
		r := m.ring
		rings.Put(&r)
		m.ring = nil
	}
}

// holderStep is the predicted increment of Holder: retain events of a heap dump number their holders 1, 2, 3...
func holderStep(a Action) uint64 {
	if a == ActionRetain {
		return 1
	}
	return 0
}

// roundBlock predicts an alloc's BlockSize from its requested Size: the caching allocator rounds requests up
// to a multiple of 512 bytes, at least 512 (docs/allocator.md §3). The prediction is part of the file format
// (docs/format.md §6), fixed for every file ever written, so it is not torchrules' rule, which may grow.
// Computed in wrapping uint64 arithmetic so that any Size, even a nonsensical one, has a defined prediction.
func roundBlock(size int64) int64 {
	u := uint64(size)
	if u < 512 {
		return 512
	}
	return int64((u + 511) &^ 511)
}

// zigzag maps signed deltas to unsigned so that small magnitudes of either sign encode in few bytes.
func zigzag(v int64) uint64 { return uint64(v<<1) ^ uint64(v>>63) }

func unzigzag(u uint64) int64 { return int64(u>>1) ^ -int64(u&1) }

// uvarintLen is the length of u as a uvarint: a byte per 7 significant bits, at least one. 9/64 stands for
// 1/7 exactly over 1 to 64 bits, and takes no branch.
func uvarintLen(u uint64) int {
	return (9*bits.Len64(u|1) + 64) / 64
}

// cursor reads varints from one stream of a chunk. Reads past the end or malformed varints set bad instead
// of returning errors, so the hot loop checks once per event.
type cursor struct {
	b   []byte
	i   int
	bad bool
}

func (c *cursor) byte() byte {
	if c.i < len(c.b) {
		v := c.b[c.i]
		c.i++
		return v
	}
	c.bad = true
	return 0
}

func (c *cursor) uvarint() uint64 {
	// Fast paths for one and two bytes: most deltas and IDs, and time gaps under 8 µs.
	if i := c.i; i+1 < len(c.b) {
		b0, b1 := c.b[i], c.b[i+1]
		if b0 < 0x80 {
			c.i = i + 1
			return uint64(b0)
		}
		if b1 < 0x80 {
			c.i = i + 2
			return uint64(b0&0x7f) | uint64(b1)<<7
		}
	}
	return c.uvarintSlow()
}

// uvarintSlow reads a varint in the general case. It is kept out of line to keep uvarint small.
//
//go:noinline
func (c *cursor) uvarintSlow() uint64 {
	var v uint64
	for shift := uint(0); shift < 64; shift += 7 {
		if c.i >= len(c.b) {
			c.bad = true
			return 0
		}
		b := c.b[c.i]
		c.i++
		if shift == 63 && b > 1 {
			c.bad = true // overflows 64 bits
			return 0
		}
		v |= uint64(b&0x7f) << shift
		if b < 0x80 {
			return v
		}
	}
	c.bad = true
	return 0
}

func (c *cursor) varint() int64 { return unzigzag(c.uvarint()) }

// rest reports how many bytes are left.
func (c *cursor) rest() int { return len(c.b) - c.i }
