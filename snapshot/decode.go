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
	dst = growEvents(dst, count)
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
	// An event's op, address and block fields are read inline, where a call per event would cost; the
	// fields that change seldom (context, IDs, a dump's) are read by calls when its flags say so.
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
		if flags&(flagContext|flagPhase) != 0 {
			if err := m.decodeContext(e, prev, flags, &fc); err != nil {
				return dst[:n0], err
			}
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
		e.Scope, e.Label, e.Stack, e.Text = ref.scope, ref.label, ref.stack, last.Text
		if flags&(flagScope|flagLabel|flagStack|flagText) != 0 {
			if err := m.decodeIDs(e, &ref, last, flags, &fc, maxString, maxStack); err != nil {
				return dst[:n0], err
			}
		}
		e.DeviceFree, e.Holder, e.Parent = last.DeviceFree, last.Holder+holderStep(a), last.Parent
		if flags&(flagDeviceFree|flagHolder|flagParent) != 0 {
			decodeDumpFields(e, flags, &fc)
		}
		if oc.bad || fc.bad || tc.bad {
			return dst[:n0], corruptf("event %d: streams end inside the event", m.events)
		}
		if a == ActionAlloc {
			m.pushAlloc(e)
		}
		lastOf[a] = e
		prev = e
		m.events++
	}
	m.keep(prev, &lastOf)
	if oc.rest() != 0 || fc.rest() != 0 || tc.rest() != 0 {
		return dst[:n0], corruptf("%d, %d and %d bytes left in the ops, fields and times streams after the last event",
			oc.rest(), fc.rest(), tc.rest())
	}
	return dst, nil
}

// growEvents returns dst with room for count more events, its length grown by count.
func growEvents(dst []Event, count int) []Event {
	n0 := len(dst)
	if cap(dst)-n0 < count {
		// Double: append's growth for large slices (1.25x) would copy a whole snapshot's events many times over.
		grown := make([]Event, n0, max(n0+count, 2*cap(dst)))
		copy(grown, dst)
		dst = grown
	}
	return dst[:n0+count]
}

// decodeContext reads the device and stream, and the phase and iteration, of event e where flags says they
// differ from the previous event's (prev).
func (m *model) decodeContext(e, prev *Event, flags uint64, fc *cursor) error {
	if flags&flagContext != 0 {
		d := int64(prev.Device) + fc.varint()
		if d != int64(int16(d)) {
			return corruptf("event %d: device %d out of range", m.events, d)
		}
		e.Device = int16(d)
		e.Stream = int64(uint64(prev.Stream) + uint64(fc.varint()))
	}
	if flags&flagPhase != 0 {
		p := Phase(fc.byte())
		it := int64(prev.Iteration) + fc.varint()
		if !p.Valid() || m.lastPhase != PhaseNone && p > m.lastPhase || it != int64(int32(it)) {
			return corruptf("event %d: invalid phase %d or iteration %d", m.events, p, it)
		}
		e.Phase, e.Iteration = p, int32(it)
	}
	return nil
}

// decodeIDs reads the string and stack IDs of event e that flags says differ from their predictions: the
// reference's scope, label and stack, and the text of the previous event of its action (last). An ID must
// be defined: at most maxString or maxStack.
func (m *model) decodeIDs(e *Event, ref *blockRef, last *Event, flags uint64, fc *cursor, maxString, maxStack int64) error {
	if flags&flagScope != 0 {
		v := int64(ref.scope) + fc.varint()
		if v < 0 || v > maxString {
			return corruptf("event %d: undefined scope string %d", m.events, v)
		}
		e.Scope = StringID(v)
	}
	if flags&flagLabel != 0 {
		v := int64(ref.label) + fc.varint()
		if v < 0 || v > maxString {
			return corruptf("event %d: undefined label string %d", m.events, v)
		}
		e.Label = StringID(v)
	}
	if flags&flagStack != 0 {
		v := int64(ref.stack) + fc.varint()
		if v < 0 || v > maxStack {
			return corruptf("event %d: undefined stack %d", m.events, v)
		}
		e.Stack = StackID(v)
	}
	if flags&flagText != 0 {
		v := int64(last.Text) + fc.varint()
		if v < 0 || v > maxString {
			return corruptf("event %d: undefined text string %d", m.events, v)
		}
		e.Text = StringID(v)
	}
	return nil
}

// decodeDumpFields adds to event e's predicted device_free (of an OOM), holder and parent (of a heap dump's
// edges) the deltas flags says it codes.
func decodeDumpFields(e *Event, flags uint64, fc *cursor) {
	if flags&flagDeviceFree != 0 {
		e.DeviceFree = int64(uint64(e.DeviceFree) + uint64(fc.varint()))
	}
	if flags&flagHolder != 0 {
		e.Holder += uint64(fc.varint())
	}
	if flags&flagParent != 0 {
		e.Parent += uint64(fc.varint())
	}
}

// pushAlloc adds alloc e to the ring, which modeRing refers to.
func (m *model) pushAlloc(e *Event) {
	if m.ring == nil {
		m.ring = newRing()
	}
	m.ring[m.allocs&ringMask] = refOf(e)
	m.allocs++
}

// keep copies the previous event (prev) and the previous event of each action (lastOf), read through
// pointers into the events as a chunk is decoded, into the model for the next chunk.
func (m *model) keep(prev *Event, lastOf *[NumActions]*Event) {
	for a, p := range lastOf {
		if p != &m.last[a] {
			m.last[a] = *p
		}
	}
	if prev != &m.prev {
		m.prev = *prev
	}
}
