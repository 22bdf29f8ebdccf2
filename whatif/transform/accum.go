package transform

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Accumulate is gradient accumulation over k micro-batches (2 <= k <= 64) with the same effective batch: the
// batch scales by 1/k (BatchScale), and each iteration's data loading, forward and backward run k times
// before its optimizer step. The first micro-step's backward allocates the gradients that do not exist yet;
// the later ones add theirs in place (PyTorch's AccumulateGrad), so a gradient they would have made is
// released as soon as it is added, and a copy made into .grad is not made. What one micro-step keeps for the
// next (nanoGPT's loop holds the logits until the next forward returns) is released where the recording
// released the previous iteration's.
func Accumulate(k int) Transform {
	name := fmt.Sprintf("accumulate %d", k)
	return Transform{Name: name, repeats: k, apply: func(t *trace) (*trace, string, error) {
		if err := CheckAccumulate(k); err != nil {
			return nil, "", err
		}
		scaledT, scaleLine, err := BatchScale(1 / float64(k)).apply(t)
		if tags := (*MissingTagsError)(nil); errors.As(err, &tags) {
			// The batch of each micro-step is how accumulation works, not what was asked for: name the fix.
			return nil, "", &MissingTagsError{name, tags.Tags}
		}
		if err != nil {
			return nil, "", err
		}
		out, line, err := repeatMicroSteps(scaledT, k, name)
		if err != nil {
			return nil, "", err
		}
		return out, line + "; " + scaleLine, nil
	}}
}

// CheckAccumulate says whether gradients can be accumulated over k micro-batches: 2 to 64.
func CheckAccumulate(k int) error {
	if k < 2 || k > 64 {
		return fmt.Errorf("accumulate %d: the number of micro-batches must be between 2 and 64", k)
	}
	return nil
}

// region is the part of one iteration that gradient accumulation repeats: [start, end) of the events,
// from its data (or forward) phase to its optimizer phase. complete is false when the trace ends before the
// optimizer phase.
type region struct {
	start, end int
	iteration  int32
	complete   bool
}

// microRegions finds every iteration's data-forward-backward region.
func (t *trace) microRegions() []region {
	var rs []region
	open := -1
	var it int32
	for i := range t.events {
		e := &t.events[i]
		if e.Action != snapshot.ActionPhase {
			continue
		}
		switch e.Phase {
		case snapshot.PhaseData, snapshot.PhaseForward:
			if open < 0 && e.Iteration >= 0 {
				open, it = i, e.Iteration
			}
		case snapshot.PhaseOptimizer:
			if open >= 0 {
				rs = append(rs, region{start: open, end: i, iteration: it, complete: true})
				open = -1
			}
		case snapshot.PhaseEval, snapshot.PhaseZeroGrad, snapshot.PhaseSetup, snapshot.PhaseLoad:
			open = -1 // a loop without an optimizer step: nothing to accumulate
		}
	}
	if open >= 0 {
		rs = append(rs, region{start: open, end: len(t.events), iteration: it})
	}
	return rs
}

// repeatMicroSteps runs each iteration's region of t k times (once for a region the trace cuts short).
func repeatMicroSteps(t *trace, k int, name string) (*trace, string, error) {
	rs := t.microRegions()
	if len(rs) == 0 {
		return nil, "", &MissingTagsError{name, "data, forward, backward and optimizer phase"}
	}
	bs := t.index()
	m := &microSteps{t: t, out: t.derive(len(t.events) * k), k: k, rs: rs, bs: bs,
		carriedFree: t.carriedBlocks(rs, bs), cur: map[uint64]uint64{}}
	i := 0
	for ri, r := range rs {
		for ; i < r.start; i++ {
			m.out.emitMapped(t.events[i], m.addr)
		}
		m.region(ri)
		i = r.end
	}
	for ; i < len(t.events); i++ {
		m.out.emitMapped(t.events[i], m.addr)
	}
	line := fmt.Sprintf("%s: data, forward and backward run %d times per optimizer step in %d iterations; "+
		"%d gradients the later micro-steps made were added in place and released, %d copies into .grad not made",
		name, k, len(rs)-m.incomplete, m.accumulated, m.notMade)
	if m.incomplete > 0 {
		line += fmt.Sprintf("; the recording ends inside iteration %d's first micro-step: its other %d micro-steps "+
			"and what follows were never recorded", rs[len(rs)-1].iteration, k-1)
	}
	return m.out, line, nil
}

// regionOf returns the index of the region of rs event i falls in, or -1.
func regionOf(rs []region, i int) int {
	j := sort.Search(len(rs), func(j int) bool { return rs[j].end > i })
	if j < len(rs) && i >= rs[j].start {
		return j
	}
	return -1
}

// carriedBlocks finds the blocks each region carries to the next micro-step: a block a region leaves alive
// and the next iteration's region frees. Each copy but the last has its block released by the next copy,
// at the point the next region released it. The last iteration has no next region: its carried blocks are
// those allocated where an earlier region allocated one (iterations repeat the same code). It returns, by
// region, the blocks by the offset in the region where the next copy releases them.
func (t *trace) carriedBlocks(rs []region, bs map[uint64]*block) []map[int][]uint64 {
	carriedFree := make([]map[int][]uint64, len(rs))
	carry := func(ri int, addr uint64, off int) {
		if carriedFree[ri] == nil {
			carriedFree[ri] = map[int][]uint64{}
		}
		carriedFree[ri][off] = append(carriedFree[ri][off], addr)
	}
	pattern := map[int]int{}  // offset of a carried block's alloc in its region -> offset of its free in the next
	var unmatched []uint64    // blocks alive at the end of the last complete region
	for i := range t.events { // the blocks in the order they were allocated, so that the output is the same every time
		addr := t.events[i].Addr
		b := bs[addr]
		if t.events[i].Action != snapshot.ActionAlloc || b == nil || b.alloc != i {
			continue
		}
		ra := regionOf(rs, b.alloc)
		if ra < 0 || b.gradAt >= 0 {
			continue
		}
		rf := -1
		if b.free >= 0 {
			rf = regionOf(rs, b.free)
		}
		switch {
		case rf > ra && rs[rf].iteration == rs[ra].iteration+1:
			carry(ra, addr, b.free-rs[rf].start)
			pattern[b.alloc-rs[ra].start] = b.free - rs[rf].start
		case rf < 0 && (b.free < 0 || b.free >= rs[ra].end) && ra == len(rs)-1:
			unmatched = append(unmatched, addr)
		}
	}
	for _, addr := range unmatched {
		ri := len(rs) - 1
		if off, ok := pattern[bs[addr].alloc-rs[ri].start]; ok {
			carry(ri, addr, off)
		}
	}
	return carriedFree
}

// microSteps writes a trace with each iteration's region repeated k times.
type microSteps struct {
	t, out      *trace
	k           int
	rs          []region
	bs          map[uint64]*block
	carriedFree []map[int][]uint64 // see carriedBlocks
	cur         map[uint64]uint64  // address in t -> address of its newest copy

	accumulated, notMade, incomplete int
}

// microStep is one copy c of region ri: its blocks' addresses (this), and those of the copy before it
// (prev), whose carried blocks it releases.
type microStep struct {
	ri, c      int
	this, prev map[uint64]uint64
	skipped    map[uint64]bool // blocks this copy does not make, or has released already
}

// addr returns the address of a's newest copy.
func (m *microSteps) addr(a uint64) uint64 {
	if c, ok := m.cur[a]; ok {
		return c
	}
	return a
}

// region writes region ri's copies.
func (m *microSteps) region(ri int) {
	r := m.rs[ri]
	copies := m.k
	if !r.complete {
		copies, m.incomplete = 1, m.incomplete+1
	}
	prev := map[uint64]uint64{}
	for c := 0; c < copies; c++ {
		s := &microStep{ri: ri, c: c, this: map[uint64]uint64{}, prev: prev, skipped: map[uint64]bool{}}
		for j := r.start; j < r.end; j++ {
			m.event(s, j)
		}
		if c > 0 { // what a shorter region did not reach is released at its end
			n := r.end - r.start
			m.releaseCarried(s, m.t.events[r.end-1], func(o int) bool { return o >= n })
		}
		for a, fresh := range s.this {
			if !s.skipped[a] {
				m.cur[a] = fresh
			}
		}
		prev = map[uint64]uint64{}
		for j := r.start; j < r.end; j++ {
			if e := &m.t.events[j]; e.Action == snapshot.ActionAlloc {
				if a, ok := s.this[e.Addr]; ok {
					prev[e.Addr] = a
				} else if c == 0 {
					prev[e.Addr] = e.Addr
				}
			}
		}
	}
}

// releaseCarried releases, at event at, the previous copy's carried blocks whose offsets match.
func (m *microSteps) releaseCarried(s *microStep, at snapshot.Event, offsets func(int) bool) {
	carried := m.carriedFree[s.ri]
	for _, off := range slices.Sorted(maps.Keys(carried)) { // in order: the same output every time
		if !offsets(off) {
			continue
		}
		for _, a := range carried[off] {
			if p, ok := s.prev[a]; ok {
				f := freeEvents(at, p, m.bs[a].size, m.t.events[m.bs[a].alloc].BlockSize)
				m.out.events = append(m.out.events, f[0], f[1])
			}
		}
	}
}

// event writes event j of the region as copy s: the first copy as recorded, a later one at fresh
// addresses, without the copies into .grad and with the gradients it makes added in place and released.
func (m *microSteps) event(s *microStep, j int) {
	r := m.rs[s.ri]
	e := m.t.events[j]
	if s.c > 0 && len(m.carriedFree[s.ri][j-r.start]) > 0 {
		off := j - r.start
		m.releaseCarried(s, e, func(o int) bool { return o == off })
	}
	b := m.bs[e.Addr]
	inRegion := b != nil && b.alloc >= r.start && b.alloc < r.end
	switch e.Action {
	case snapshot.ActionAlloc:
		if s.c > 0 && b != nil && b.gradAt == j {
			s.skipped[e.Addr] = true // the copy into .grad: the later micro-steps add in place
			m.notMade++
			return
		}
		if s.c > 0 {
			s.this[e.Addr] = m.out.fresh()
			e.Addr = s.this[e.Addr]
		}
		m.out.events = append(m.out.events, e)
		return
	case snapshot.ActionCategory:
		if s.c > 0 && inRegion && b.gradAt == j {
			// Added in place to the gradient: released at once.
			if a, ok := s.this[e.Addr]; ok {
				f := freeEvents(e, a, b.size, m.t.events[b.alloc].BlockSize)
				m.out.events = append(m.out.events, f[0], f[1])
				s.skipped[e.Addr] = true
				m.accumulated++
			}
			return
		}
	case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
		if s.c > 0 && !inRegion && b != nil {
			return // a block from before the region: the first micro-step released it
		}
	}
	if s.c > 0 && inRegion {
		if s.skipped[e.Addr] {
			return
		}
		if a, ok := s.this[e.Addr]; ok {
			e.Addr = a
		}
	} else if !inRegion {
		e.Addr = m.addr(e.Addr)
	}
	m.out.events = append(m.out.events, e)
}

// emitMapped appends e with its address mapped.
func (t *trace) emitMapped(e snapshot.Event, addr func(uint64) uint64) {
	switch e.Action {
	case snapshot.ActionAlloc:
	case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionCategory:
		e.Addr = addr(e.Addr)
	}
	t.events = append(t.events, e)
}
