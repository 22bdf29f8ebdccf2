package snapshot

import "encoding/binary"

// eventEncoder turns events into the three streams of an events chunk: ops (op byte and flags), fields (the
// deltas) and times (time deltas). Time is the one field that never repeats, so it gets a stream of its own
// and does not break zstd's matches in the others.
//
// It keeps the coder's state (docs/format.md §6) in its own form rather than the decoder's model: the
// previous event of each action as the fields that predictions read, stored one by one, and the previous
// event of any action as an index into them. The Writer's caller has just written the event field by field,
// and copying whole Events, twice per event, was a fifth of the encoding time.
type eventEncoder struct {
	last    [NumActions]lastEvent // L[a]; last[ActionInvalid] stays zero
	prev    Action                // P is last[prev]: all zero before the first event
	ring    []blockRef            // R, allocated on the first alloc
	allocs  uint64                // A
	events  uint64
	allocAt addrIndex // address -> ordinal of the latest alloc at it, for modeRing
	ops     []byte
	fields  []byte
	times   []byte
}

// lastEvent is what the encoder keeps of an event: its block fields, which an address mode's reference
// predicts, and the fields predicted from P or L[a].
type lastEvent struct {
	blockRef
	time       int64
	stream     int64
	deviceFree int64
	holder     uint64
	parent     uint64
	iteration  int32
	text       StringID
	device     int16
	phase      Phase
}

func newEventEncoder() *eventEncoder {
	return &eventEncoder{}
}

// candidate is one way to code an event: an address mode, its payload, and the predictions it implies.
type candidate struct {
	mode    int
	payload uint64 // ring distance or zig-zag address delta
	ref     *blockRef
	flags   uint32
	cost    int
}

// encode appends e to the streams. e must be valid (Writer.Write checks).
func (c *eventEncoder) encode(e *Event) {
	a := e.Action
	prev := &c.last[c.prev]
	last := &c.last[a]
	common := commonFlags(e, prev, last)

	// Address modes: try each that applies and keep the cheapest, the first of equals in the order delta,
	// base, prev, ring. modeDelta always applies. The choice and the fields' coding below stay inline: as
	// calls they cost a quarter of the encoding time.
	base := last.addr + uint64(last.blockSize)
	best := candidate{mode: modeDelta, payload: zigzag(int64(e.Addr - base)), ref: &last.blockRef}
	best.flags, best.cost = score(e, modeDelta, best.ref, common, uvarintLen(best.payload))
	if best.payload == 0 {
		// Addr is the base: modeBase predicts the same fields as modeDelta without the payload's byte.
		best.mode, best.cost = modeBase, best.cost-1
	}
	// A mode costs at least its payload, so one that cannot beat the best so far is not scored.
	if best.cost > 0 && c.events > 0 && e.Addr == prev.addr {
		if flags, cost := score(e, modePrev, &prev.blockRef, common, 0); cost < best.cost {
			best = candidate{mode: modePrev, ref: &prev.blockRef, flags: flags, cost: cost}
		}
	}
	if best.cost > 1 && blockAction(a) {
		if ord, ok := c.allocAt.find(e.Addr); ok {
			// d >= 1: ord is an earlier alloc.
			if d := c.allocs - ord; d <= ringSize && uvarintLen(d) < best.cost {
				r := &c.ring[ord&ringMask]
				if flags, cost := score(e, modeRing, r, common, uvarintLen(d)); cost < best.cost {
					best = candidate{mode: modeRing, payload: d, ref: r, flags: flags, cost: cost}
				}
			}
		}
	}

	flags := best.flags | common
	op := byte(a) | byte(best.mode)<<opModeShift
	if flags != 0 {
		op |= opExt
	}
	c.ops = append(c.ops, op)
	if flags != 0 {
		c.ops = binary.AppendUvarint(c.ops, uint64(flags))
	}
	c.times = binary.AppendUvarint(c.times, zigzag(e.Time-prev.time))

	// The fields flags says e codes, each as its delta from its prediction.
	f := c.fields
	if flags&flagContext != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Device)-int64(prev.device)))
		f = binary.AppendUvarint(f, zigzag(int64(uint64(e.Stream)-uint64(prev.stream))))
	}
	if flags&flagPhase != 0 {
		f = append(f, byte(e.Phase))
		f = binary.AppendUvarint(f, zigzag(int64(e.Iteration)-int64(prev.iteration)))
	}
	if best.mode == modeRing || best.mode == modeDelta {
		f = binary.AppendUvarint(f, best.payload)
	}
	r := best.ref
	if flags&flagSize != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(uint64(e.Size)-uint64(r.size))))
	}
	if flags&flagBlockSize != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(uint64(e.BlockSize)-uint64(blockPrediction(a, best.mode, r, e.Size)))))
	}
	if flags&flagCategory != 0 {
		f = append(f, byte(e.Category))
	}
	if flags&flagScope != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Scope)-int64(r.scope)))
	}
	if flags&flagLabel != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Label)-int64(r.label)))
	}
	if flags&flagStack != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Stack)-int64(r.stack)))
	}
	if flags&flagText != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Text)-int64(last.text)))
	}
	if flags&flagDeviceFree != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(uint64(e.DeviceFree)-uint64(last.deviceFree))))
	}
	if flags&flagHolder != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Holder-(last.holder+holderStep(a)))))
	}
	if flags&flagParent != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Parent-last.parent)))
	}
	c.fields = f
	c.push(e, last)
}

// commonFlags returns the flags of the fields predicted the same way whatever the address mode: from the
// previous event (prev) or the previous one of e's action (last).
func commonFlags(e *Event, prev, last *lastEvent) uint32 {
	var common uint32
	if e.Device != prev.device || e.Stream != prev.stream {
		common |= flagContext
	}
	if e.Phase != prev.phase || e.Iteration != prev.iteration {
		common |= flagPhase
	}
	if e.Text != last.text {
		common |= flagText
	}
	if e.DeviceFree != last.deviceFree {
		common |= flagDeviceFree
	}
	if e.Holder != last.holder+holderStep(e.Action) {
		common |= flagHolder
	}
	if e.Parent != last.parent {
		common |= flagParent
	}
	return common
}

// push makes e the previous event, and the previous one of its action (last): field by field, since reading
// e whole right after the caller wrote it field by field stalls the CPU's store forwarding.
func (c *eventEncoder) push(e *Event, last *lastEvent) {
	a := e.Action
	if a == ActionAlloc {
		if c.ring == nil {
			c.ring = make([]blockRef, ringSize)
		}
		setRef(&c.ring[c.allocs&ringMask], e)
		c.allocAt.set(e.Addr, c.allocs)
		c.allocs++
	}
	setRef(&last.blockRef, e)
	last.time, last.stream, last.device = e.Time, e.Stream, e.Device
	last.phase, last.iteration = e.Phase, e.Iteration
	last.text, last.deviceFree, last.holder, last.parent = e.Text, e.DeviceFree, e.Holder, e.Parent
	c.prev = a
	c.events++
}

// setRef sets r to e's block fields.
func setRef(r *blockRef, e *Event) {
	r.addr, r.size, r.blockSize = e.Addr, e.Size, e.BlockSize
	r.scope, r.label, r.stack, r.category = e.Scope, e.Label, e.Stack, e.Category
}

// addrIndex maps a block address to the ordinal of the latest alloc at it. Only allocs the ring still holds
// matter, so it stays small: an open-addressing table with linear probing, rebuilt with only those allocs'
// addresses when it is half full. It replaced a Go map, which cost a tenth of the encoding time.
type addrIndex struct {
	slots []addrSlot // a power of two of them, allocated on the first set
	spare []addrSlot // the table a rebuild fills, kept so that rebuilding makes no garbage
	used  int        // slots that hold an address
}

type addrSlot struct {
	addr uint64
	ord  uint64 // the alloc's ordinal + 1; 0: an empty slot
}

// addrSlots is the table's size: the ring's allocs fill at most a quarter of it, so a rebuild comes at most
// every ringSize allocs and costs a few slot copies per alloc.
const addrSlots = 4 * ringSize

func addrHash(addr uint64) uint64 {
	// Fibonacci hashing: addresses are multiples of 512, and the multiply carries their high bits down.
	return addr * 0x9E3779B97F4A7C15 >> (64 - (ringBits + 2))
}

// find returns the ordinal of the latest alloc at addr. An alloc that has left the ring may or may not be
// found: the caller checks the distance.
func (x *addrIndex) find(addr uint64) (uint64, bool) {
	if x.slots == nil {
		return 0, false
	}
	for i := addrHash(addr); ; i = (i + 1) & (addrSlots - 1) {
		s := &x.slots[i]
		if s.ord == 0 {
			return 0, false
		}
		if s.addr == addr {
			return s.ord - 1, true
		}
	}
}

// set records alloc ord at addr. ord is the newest alloc: after it, allocs before ord+1-ringSize have left
// the ring.
func (x *addrIndex) set(addr, ord uint64) {
	if x.slots == nil {
		x.slots = make([]addrSlot, addrSlots)
	}
	if x.used >= addrSlots/2 {
		x.rebuild(ord)
	}
	for i := addrHash(addr); ; i = (i + 1) & (addrSlots - 1) {
		s := &x.slots[i]
		if s.ord == 0 {
			*s = addrSlot{addr: addr, ord: ord + 1}
			x.used++
			return
		}
		if s.addr == addr {
			s.ord = ord + 1
			return
		}
	}
}

// rebuild empties the table but for the addresses of allocs still in the ring once alloc ord is in it.
func (x *addrIndex) rebuild(ord uint64) {
	old := x.slots
	if x.spare == nil {
		x.spare = make([]addrSlot, addrSlots)
	}
	x.slots, x.spare = x.spare, old
	clear(x.slots)
	x.used = 0
	for _, s := range old {
		if s.ord != 0 && ord-(s.ord-1) < ringSize {
			x.set(s.addr, s.ord-1)
		}
	}
}

// blockAction reports whether a is about an allocated block, for which the alloc ring is worth a lookup.
func blockAction(a Action) bool {
	switch a {
	case ActionAlloc, ActionFreeRequested, ActionFreeCompleted, ActionCategory, ActionRetain:
		return true
	}
	return false
}

// blockPrediction is the predicted BlockSize: the reference's, except for an alloc coded against the previous
// alloc, whose block is predicted from its own Size.
func blockPrediction(a Action, mode int, r *blockRef, size int64) int64 {
	if a == ActionAlloc && (mode == modeBase || mode == modeDelta) {
		return roundBlock(size)
	}
	return r.blockSize
}

// score returns the flags and the cost of coding e with the given mode and reference: the bytes the event
// takes in the ops and fields streams. Only block fields depend on the mode; the others come in as common
// flags.
func score(e *Event, mode int, r *blockRef, common uint32, addrCost int) (uint32, int) {
	flags := uint32(0)
	cost := addrCost
	if e.Size != r.size {
		flags |= flagSize
		cost += uvarintLen(zigzag(int64(uint64(e.Size) - uint64(r.size))))
	}
	if bp := blockPrediction(e.Action, mode, r, e.Size); e.BlockSize != bp {
		flags |= flagBlockSize
		cost += uvarintLen(zigzag(int64(uint64(e.BlockSize) - uint64(bp))))
	}
	if e.Category != r.category {
		flags |= flagCategory
		cost++
	}
	if e.Scope != r.scope {
		flags |= flagScope
		cost += uvarintLen(zigzag(int64(e.Scope) - int64(r.scope)))
	}
	if e.Label != r.label {
		flags |= flagLabel
		cost += uvarintLen(zigzag(int64(e.Label) - int64(r.label)))
	}
	if e.Stack != r.stack {
		flags |= flagStack
		cost += uvarintLen(zigzag(int64(e.Stack) - int64(r.stack)))
	}
	if all := flags | common; all != 0 {
		cost += uvarintLen(uint64(all))
	}
	return flags, cost
}

// reset empties the streams after a chunk was written; the coder's state carries over to the next chunk.
func (c *eventEncoder) reset() {
	c.ops = c.ops[:0]
	c.fields = c.fields[:0]
	c.times = c.times[:0]
}

// size is the bytes buffered in the streams.
func (c *eventEncoder) size() int { return len(c.ops) + len(c.fields) + len(c.times) }
