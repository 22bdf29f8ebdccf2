package snapshot

import (
	"encoding/binary"
	"testing"
)

// TestEncoderMemory: the encoder's address index stays bounded however many distinct addresses it sees, and
// still finds the blocks the ring holds.
func TestEncoderMemory(t *testing.T) {
	c := newEventEncoder()
	for i := range 100000 {
		c.encode(&Event{Action: ActionAlloc, Addr: uint64(i) * 4096, Size: 4096, BlockSize: 4096})
		if len(c.allocAt.slots) != addrSlots || c.allocAt.used > addrSlots/2 {
			t.Fatalf("after %d allocs the address index has %d slots, %d used", i+1, len(c.allocAt.slots), c.allocAt.used)
		}
	}
	for _, back := range []uint64{2, ringSize / 2, ringSize} { // 1 back is the previous event: modePrev
		c.reset()
		c.encode(&Event{Action: ActionFreeRequested, Addr: (100000 - back) * 4096, Size: 4096, BlockSize: 4096})
		if mode := c.ops[0] >> opModeShift & opModeMask; mode != modeRing {
			t.Errorf("a free of the alloc %d back is coded in mode %d, want the ring", back, mode)
		}
	}
}

// TestUvarintLen: the length matches what encoding/binary writes, at every bit length and its edges.
func TestUvarintLen(t *testing.T) {
	for shift := range 64 {
		for _, u := range []uint64{1<<shift - 1, 1 << shift, 1<<shift + 1} {
			if got, want := uvarintLen(u), len(binary.AppendUvarint(nil, u)); got != want {
				t.Errorf("uvarintLen(%#x) = %d, want %d", u, got, want)
			}
		}
	}
	if got := uvarintLen(^uint64(0)); got != binary.MaxVarintLen64 {
		t.Errorf("uvarintLen(max) = %d, want %d", got, binary.MaxVarintLen64)
	}
}
