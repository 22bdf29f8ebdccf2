package replay

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// TestSpanSetAgreesWithASortedList holds the replay's ordered set of ranges against the plainest truth: a
// list kept sorted by brute force, over random adds, removes and lookups, in every order of addresses.
func TestSpanSetAgreesWithASortedList(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 7))
	set := newSpanSet(0)
	var ref []span // sorted by address, never overlapping
	refHolding := func(addr uint64) (span, bool) {
		for _, s := range ref {
			if s.addr <= addr && addr < s.end() {
				return s, true
			}
		}
		return span{}, false
	}
	refOverlaps := func(addr, size uint64) bool {
		for _, s := range ref {
			if s.addr < addr+size && addr < s.end() {
				return true
			}
		}
		return false
	}
	const slots = 400 // ranges live on a grid of 400 slots of 4 units, each up to 3 units long
	for i := range 20_000 {
		addr := uint64(rng.IntN(slots)) * 4
		switch op := rng.IntN(3); {
		case op == 0 && !refOverlaps(addr, 3):
			s := span{addr, uint64(1 + rng.IntN(3))}
			set.add(s)
			j, _ := slices.BinarySearchFunc(ref, addr, func(s span, a uint64) int { return int(s.addr) - int(a) })
			ref = slices.Insert(ref, j, s)
		case op == 1:
			j, found := slices.BinarySearchFunc(ref, addr, func(s span, a uint64) int { return int(s.addr) - int(a) })
			if got := set.remove(addr); got != found {
				t.Fatalf("op %d: remove(%d) = %v, want %v", i, addr, got, found)
			}
			if found {
				ref = slices.Delete(ref, j, j+1)
			}
		default:
			probe := addr + uint64(rng.IntN(4))
			gs, gok := set.holding(probe)
			ws, wok := refHolding(probe)
			if gs != ws || gok != wok {
				t.Fatalf("op %d: holding(%d) = %v %v, want %v %v", i, probe, gs, gok, ws, wok)
			}
			size := uint64(1 + rng.IntN(9))
			if got, want := set.overlaps(probe, size), refOverlaps(probe, size); got != want {
				t.Fatalf("op %d: overlaps(%d, %d) = %v, want %v", i, probe, size, got, want)
			}
		}
		if set.Len() != len(ref) {
			t.Fatalf("op %d: %d ranges, want %d", i, set.Len(), len(ref))
		}
	}
	// The top of the address space: a range that starts there can be removed.
	set.add(span{^uint64(0), 1})
	if !set.remove(^uint64(0)) || set.remove(^uint64(0)) {
		t.Error("the range at the top of the address space is not removed exactly once")
	}
}

// TestReplayRebuildsEveryOneOfManySegments replays a final state of 20,000 segments from before the trace,
// half of whose blocks the trace frees: every segment is rebuilt and ends as the snapshot says, which
// PyTorch's own rules decide (a freed 512-byte block merges back into its free 2 MiB segment).
func TestReplayRebuildsEveryOneOfManySegments(t *testing.T) {
	const n = 20_000
	s, err := torch.Import(snapshottest.ManySegments(n))
	if err != nil {
		t.Fatal(err)
	}
	fs, _, err := CheckFidelity(s)
	if err != nil {
		t.Fatal(err)
	}
	if len(fs) != 1 {
		t.Fatalf("%d devices replayed, want 1", len(fs))
	}
	f := fs[0]
	if f.PreExistingSegments != n || f.Rebuilt != n || len(f.NotRebuilt) != 0 {
		t.Errorf("%d segments from before the trace, %d rebuilt, not rebuilt %v: want all %d", f.PreExistingSegments, f.Rebuilt, f.NotRebuilt, n)
	}
	if f.FinalState.Matched != n || f.FinalState.Total != n {
		t.Errorf("final state: %d of %d segments as the snapshot has them, want %d of %d", f.FinalState.Matched, f.FinalState.Total, n, n)
	}
}
