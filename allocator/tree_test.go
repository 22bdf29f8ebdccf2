package allocator

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// TestBlockTreeAgainstSortedSlice runs random inserts and erases through the treap and a sorted slice and
// compares lower_bound, after, before and the in-order walk.
func TestBlockTreeAgainstSortedSlice(t *testing.T) {
	for name, order := range map[string]treeOrder{"size": orderSizeAddress, "segment": orderSizeSegment, "address": orderAddress} {
		t.Run(name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 11))
			tree := newBlockTree(order, 42)
			cmp := tree.cmp
			var ref []*block
			in := map[*block]bool{}
			var all []*block
			for i := range 3000 {
				all = append(all, &block{
					addr:   uint64(i+1) * 4096,
					size:   uint64(1+rng.IntN(8)) * 512,
					stream: []int64{0, 5, -1}[rng.IntN(3)],
					segSeq: uint64(1 + rng.IntN(4)),
				})
			}
			for step := range 20000 {
				b := all[rng.IntN(len(all))]
				if in[b] {
					if !tree.erase(b) {
						t.Fatalf("step %d: erase of a member failed", step)
					}
					i := slices.Index(ref, b)
					ref = slices.Delete(ref, i, i+1)
					delete(in, b)
				} else {
					tree.insert(b)
					i, _ := slices.BinarySearchFunc(ref, b, cmp)
					ref = slices.Insert(ref, i, b)
					in[b] = true
				}
				if tree.Len() != len(ref) {
					t.Fatalf("step %d: Len %d, want %d", step, tree.Len(), len(ref))
				}
				key := &block{stream: []int64{0, 5, -1}[rng.IntN(3)], size: uint64(rng.IntN(10)) * 512, addr: uint64(rng.IntN(3000)) * 4096}
				i, _ := slices.BinarySearchFunc(ref, key, cmp)
				var want *block
				if i < len(ref) {
					want = ref[i]
				}
				if got := tree.lowerBound(key); got != want {
					t.Fatalf("step %d: lowerBound mismatch", step)
				}
				var wantBefore *block
				if i > 0 {
					wantBefore = ref[i-1]
				}
				if got := tree.before(key); got != wantBefore {
					t.Fatalf("step %d: before mismatch", step)
				}
				if len(ref) > 0 {
					j := rng.IntN(len(ref))
					var wantAfter *block
					if j+1 < len(ref) {
						wantAfter = ref[j+1]
					}
					if got := tree.after(ref[j]); got != wantAfter {
						t.Fatalf("step %d: after mismatch", step)
					}
				}
			}
			if got := tree.appendTo(nil); !slices.Equal(got, ref) {
				t.Fatal("in-order walk differs from the sorted slice")
			}
			if tree.erase(&block{addr: 1}) {
				t.Fatal("erase of a non-member succeeded")
			}
		})
	}
}

// TestStreamOrderUnsigned checks streams compare as unsigned pointers, as in PyTorch.
func TestStreamOrderUnsigned(t *testing.T) {
	if streamCmp(-1, 5) <= 0 || streamCmp(0, 5) >= 0 || streamCmp(3, 3) != 0 {
		t.Fatal("streams must compare as uintptr_t")
	}
}
