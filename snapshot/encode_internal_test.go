package snapshot

import (
	"encoding/binary"
	"math/rand/v2"
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

// TestAddrIndex: whatever the mix of reused and fresh addresses, the index finds the latest alloc at every
// address the ring still holds, as a map of every alloc ever made says.
func TestAddrIndex(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var x addrIndex
	latest := map[uint64]uint64{} // every address's latest alloc, never pruned
	for ord := range uint64(200000) {
		addr := uint64(rng.IntN(5000)) << 9 // reused: a training loop's blocks
		if rng.IntN(3) == 0 {
			addr = rng.Uint64() // fresh
		}
		x.set(addr, ord)
		latest[addr] = ord
		if ord%997 != 0 {
			continue
		}
		allocs := ord + 1
		for a, want := range latest {
			got, ok := x.find(a)
			if allocs-want <= ringSize && (!ok || got != want) {
				t.Fatalf("after %d allocs: find(%#x) = %d, %v; want %d, %d back", allocs, a, got, ok, want, allocs-want)
			}
			if ok && got != want && allocs-got <= ringSize {
				t.Fatalf("after %d allocs: find(%#x) = %d, an alloc in the ring that is not the latest (%d)", allocs, a, got, want)
			}
		}
		if x.used > addrSlots/2 {
			t.Fatalf("after %d allocs %d slots used", allocs, x.used)
		}
	}
}
