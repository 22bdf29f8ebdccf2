package timeline

// liveTable maps a place (device, address) to the block active there: an open-addressing hash table with
// linear probing and backward-shift deletion. Every alloc and free of a snapshot goes through it, so it is
// built for that: one multiply to hash, no tombstones, no allocation but when it grows.
type liveTable struct {
	slots []liveSlot
	shift uint // 64 - log2(len(slots))
	n     int
}

type liveSlot struct {
	addr   uint64
	id     int32 // -1: empty
	device int16
}

const liveTableMin = 1 << 10

func (lt *liveTable) init() {
	lt.slots = make([]liveSlot, liveTableMin)
	for i := range lt.slots {
		lt.slots[i].id = -1
	}
	lt.shift = 64 - 10
	lt.n = 0
}

// home is the slot a place hashes to (Fibonacci hashing: addresses are multiples of 512, and the multiply
// spreads them over the high bits).
func (lt *liveTable) home(device int16, addr uint64) uint64 {
	return ((addr ^ uint64(uint16(device))<<48) * 0x9E3779B97F4A7C15) >> lt.shift
}

func (lt *liveTable) get(device int16, addr uint64) (int32, bool) {
	mask := uint64(len(lt.slots) - 1)
	for i := lt.home(device, addr); ; i = (i + 1) & mask {
		s := &lt.slots[i]
		if s.id < 0 {
			return -1, false
		}
		if s.addr == addr && s.device == device {
			return s.id, true
		}
	}
}

// put adds a place that is not in the table.
func (lt *liveTable) put(device int16, addr uint64, id int32) {
	if 2*(lt.n+1) > len(lt.slots) {
		lt.resize()
	}
	mask := uint64(len(lt.slots) - 1)
	i := lt.home(device, addr)
	for lt.slots[i].id >= 0 {
		i = (i + 1) & mask
	}
	lt.slots[i] = liveSlot{addr: addr, id: id, device: device}
	lt.n++
}

// del removes a place that is in the table, shifting back the entries after it that probed past it.
func (lt *liveTable) del(device int16, addr uint64) {
	mask := uint64(len(lt.slots) - 1)
	i := lt.home(device, addr)
	for {
		s := &lt.slots[i]
		if s.id < 0 {
			return
		}
		if s.addr == addr && s.device == device {
			break
		}
		i = (i + 1) & mask
	}
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		s := lt.slots[j]
		if s.id < 0 {
			break
		}
		// The entry at j may move to i unless its home lies cyclically in (i, j].
		k := lt.home(s.device, s.addr)
		if i <= j && i < k && k <= j || i > j && (i < k || k <= j) {
			continue
		}
		lt.slots[i] = s
		i = j
	}
	lt.slots[i].id = -1
	lt.n--
}

func (lt *liveTable) resize() {
	old := lt.slots
	lt.slots = make([]liveSlot, 2*len(old))
	for i := range lt.slots {
		lt.slots[i].id = -1
	}
	lt.shift--
	lt.n = 0
	for _, s := range old {
		if s.id >= 0 {
			lt.put(s.device, s.addr, s.id)
		}
	}
}

// appendIDs appends the IDs in the table, in no particular order.
func (lt *liveTable) appendIDs(dst []int32) []int32 {
	for _, s := range lt.slots {
		if s.id >= 0 {
			dst = append(dst, s.id)
		}
	}
	return dst
}
