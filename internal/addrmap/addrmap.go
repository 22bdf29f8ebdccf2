// Package addrmap maps a place in device memory (device, address) to a small integer: the block alive there, or
// the row that describes it. Every alloc and free of a snapshot goes through such a map, in the reader and in
// the Timeline, so it is built for that job: an open-addressing hash table with linear probing and
// backward-shift deletion, one multiply to hash, no tombstones, no allocation but when it grows.
package addrmap

// Map maps (device, address) to a non-negative int32. The zero Map is empty and ready to use.
type Map struct {
	slots []slot
	shift uint // 64 - log2(len(slots))
	n     int
}

type slot struct {
	addr   uint64
	v      int32 // -1: empty
	device int16
}

const minSlots = 1 << 10

func (m *Map) init() {
	m.slots = make([]slot, minSlots)
	for i := range m.slots {
		m.slots[i].v = -1
	}
	m.shift = 64 - 10
	m.n = 0
}

// home is the slot a place hashes to (Fibonacci hashing: addresses are multiples of 512, and the multiply
// spreads them over the high bits).
func (m *Map) home(device int16, addr uint64) uint64 {
	return ((addr ^ uint64(uint16(device))<<48) * 0x9E3779B97F4A7C15) >> m.shift
}

// Len returns the number of places in the map.
func (m *Map) Len() int { return m.n }

// Get returns the value at a place, and whether there is one.
func (m *Map) Get(device int16, addr uint64) (int32, bool) {
	if m.slots == nil {
		return -1, false
	}
	mask := uint64(len(m.slots) - 1)
	for i := m.home(device, addr); ; i = (i + 1) & mask {
		s := &m.slots[i]
		if s.v < 0 {
			return -1, false
		}
		if s.addr == addr && s.device == device {
			return s.v, true
		}
	}
}

// Put adds a place that is not in the map, with value v >= 0.
func (m *Map) Put(device int16, addr uint64, v int32) {
	if m.slots == nil {
		m.init()
	}
	if 2*(m.n+1) > len(m.slots) {
		m.resize()
	}
	mask := uint64(len(m.slots) - 1)
	i := m.home(device, addr)
	for m.slots[i].v >= 0 {
		i = (i + 1) & mask
	}
	m.slots[i] = slot{addr: addr, v: v, device: device}
	m.n++
}

// Set sets the value at a place, adding the place if it is not in the map.
func (m *Map) Set(device int16, addr uint64, v int32) {
	if m.slots != nil {
		mask := uint64(len(m.slots) - 1)
		for i := m.home(device, addr); m.slots[i].v >= 0; i = (i + 1) & mask {
			if s := &m.slots[i]; s.addr == addr && s.device == device {
				s.v = v
				return
			}
		}
	}
	m.Put(device, addr, v)
}

// Del removes a place, if it is in the map, shifting back the entries after it that probed past it.
func (m *Map) Del(device int16, addr uint64) {
	if m.slots == nil {
		return
	}
	mask := uint64(len(m.slots) - 1)
	i := m.home(device, addr)
	for {
		s := &m.slots[i]
		if s.v < 0 {
			return
		}
		if s.addr == addr && s.device == device {
			break
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := m.slots[j]
		if s.v < 0 {
			break
		}
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		k := m.home(s.device, s.addr)
		if i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		m.slots[i] = s
		i = j
	}
	m.slots[i].v = -1
	m.n--
}

func (m *Map) resize() {
	old := m.slots
	m.slots = make([]slot, 2*len(old))
	for i := range m.slots {
		m.slots[i].v = -1
	}
	m.shift--
	m.n = 0
	for _, s := range old {
		if s.v >= 0 {
			m.Put(s.device, s.addr, s.v)
		}
	}
}

// AppendValues appends the values in the map to dst, in no particular order.
func (m *Map) AppendValues(dst []int32) []int32 {
	for _, s := range m.slots {
		if s.v >= 0 {
			dst = append(dst, s.v)
		}
	}
	return dst
}

// Clone returns a copy of the map that shares nothing with it.
func (m *Map) Clone() Map {
	c := *m
	if m.slots != nil {
		c.slots = append([]slot(nil), m.slots...)
	}
	return c
}
