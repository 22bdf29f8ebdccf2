package snapshot

// decodeEvents appends count events, decoded from the three streams of an events chunk, to dst. The tables
// must already hold the chunk's new entries: nStrings and nStacks are the largest valid IDs. On error dst is
// returned unchanged and the model is no longer usable.
func (m *model) decodeEvents(dst []Event, count int, ops, fields, times []byte, nStrings, nStacks int) ([]Event, error) {
	// Every event takes at least one op byte and one time byte; checking before growing dst means a chunk that
	// declares more events than it holds costs no memory.
	if count > len(ops) || count > len(times) {
		return dst, corruptf("chunk declares %d events but holds at most %d", count, min(len(ops), len(times)))
	}
	n0 := len(dst)
	if cap(dst)-n0 < count {
		// Double: append's growth for large slices (1.25x) would copy a whole snapshot's events many times over.
		grown := make([]Event, n0, max(n0+count, 2*cap(dst)))
		copy(grown, dst)
		dst = grown
	}
	dst = dst[:n0+count]
	oc := cursor{b: ops}
	fc := cursor{b: fields}
	tc := cursor{b: times}
	maxString, maxStack := int64(nStrings), int64(nStacks)
	// The previous event and the previous event of each action are read through pointers into dst, and
	// copied into the model once at the end of the chunk: copying two events per event was a tenth of the
	// decoding time.
	prev := &m.prev
	var lastOf [NumActions]*Event
	for a := range lastOf {
		lastOf[a] = &m.last[a]
	}
	for i := n0; i < n0+count; i++ {
		op := oc.byte()
		a := Action(op & opActionMask)
		if !a.Valid() {
			return dst[:n0], corruptf("event %d: invalid action %d", m.events, uint8(a))
		}
		mode := int(op>>opModeShift) & opModeMask
		var flags uint64
		if op&opExt != 0 {
			flags = oc.uvarint()
			if flags&^flagsKnown != 0 {
				return dst[:n0], corruptf("event %d: unknown field flags %#x", m.events, flags&^flagsKnown)
			}
		}
		last := lastOf[a]
		e := &dst[i]
		*e = Event{
			Seq:       m.events,
			Time:      prev.Time + tc.varint(),
			Action:    a,
			Device:    prev.Device,
			Stream:    prev.Stream,
			Phase:     prev.Phase,
			Iteration: prev.Iteration,
		}
		if flags&flagContext != 0 {
			d := int64(prev.Device) + fc.varint()
			if d != int64(int16(d)) {
				return dst[:n0], corruptf("event %d: device %d out of range", m.events, d)
			}
			e.Device = int16(d)
			e.Stream = int64(uint64(prev.Stream) + uint64(fc.varint()))
		}
		if flags&flagPhase != 0 {
			p := Phase(fc.byte())
			it := int64(prev.Iteration) + fc.varint()
			if !p.Valid() || it != int64(int32(it)) {
				return dst[:n0], corruptf("event %d: invalid phase %d or iteration %d", m.events, p, it)
			}
			e.Phase, e.Iteration = p, int32(it)
		}

		var ref blockRef
		switch mode {
		case modeBase:
			e.Addr = last.Addr + uint64(last.BlockSize)
			ref = refOf(last)
		case modeDelta:
			e.Addr = last.Addr + uint64(last.BlockSize) + uint64(fc.varint())
			ref = refOf(last)
		case modeRing:
			d := fc.uvarint()
			r, ok := m.ringRef(d)
			if !ok {
				return dst[:n0], corruptf("event %d: alloc ring distance %d out of range", m.events, d)
			}
			ref = *r
			e.Addr = r.addr
		case modePrev:
			ref = refOf(prev)
			e.Addr = prev.Addr
		}

		e.Size = ref.size
		if flags&flagSize != 0 {
			e.Size = int64(uint64(ref.size) + uint64(fc.varint()))
		}
		e.BlockSize = ref.blockSize
		if a == ActionAlloc && (mode == modeBase || mode == modeDelta) {
			e.BlockSize = roundBlock(e.Size)
		}
		if flags&flagBlockSize != 0 {
			e.BlockSize = int64(uint64(e.BlockSize) + uint64(fc.varint()))
		}
		e.Category = ref.category
		if flags&flagCategory != 0 {
			e.Category = Category(fc.byte())
			if !e.Category.Valid() {
				return dst[:n0], corruptf("event %d: invalid category %d", m.events, e.Category)
			}
		}
		e.Scope, e.Label, e.Stack = ref.scope, ref.label, ref.stack
		if flags&(flagScope|flagLabel|flagStack|flagText) != 0 {
			if flags&flagScope != 0 {
				v := int64(ref.scope) + fc.varint()
				if v < 0 || v > maxString {
					return dst[:n0], corruptf("event %d: undefined scope string %d", m.events, v)
				}
				e.Scope = StringID(v)
			}
			if flags&flagLabel != 0 {
				v := int64(ref.label) + fc.varint()
				if v < 0 || v > maxString {
					return dst[:n0], corruptf("event %d: undefined label string %d", m.events, v)
				}
				e.Label = StringID(v)
			}
			if flags&flagStack != 0 {
				v := int64(ref.stack) + fc.varint()
				if v < 0 || v > maxStack {
					return dst[:n0], corruptf("event %d: undefined stack %d", m.events, v)
				}
				e.Stack = StackID(v)
			}
		}
		e.Text = last.Text
		if flags&flagText != 0 {
			v := int64(last.Text) + fc.varint()
			if v < 0 || v > maxString {
				return dst[:n0], corruptf("event %d: undefined text string %d", m.events, v)
			}
			e.Text = StringID(v)
		}
		e.DeviceFree = last.DeviceFree
		if flags&flagDeviceFree != 0 {
			e.DeviceFree = int64(uint64(last.DeviceFree) + uint64(fc.varint()))
		}
		e.Holder = last.Holder + holderStep(a)
		if flags&flagHolder != 0 {
			e.Holder += uint64(fc.varint())
		}
		e.Parent = last.Parent
		if flags&flagParent != 0 {
			e.Parent += uint64(fc.varint())
		}
		if oc.bad || fc.bad || tc.bad {
			return dst[:n0], corruptf("event %d: streams end inside the event", m.events)
		}
		if a == ActionAlloc {
			if m.ring == nil {
				m.ring = newRing()
			}
			m.ring[m.allocs&ringMask] = refOf(e)
			m.allocs++
		}
		lastOf[a] = e
		prev = e
		m.events++
	}
	for a, p := range lastOf {
		if p != &m.last[a] {
			m.last[a] = *p
		}
	}
	if prev != &m.prev {
		m.prev = *prev
	}
	if oc.rest() != 0 || fc.rest() != 0 || tc.rest() != 0 {
		return dst[:n0], corruptf("%d, %d and %d bytes left in the ops, fields and times streams after the last event",
			oc.rest(), fc.rest(), tc.rest())
	}
	return dst, nil
}
