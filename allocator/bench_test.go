package allocator

import (
	"math/rand/v2"
	"sync"
	"testing"
)

// nopObserver is an Observer that does nothing, to measure the cost of calling one.
type nopObserver struct{}

func (nopObserver) Alloc(int, int64, uint64, uint64, uint64)         {}
func (nopObserver) FreeRequested(int, int64, uint64, uint64, uint64) {}
func (nopObserver) FreeCompleted(int, int64, uint64, uint64, uint64) {}
func (nopObserver) SegmentAlloc(int, int64, uint64, uint64)          {}
func (nopObserver) SegmentFree(int, int64, uint64, uint64)           {}
func (nopObserver) SegmentMap(int, int64, uint64, uint64)            {}
func (nopObserver) SegmentUnmap(int, int64, uint64, uint64)          {}
func (nopObserver) OOM(int, int64, uint64, uint64, uint64)           {}

// warmAllocator returns an allocator on a 24 GiB device holding a few thousand live blocks of mixed sizes
// with as many free ones cached between them, so the pools' trees are as deep as in a training run.
func warmAllocator(b *testing.B, conf string) *Allocator {
	cfg, err := ParseConfig(conf)
	if err != nil {
		b.Fatal(err)
	}
	a := New(NewSimDevice(0, 24*gib, 512*mib), cfg)
	rng := rand.New(rand.NewPCG(1, 2))
	var addrs []uint64
	for range 8000 {
		size := 1 + rng.Uint64N(256*kib)
		if rng.IntN(4) == 0 {
			size = 1 + rng.Uint64N(16*mib)
		}
		addr, err := a.Malloc(size, 0)
		if err != nil {
			b.Fatal(err)
		}
		addrs = append(addrs, addr)
	}
	for i, addr := range addrs {
		if i%2 == 0 {
			if err := a.Free(addr); err != nil {
				b.Fatal(err)
			}
		}
	}
	return a
}

// BenchmarkMallocFree measures a Malloc and its Free served from a warm cache: the training loop's steady
// state, where every size has been seen before.
func BenchmarkMallocFree(b *testing.B) {
	sizes := []uint64{4 * kib, 96 * kib, 700 * kib, 3 * mib, 12 * mib, 48 * mib}
	for _, bc := range []struct {
		name string
		conf string
		obs  Observer
	}{
		{"default", "", nil},
		{"observer", "", nopObserver{}},
		{"expandable", "expandable_segments:True", nil},
		{"max_split", "max_split_size_mb:64", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			a := warmAllocator(b, bc.conf)
			a.SetObserver(bc.obs)
			for _, s := range sizes { // make sure every size is cached
				addr, err := a.Malloc(s, 0)
				if err != nil {
					b.Fatal(err)
				}
				_ = a.Free(addr)
			}
			devAllocs := a.Stats().NumDeviceAlloc
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				addr, err := a.Malloc(sizes[i%len(sizes)], 0)
				if err != nil {
					b.Fatal(err)
				}
				if err := a.Free(addr); err != nil {
					b.Fatal(err)
				}
				i++
			}
			if a.Stats().NumDeviceAlloc != devAllocs {
				b.Fatal("the cache was not warm: new segments were allocated")
			}
		})
	}
}

// TestConcurrentUse hammers one allocator from several goroutines; run with -race.
func TestConcurrentUse(t *testing.T) {
	e := newEnv(t, 8*gib, 0, "max_split_size_mb:64")
	e.a.SetObserver(nopObserver{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			rng := rand.New(rand.NewPCG(uint64(g), 3))
			var held []uint64
			for range 2000 {
				if len(held) > 0 && rng.IntN(2) == 0 {
					j := rng.IntN(len(held))
					if err := e.a.Free(held[j]); err != nil {
						t.Error(err)
						return
					}
					held[j] = held[len(held)-1]
					held = held[:len(held)-1]
					continue
				}
				addr, err := e.a.Malloc(1+rng.Uint64N(8*mib), int64(g))
				if err != nil {
					t.Error(err)
					return
				}
				held = append(held, addr)
				if rng.IntN(50) == 0 {
					_ = e.a.Stats()
					_ = e.a.Segments()
				}
			}
			for _, addr := range held {
				if err := e.a.Free(addr); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	checkInvariants(t, e)
}
