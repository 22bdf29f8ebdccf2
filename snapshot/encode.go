package snapshot

import "encoding/binary"

// eventEncoder turns events into the three streams of an events chunk: ops (op byte and flags), fields (the
// deltas) and times (time deltas). Time is the one field that never repeats, so it gets a stream of its own
// and does not break zstd's matches in the others.
type eventEncoder struct {
	model
	allocAt map[uint64]uint64 // address -> ordinal of the latest alloc at it, for modeRing
	ops     []byte
	fields  []byte
	times   []byte
}

func newEventEncoder() *eventEncoder {
	return &eventEncoder{allocAt: make(map[uint64]uint64)}
}

// candidate is one way to code an event: an address mode, its payload, and the predictions it implies.
type candidate struct {
	mode    int
	payload uint64 // ring distance or zig-zag address delta
	ref     blockRef
	flags   uint32
	cost    int
}

// encode appends e to the streams. e must be valid (Writer.Write checks).
func (c *eventEncoder) encode(e *Event) {
	a := e.Action
	m := &c.model
	last := &m.last[a]

	// Fields predicted the same way whatever the mode.
	var common uint32
	if e.Device != m.prev.Device || e.Stream != m.prev.Stream {
		common |= flagContext
	}
	if e.Phase != m.prev.Phase || e.Iteration != m.prev.Iteration {
		common |= flagPhase
	}
	if e.Text != last.Text {
		common |= flagText
	}
	if e.DeviceFree != last.DeviceFree {
		common |= flagDeviceFree
	}
	if e.Holder != last.Holder+holderStep(a) {
		common |= flagHolder
	}
	if e.Parent != last.Parent {
		common |= flagParent
	}

	// Address modes: try each that applies and keep the cheapest. modeDelta always applies.
	base := m.base(a)
	own := refOf(last)
	best := candidate{mode: modeDelta, payload: zigzag(int64(e.Addr - base)), ref: own}
	c.score(e, &best, common, uvarintLen(best.payload))
	if e.Addr == base {
		cand := candidate{mode: modeBase, ref: own}
		if c.score(e, &cand, common, 0); cand.cost <= best.cost {
			best = cand
		}
	}
	if m.events > 0 && e.Addr == m.prev.Addr {
		cand := candidate{mode: modePrev, ref: refOf(&m.prev)}
		if c.score(e, &cand, common, 0); cand.cost < best.cost {
			best = cand
		}
	}
	if blockAction(a) {
		if ord, ok := c.allocAt[e.Addr]; ok {
			if r, ok := m.ringRef(m.allocs - ord); ok {
				d := m.allocs - ord
				cand := candidate{mode: modeRing, payload: d, ref: *r}
				if c.score(e, &cand, common, uvarintLen(d)); cand.cost < best.cost {
					best = cand
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
	c.times = binary.AppendUvarint(c.times, zigzag(e.Time-m.prev.Time))

	f := c.fields
	if flags&flagContext != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Device)-int64(m.prev.Device)))
		f = binary.AppendUvarint(f, zigzag(int64(uint64(e.Stream)-uint64(m.prev.Stream))))
	}
	if flags&flagPhase != 0 {
		f = append(f, byte(e.Phase))
		f = binary.AppendUvarint(f, zigzag(int64(e.Iteration)-int64(m.prev.Iteration)))
	}
	if best.mode == modeRing || best.mode == modeDelta {
		f = binary.AppendUvarint(f, best.payload)
	}
	r := &best.ref
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
		f = binary.AppendUvarint(f, zigzag(int64(e.Text)-int64(last.Text)))
	}
	if flags&flagDeviceFree != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(uint64(e.DeviceFree)-uint64(last.DeviceFree))))
	}
	if flags&flagHolder != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Holder-(last.Holder+holderStep(a)))))
	}
	if flags&flagParent != 0 {
		f = binary.AppendUvarint(f, zigzag(int64(e.Parent-last.Parent)))
	}
	c.fields = f

	if a == ActionAlloc {
		c.allocAt[e.Addr] = m.allocs
		if len(c.allocAt) > 4*ringSize {
			c.prune()
		}
	}
	m.push(e)
}

// prune forgets addresses whose latest alloc has left the ring. At most ringSize entries are in the ring, so
// pruning at 4*ringSize keeps the map bounded at an amortized constant cost per alloc.
func (c *eventEncoder) prune() {
	for addr, ord := range c.allocAt {
		if c.allocs-ord >= ringSize {
			delete(c.allocAt, addr)
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

// score fills cand.flags and cand.cost: the bytes the event takes in the ops and fields streams when coded with
// cand's mode. Only block fields depend on the mode; the others come in as common flags.
func (c *eventEncoder) score(e *Event, cand *candidate, common uint32, addrCost int) {
	r := &cand.ref
	flags := uint32(0)
	cost := addrCost
	if e.Size != r.size {
		flags |= flagSize
		cost += uvarintLen(zigzag(int64(uint64(e.Size) - uint64(r.size))))
	}
	if bp := blockPrediction(e.Action, cand.mode, r, e.Size); e.BlockSize != bp {
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
	cand.flags = flags
	cand.cost = cost
}

// reset empties the streams after a chunk was written; the model carries over to the next chunk.
func (c *eventEncoder) reset() {
	c.ops = c.ops[:0]
	c.fields = c.fields[:0]
	c.times = c.times[:0]
}

// size is the bytes buffered in the streams.
func (c *eventEncoder) size() int { return len(c.ops) + len(c.fields) + len(c.times) }
