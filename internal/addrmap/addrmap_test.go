package addrmap

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestMap runs random puts, gets and deletes against a map, through several resizes and with
// addresses that collide in their low bits, as caching-allocator addresses do.
func TestMap(t *testing.T) {
	var lt Map
	type key struct {
		device int16
		addr   uint64
	}
	want := map[key]int32{}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 200000 {
		k := key{int16(rng.IntN(3)), 0x7f00_0000_0000 + uint64(rng.IntN(5000))*512}
		if i > 100000 {
			k.addr = uint64(rng.IntN(300)) << 40 // far apart, same low bits
		}
		switch id, ok := lt.Get(k.device, k.addr); {
		case ok != (want[k] != 0) || ok && id != want[k]-1:
			t.Fatalf("op %d: get(%v) = %d, %v; want %d", i, k, id, ok, want[k]-1)
		case ok && rng.IntN(3) == 0:
			lt.Set(k.device, k.addr, int32(i))
			want[k] = int32(i) + 1
		case ok && rng.IntN(2) == 0:
			lt.Del(k.device, k.addr)
			delete(want, k)
		case !ok:
			lt.Put(k.device, k.addr, int32(i))
			want[k] = int32(i) + 1
		}
		if lt.Len() != len(want) {
			t.Fatalf("op %d: %d entries, want %d", i, lt.n, len(want))
		}
	}
	if len(lt.slots) <= minSlots {
		t.Errorf("the table never grew (%d slots)", len(lt.slots))
	}
	ids := lt.AppendValues(nil)
	var wantIDs []int32
	for _, id := range want {
		wantIDs = append(wantIDs, id-1)
	}
	slices.Sort(ids)
	slices.Sort(wantIDs)
	if !slices.Equal(ids, wantIDs) {
		t.Errorf("appendIDs returned %d IDs, want %d", len(ids), len(wantIDs))
	}
}
