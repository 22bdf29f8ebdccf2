package allocator

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// checkInvariants verifies the allocator's structure against its stats and the device, independently of
// how the allocator got there.
func checkInvariants(t *testing.T, e *env) {
	t.Helper()
	if err := invariantError(e); err != nil {
		t.Fatal(err)
	}
}

func invariantError(e *env) error {
	a := e.a
	a.mu.Lock()
	defer a.mu.Unlock()

	// Every block, found through the pools, the live map and the event queue.
	var blocks []*block
	for _, pool := range []*blockPool{&a.small, &a.large} {
		free := pool.blocks.appendTo(nil)
		if len(free) != pool.blocks.Len() {
			return fmt.Errorf("%s pool: tree walks %d blocks but counts %d", pool.kind(), len(free), pool.blocks.Len())
		}
		for i, b := range free {
			if b.allocated || b.eventCount != 0 || len(b.streamUses) != 0 || !b.mapped || b.pool != pool {
				return fmt.Errorf("%s pool holds a block that is not free: %+v", pool.kind(), *b)
			}
			if i > 0 && pool.blocks.cmp(free[i-1], b) >= 0 {
				return fmt.Errorf("%s pool out of order at %#x", pool.kind(), b.addr)
			}
		}
		unmapped := pool.unmapped.appendTo(nil)
		for _, b := range unmapped {
			if b.mapped || b.seg == nil || b.pool != pool {
				return fmt.Errorf("%s pool's unmapped set holds %+v", pool.kind(), *b)
			}
		}
		blocks = append(blocks, free...)
		blocks = append(blocks, unmapped...)
	}
	for addr, b := range a.live {
		if !b.allocated || b.addr != addr {
			return fmt.Errorf("live map: %#x -> %+v", addr, *b)
		}
		blocks = append(blocks, b)
	}
	pendingEvents := map[*block]int32{}
	for _, q := range a.events {
		if len(q.queue) == q.head {
			return fmt.Errorf("empty event queue of stream %d kept", q.stream)
		}
		for _, ev := range q.queue[q.head:] {
			if ev.ev.Stream != q.stream {
				return fmt.Errorf("event of stream %d queued on stream %d", ev.ev.Stream, q.stream)
			}
			pendingEvents[ev.block]++
		}
	}
	for b, n := range pendingEvents {
		if b.allocated || b.eventCount != n {
			return fmt.Errorf("pending block %#x: allocated=%v events=%d, queued %d", b.addr, b.allocated, b.eventCount, n)
		}
		blocks = append(blocks, b)
	}
	byAddr := map[uint64]*block{}
	tracked := map[*block]bool{}
	for _, b := range blocks {
		tracked[b] = true
		if byAddr[b.addr] != nil {
			return fmt.Errorf("block %#x found twice", b.addr)
		}
		byAddr[b.addr] = b
	}

	var want Stats
	add := func(arr *StatArray, pool int, n uint64) {
		arr[statAll].Current += int64(n)
		arr[pool].Current += int64(n)
	}
	seen := map[*block]bool{}
	var oversizeAllocs, oversizeSegs int64

	walk := func(head *block, base, size uint64, es *expandableSegment) error {
		addr := base
		var mapped uint64
		for b := head; b != nil; b = b.next {
			if seen[b] {
				return fmt.Errorf("block %#x in two chains", b.addr)
			}
			seen[b] = true
			if !tracked[b] {
				return fmt.Errorf("block %#x is in a segment but in no pool, live map or event queue", b.addr)
			}
			if b.addr != addr {
				return fmt.Errorf("segment %#x: gap or overlap at %#x (block starts at %#x)", base, addr, b.addr)
			}
			if b.next != nil && b.next.prev != b {
				return fmt.Errorf("segment %#x: broken links at %#x", base, b.addr)
			}
			if b.seg != es || b.pool != head.pool || b.stream != head.stream {
				return fmt.Errorf("segment %#x: block %#x disagrees on segment, pool or stream", base, b.addr)
			}
			if b.size == 0 || (b.mapped && b.size%MinBlockSize != 0) {
				return fmt.Errorf("segment %#x: block %#x has size %d", base, b.addr, b.size)
			}
			free := !b.allocated && b.eventCount == 0 && len(b.streamUses) == 0
			if n := b.next; n != nil && free && !n.allocated && n.eventCount == 0 && len(n.streamUses) == 0 && n.mapped == b.mapped {
				return fmt.Errorf("segment %#x: adjacent free blocks %#x and %#x not merged", base, b.addr, n.addr)
			}
			st := b.pool.statType
			switch {
			case !b.mapped:
				if es == nil {
					return fmt.Errorf("unmapped block %#x outside an expandable segment", b.addr)
				}
				for p := es.pageFloor(b.addr); p < es.pageCeil(b.addr+b.size); p++ {
					if p < uint64(len(es.pages)) && es.pages[p] != 0 {
						return fmt.Errorf("unmapped block %#x covers mapped page %d", b.addr, p)
					}
				}
			case b.allocated:
				add(&want.Allocation, st, 1)
				add(&want.AllocatedBytes, st, b.size)
				add(&want.Active, st, 1)
				add(&want.ActiveBytes, st, b.size)
				add(&want.RequestedBytes, st, b.requested)
				if b.size >= a.maxSplit {
					oversizeAllocs++
				}
			case !free:
				add(&want.Active, st, 1)
				add(&want.ActiveBytes, st, b.size)
				add(&want.RequestedBytes, st, b.requested)
			case es == nil && b.isSplit():
				add(&want.InactiveSplit, st, 1)
				add(&want.InactiveSplitBytes, st, b.size)
			}
			if b.mapped {
				mapped += b.size
				if es != nil {
					for p := es.pageFloor(b.addr); p < es.pageCeil(b.addr+b.size); p++ {
						if p >= uint64(len(es.pages)) || es.pages[p] == 0 {
							return fmt.Errorf("mapped block %#x covers unmapped page %d", b.addr, p)
						}
					}
				}
			}
			addr += b.size
		}
		if addr != base+size {
			return fmt.Errorf("segment %#x: blocks cover %d bytes, segment has %d", base, addr-base, size)
		}
		st := head.pool.statType
		if es == nil {
			add(&want.Segment, st, 1)
			add(&want.ReservedBytes, st, size)
			if size >= a.maxSplit {
				oversizeSegs++
			}
		} else {
			if mapped != es.mapped {
				return fmt.Errorf("expandable segment %#x: blocks map %d bytes, segment says %d", base, mapped, es.mapped)
			}
			add(&want.ReservedBytes, st, mapped)
		}
		return nil
	}

	// cudaMalloc'd segments, as the device knows them.
	e.dev.mu.Lock()
	devSegments := map[uint64]uint64{}
	for k, v := range e.dev.segments {
		devSegments[k] = v
	}
	devUsed := e.dev.used
	e.dev.mu.Unlock()
	for base, size := range devSegments {
		head := byAddr[base]
		if head == nil || head.prev != nil || head.seg != nil {
			return fmt.Errorf("device segment %#x has no head block", base)
		}
		if err := walk(head, base, size, nil); err != nil {
			return err
		}
	}
	for _, es := range a.expandable {
		head := byAddr[es.base]
		if head == nil || head.prev != nil || head.seg != es {
			return fmt.Errorf("expandable segment %#x has no head block", es.base)
		}
		if err := walk(head, es.base, es.size(), es); err != nil {
			return err
		}
	}
	for _, b := range blocks {
		if !seen[b] {
			return fmt.Errorf("block %#x (size %d) belongs to no segment", b.addr, b.size)
		}
	}

	got := a.stats
	check := func(name string, g, w *StatArray) error {
		for i := range numStatTypes {
			if g[i].Current != w[i].Current {
				return fmt.Errorf("%s[%d].current = %d, blocks say %d", name, i, g[i].Current, w[i].Current)
			}
			if g[i].Peak < g[i].Current {
				return fmt.Errorf("%s[%d].peak %d < current %d", name, i, g[i].Peak, g[i].Current)
			}
			if g[i].Allocated-g[i].Freed != g[i].Current {
				return fmt.Errorf("%s[%d]: allocated %d - freed %d != current %d", name, i, g[i].Allocated, g[i].Freed, g[i].Current)
			}
		}
		return nil
	}
	for _, c := range []struct {
		name string
		g, w *StatArray
	}{
		{"allocation", &got.Allocation, &want.Allocation},
		{"segment", &got.Segment, &want.Segment},
		{"active", &got.Active, &want.Active},
		{"inactive_split", &got.InactiveSplit, &want.InactiveSplit},
		{"allocated_bytes", &got.AllocatedBytes, &want.AllocatedBytes},
		{"reserved_bytes", &got.ReservedBytes, &want.ReservedBytes},
		{"active_bytes", &got.ActiveBytes, &want.ActiveBytes},
		{"inactive_split_bytes", &got.InactiveSplitBytes, &want.InactiveSplitBytes},
		{"requested_bytes", &got.RequestedBytes, &want.RequestedBytes},
	} {
		if err := check(c.name, c.g, c.w); err != nil {
			return err
		}
	}
	// The oversize counters follow the max_split_size in force at each event; they only add up when it
	// has not changed since the allocator was made.
	if maxSplitStat(a.maxSplit) == got.MaxSplitSize &&
		(got.OversizeAllocations.Current != oversizeAllocs || got.OversizeSegments.Current != oversizeSegs) {
		return fmt.Errorf("oversize allocations/segments %d/%d, blocks say %d/%d",
			got.OversizeAllocations.Current, got.OversizeSegments.Current, oversizeAllocs, oversizeSegs)
	}
	reserved := uint64(got.ReservedBytes[statAll].Current)
	if devUsed != reserved || a.totalAllocated != reserved {
		return fmt.Errorf("device holds %d bytes, total_allocated_memory %d, reserved_bytes %d", devUsed, a.totalAllocated, reserved)
	}
	return nil
}

// replay rebuilds allocated and reserved bytes from the trace alone.
func replay(events []traceEvent) (allocated, reserved int64) {
	for _, ev := range events {
		switch ev.Action {
		case "alloc":
			allocated += int64(ev.Block)
		case "free_requested":
			allocated -= int64(ev.Block)
		case "segment_alloc", "segment_map":
			reserved += int64(ev.Size)
		case "segment_free", "segment_unmap":
			reserved -= int64(ev.Size)
		}
	}
	return allocated, reserved
}

// TestRandomInvariants drives the allocator with long random sequences under several settings and checks,
// every few operations, that the blocks tile their segments, that free neighbours are merged, that every
// stat equals what the blocks add up to, that the device holds exactly the reserved bytes, and that the
// trace alone reproduces allocated and reserved bytes.
func TestRandomInvariants(t *testing.T) {
	configs := map[string]struct {
		conf     string
		streams  int
		record   bool
		fraction float64
		capacity uint64
		tiny     bool // mostly small requests: thousands of live blocks, deep trees
	}{
		"many small":            {conf: "", streams: 2, capacity: 2 * gib, tiny: true},
		"many small expandable": {conf: "expandable_segments:True", streams: 2, record: true, capacity: 2 * gib, tiny: true},
		"default":               {conf: "", streams: 1, capacity: 2 * gib},
		"tight device":          {conf: "", streams: 1, capacity: 512 << 20},
		"max split":             {conf: "max_split_size_mb:64", streams: 1, capacity: 1 * gib},
		"max split rounding":    {conf: "max_split_size_mb:32,max_non_split_rounding_mb:40", streams: 2, capacity: 1 * gib},
		"streams record_stream": {conf: "", streams: 3, record: true, capacity: 1 * gib},
		"roundup":               {conf: "roundup_power2_divisions:[1:4,16:8,>:2]", streams: 2, capacity: 1 * gib},
		"expandable":            {conf: "expandable_segments:True", streams: 1, capacity: 1 * gib},
		"expandable streams":    {conf: "expandable_segments:True", streams: 3, record: true, capacity: 1 * gib},
		"expandable big pages":  {conf: "expandable_segments:True,large_segment_size_mb:40", streams: 2, capacity: 1 * gib},
		"fraction gc":           {conf: "garbage_collection_threshold:0.6", streams: 2, fraction: 0.7, capacity: 1 * gib},
		"everything": {conf: "max_split_size_mb:48,garbage_collection_threshold:0.5,roundup_power2_divisions:4",
			streams: 3, record: true, fraction: 0.8, capacity: 1 * gib},
	}
	for name, c := range configs {
		for seed := uint64(1); seed <= 3; seed++ {
			t.Run(fmt.Sprintf("%s/seed%d", name, seed), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, c.capacity, 64<<20, c.conf)
				if c.fraction > 0 {
					if err := e.a.SetMemoryFraction(c.fraction); err != nil {
						t.Fatal(err)
					}
				}
				ops := 4000
				if c.tiny {
					ops = 20000
				}
				runRandom(t, e, seed, ops, c.streams, c.record, c.tiny)
			})
		}
	}
}

func runRandom(t *testing.T, e *env, seed uint64, ops, streams int, record, tiny bool) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	type live struct {
		addr   uint64
		stream int64
	}
	var held []live
	ooms := 0
	randSize := func() uint64 {
		if tiny {
			if rng.IntN(10) < 9 {
				return 1 + rng.Uint64N(64*kib)
			}
			return 1 + rng.Uint64N(2*mib)
		}
		switch r := rng.IntN(100); {
		case r < 45: // small pool
			return 1 + rng.Uint64N(SmallSize)
		case r < 80: // 1-10 MiB
			return SmallSize + 1 + rng.Uint64N(9*mib)
		case r < 97:
			return 10*mib + rng.Uint64N(60*mib)
		default:
			return 64*mib + rng.Uint64N(200*mib)
		}
	}
	for i := range ops {
		switch r := rng.IntN(100); {
		case r < 52 || len(held) == 0 || (tiny && r < 75 && i < ops/2):
			stream := int64(rng.IntN(streams))
			if stream > 0 {
				stream = 0x1000 + stream // raw stream pointers
			}
			addr, err := e.a.Malloc(randSize(), stream)
			var oom *OutOfMemoryError
			switch {
			case errors.As(err, &oom):
				ooms++
				// Make room, as a training loop that catches OOM would.
				for range len(held) / 2 {
					j := rng.IntN(len(held))
					e.free(held[j].addr)
					held = slices.Delete(held, j, j+1)
				}
			case err != nil:
				t.Fatalf("op %d: Malloc: %v", i, err)
			default:
				held = append(held, live{addr, stream})
				if record && streams > 1 && rng.IntN(4) == 0 {
					if err := e.a.RecordStream(addr, 0x1000+int64(1+rng.IntN(streams-1))); err != nil {
						t.Fatal(err)
					}
				}
			}
		case r < 95:
			j := rng.IntN(len(held))
			e.free(held[j].addr)
			held = slices.Delete(held, j, j+1)
		case r < 97:
			e.a.Synchronize()
		default:
			if err := e.a.EmptyCache(); err != nil {
				t.Fatal(err)
			}
		}
		if i%97 == 0 {
			if err := invariantError(e); err != nil {
				t.Fatalf("op %d: %v", i, err)
			}
		}
	}
	checkInvariants(t, e)
	for _, h := range held {
		e.free(h.addr)
	}
	if err := e.a.EmptyCache(); err != nil {
		t.Fatal(err)
	}
	checkInvariants(t, e)

	// Trace order: a new segment is followed at once by the alloc it serves, at its base; without
	// record_stream every free completes at once.
	evs := e.rec.events
	for i, ev := range evs {
		switch ev.Action {
		case "segment_alloc":
			if i+1 >= len(evs) || evs[i+1].Action != "alloc" || evs[i+1].Addr != ev.Addr {
				t.Fatalf("event %d: %v not followed by its alloc", i, ev)
			}
		case "free_requested":
			if !record && (i+1 >= len(evs) || evs[i+1].Action != "free_completed" || evs[i+1].Addr != ev.Addr) {
				t.Fatalf("event %d: %v not completed at once", i, ev)
			}
		}
	}

	st := e.a.Stats()
	allocated, reserved := replay(e.rec.events)
	if allocated != st.AllocatedBytes[statAll].Current || reserved != st.ReservedBytes[statAll].Current {
		t.Fatalf("trace replays to allocated %d reserved %d; stats say %d and %d",
			allocated, reserved, st.AllocatedBytes[statAll].Current, st.ReservedBytes[statAll].Current)
	}
	if st.AllocatedBytes[statAll].Current != 0 || st.Active[statAll].Current != 0 {
		t.Fatalf("after freeing everything: allocated %d active %d", st.AllocatedBytes[statAll].Current, st.Active[statAll].Current)
	}
	if int(st.NumOOMs) != ooms {
		t.Fatalf("num_ooms %d, saw %d OOM errors", st.NumOOMs, ooms)
	}
	// After empty_cache with nothing in use, nothing stays reserved.
	if st.ReservedBytes[statAll].Current != 0 || e.dev.Used() != 0 {
		t.Fatalf("after empty_cache: reserved %d, device used %d", st.ReservedBytes[statAll].Current, e.dev.Used())
	}
	t.Logf("%d ops, %d OOMs, peak reserved %d MiB, peak blocks %d, %d retries, %d device allocs",
		ops, ooms, st.ReservedBytes[statAll].Peak>>20, st.Allocation[statAll].Peak, st.NumAllocRetries, st.NumDeviceAlloc)
}

// TestInvariantCheckerCatchesCorruption makes sure the checker used above is not vacuous.
func TestInvariantCheckerCatchesCorruption(t *testing.T) {
	corruptions := map[string]func(e *env){
		"stat off":      func(e *env) { e.a.stats.AllocatedBytes[statAll].Current++ },
		"pool stat off": func(e *env) { e.a.stats.InactiveSplit[statSmallPool].Current++ },
		"unmerged neighbours": func(e *env) {
			// Split the cached tail of the segment in two free blocks.
			b := e.a.small.blocks.appendTo(nil)[0]
			e.a.small.blocks.erase(b)
			n := &block{addr: b.addr + 512, size: b.size - 512, stream: b.stream, pool: b.pool, mapped: true}
			b.size = 512
			n.splice(b, b.next)
			e.a.small.blocks.insert(b)
			e.a.small.blocks.insert(n)
			e.a.stats.InactiveSplit.increase(statSmallPool, 1)
		},
		"gap":         func(e *env) { e.a.small.blocks.appendTo(nil)[0].size -= 512 },
		"device leak": func(e *env) { e.dev.used += 512 },
		"lost block":  func(e *env) { b := e.a.small.blocks.appendTo(nil)[0]; e.a.small.blocks.erase(b) },
		"pending stale": func(e *env) {
			q := e.a.eventQueue(1)
			q.queue = append(q.queue, pendingEvent{ev: Event{Stream: 1}, block: e.a.small.blocks.appendTo(nil)[0]})
		},
	}
	for name, corrupt := range corruptions {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, gib, 0, "")
			e.malloc(1000, 0)
			e.malloc(3000, 0)
			if err := invariantError(e); err != nil {
				t.Fatalf("clean state: %v", err)
			}
			corrupt(e)
			if err := invariantError(e); err == nil {
				t.Fatal("corruption not detected")
			}
		})
	}
}

// TestHostileConfig checks settings PyTorch would refuse neither panic nor break the allocator's structure.
func TestHostileConfig(t *testing.T) {
	var odd [RoundupIntervals]uint64
	for i := range odd {
		odd[i] = []uint64{3, 1 << 55, 7, 1 << 62}[i%4]
	}
	cfg := Config{
		LargeSegmentSize:           1,
		MaxSplitSize:               1,
		MaxNonSplitRounding:        1,
		RoundupPower2Divisions:     odd,
		GarbageCollectionThreshold: -5,
		PerProcessMemoryFraction:   7,
	}
	for _, expandable := range []bool{false, true} {
		cfg.ExpandableSegments = expandable
		e := newEnvConfig(t, gib, 0, cfg)
		runRandom(t, e, 9, 3000, 2, true, false)
	}
}
