package torch

import (
	"cmp"
	"container/heap"
	"encoding/json"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

// devicePlan is what the analysis of one device's trace and final state produced.
type devicePlan struct {
	dev    int
	segs   []preSeg   // alive before the trace
	blocks []preBlock // in use before the trace
}

// aliveRef is a block in use during the first pass: the alloc entry that made it, or a pre-existing block.
type aliveRef struct {
	idx       int32 // entry index, or -(pre-existing block index)-1
	requested bool  // its free was requested
}

// analyze finds, for one device, what was alive before the trace began, and sizes every block. Its maps and
// the blocks it finds are counted against the budget as they grow.
func (im *importer) analyze(dev int, segs segmentOrder) (devicePlan, error) {
	p := devicePlan{dev: dev}
	var mm mapMeter
	const what = "following the trace"
	var entries []entry
	if dev < len(im.traces) {
		entries = im.traces[dev]
	}

	// Forward: a free of an address the trace never allocated is a block from before the trace.
	active := 0
	for si := range im.segs {
		if s := &im.segs[si]; s.Device == dev {
			for j := range s.Blocks {
				if s.Blocks[j].State != stateInactive {
					active++
				}
			}
		}
	}
	if err := im.mem.add(int64(active)*int64(unsafe.Sizeof(preBlock{})), what); err != nil {
		return p, err
	}
	p.blocks = make([]preBlock, 0, active)
	alive := make(map[uint64]aliveRef)
	seen := make(map[uint64]struct{})
	for i := range entries {
		e := &entries[i]
		switch e.act {
		case snapshot.ActionAlloc:
			if _, ok := alive[e.addr]; ok {
				im.origin.Inconsistencies++ // handed out again without a free
			}
			alive[e.addr] = aliveRef{idx: int32(i)}
			seen[e.addr] = struct{}{}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks), what); err != nil {
				return p, err
			}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			done := e.act == snapshot.ActionFreeCompleted
			if r, ok := alive[e.addr]; ok {
				if done {
					delete(alive, e.addr)
				} else {
					r.requested = true
					alive[e.addr] = r
				}
				break
			}
			if _, ok := seen[e.addr]; ok {
				im.origin.Inconsistencies++ // freed twice
				break
			}
			seen[e.addr] = struct{}{}
			p.blocks = append(p.blocks, preBlock{addr: e.addr, requested: e.size, stream: e.stream, stack: e.stack, pending: done})
			if !done {
				alive[e.addr] = aliveRef{idx: int32(-len(p.blocks)), requested: true}
			}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks), what); err != nil {
				return p, err
			}
		}
	}

	// The final state: blocks still in use that the trace never allocated were allocated before it began
	// ("ghosts" in memory_viz). Blocks the trace allocated and never freed take their size from the state.
	// Segments are walked by address, so that these blocks come sorted as the layout pass wants them.
	fixed := make(map[int32]int64) // alloc entry -> block size from the final state
	found := 0
	for _, si := range segs.order {
		s := &im.segs[si]
		if s.Device != dev {
			continue
		}
		for j := range s.Blocks {
			b := &s.Blocks[j]
			stack := im.blockStacks[int(segs.blockStart[si])+j]
			if b.State == stateInactive {
				continue
			}
			if r, ok := alive[b.Addr]; ok {
				found++
				if r.idx >= 0 {
					fixed[r.idx] = b.Size
					if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks)+len(fixed), what); err != nil {
						return p, err
					}
				} else {
					pb := &p.blocks[-r.idx-1]
					pb.size, pb.sizeKnown = b.Size, true
				}
				continue
			}
			if _, ok := seen[b.Addr]; ok {
				im.origin.Inconsistencies++ // the trace freed it, the state holds it
				continue
			}
			p.blocks = append(p.blocks, preBlock{addr: b.Addr, requested: b.Requested, size: b.Size, stream: s.Stream,
				stack: stack, sizeKnown: true, pending: b.State == statePendingFree})
		}
	}
	if im.haveState {
		im.origin.Inconsistencies += len(alive) - found // alive at the end by the trace, absent from the state
	}

	// Backward from the final state: the segments that existed when the trace began. Walking back, a
	// segment_alloc removes its segment (made during the trace) and a segment_free adds one (made before).
	// The expandable ranges mapped at the end are where the walk back starts: a segment_map of a range still
	// mapped at the end removes it, an unmap adds it back.
	var exp intervals
	for si := range im.segs {
		if s := &im.segs[si]; s.Device == dev && s.Expandable {
			exp.add(s.Addr, s.Addr+uint64(s.Size), s.Stream)
		}
	}
	created := map[uint64]bool{} // segments of the final state the trace made
	freed := map[uint64]preSeg{} // segments the trace freed that it had not made
	for i := len(entries) - 1; i >= 0; i-- {
		e := &entries[i]
		end := e.addr + uint64(e.size)
		switch e.act {
		case snapshot.ActionSegmentAlloc:
			if _, ok := freed[e.addr]; ok {
				delete(freed, e.addr) // freed later, made here: not from before
			} else if created[e.addr] {
				im.origin.Inconsistencies++ // made twice without a free between
			} else {
				created[e.addr] = true
			}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks)+len(fixed)+len(created)+len(freed), what); err != nil {
				return p, err
			}
		case snapshot.ActionSegmentFree:
			if _, ok := freed[e.addr]; ok {
				im.origin.Inconsistencies++ // freed twice without an alloc between
				break
			}
			// The stack of a segment_free is the releasing caller's (empty_cache), not the creator's: none.
			freed[e.addr] = preSeg{addr: e.addr, size: e.size, stream: e.stream, small: e.size <= smallBuffer}
			if err := mm.grew(&im.mem, len(alive)+len(seen)+len(p.blocks)+len(fixed)+len(created)+len(freed), what); err != nil {
				return p, err
			}
		case snapshot.ActionSegmentMap:
			if !exp.remove(e.addr, end) && im.haveState {
				im.origin.Inconsistencies++
			}
		case snapshot.ActionSegmentUnmap:
			if !exp.add(e.addr, end, e.stream) {
				im.origin.Inconsistencies++
			}
		}
	}
	nfinal := 0
	for _, si := range segs.order { // by address, as startLayout wants them
		s := &im.segs[si]
		if s.Device != dev {
			continue
		}
		if s.Expandable {
			continue // in exp already
		}
		if created[s.Addr] {
			nfinal++
			continue
		}
		p.segs = append(p.segs, preSeg{addr: s.Addr, size: s.Size, stream: s.Stream, stack: im.segStacks[si],
			small: s.Pool == "small", known: true})
	}
	if im.haveState && nfinal != len(created) {
		im.origin.Inconsistencies += len(created) - nfinal // made during the trace, never freed, not in the state
	}
	for _, s := range freed {
		s.known = im.haveState // without the final state, blocks alive from start to end are unknown
		p.segs = append(p.segs, s)
	}
	for _, r := range exp {
		p.segs = append(p.segs, preSeg{addr: r.start, size: int64(r.end - r.start), stream: r.stream, expandable: true})
	}
	im.startLayout(p.segs, p.blocks)

	if len(entries) > 0 {
		if err := im.sizeBlocks(entries, &p, fixed, &mm, len(alive)+len(seen)+len(p.blocks)+len(fixed)+len(created)+len(freed)); err != nil {
			return p, err
		}
	}
	im.origin.PreExistingSegments += len(p.segs)
	im.origin.PreExistingBlocks += len(p.blocks)
	for i := range p.blocks {
		if p.blocks[i].sizeKnown {
			im.origin.BlockSizesExact++
		} else {
			im.origin.BlockSizesEstimated++
		}
	}
	// The maps are garbage now; of what mm counted, the blocks found beyond the active ones stay.
	im.mem.release(int64(mm.charged) * mapEntryBytes)
	return p, im.mem.add(int64(max(cap(p.blocks)-active, 0))*int64(unsafe.Sizeof(preBlock{}))+int64(cap(p.segs))*int64(unsafe.Sizeof(preSeg{})), what)
}

// segmentOrder is the final state's segments by address (then device), as indices of im.segs, and where
// each segment's blocks start in im.blockStacks.
type segmentOrder struct {
	order, blockStart []int32
}

func (im *importer) segmentOrder() segmentOrder {
	o := segmentOrder{order: make([]int32, len(im.segs)), blockStart: make([]int32, len(im.segs))}
	n := 0
	for i := range im.segs {
		o.order[i] = int32(i)
		o.blockStart[i] = int32(n)
		n += len(im.segs[i].Blocks)
	}
	slices.SortFunc(o.order, func(a, b int32) int {
		sa, sb := &im.segs[a], &im.segs[b]
		return cmp.Or(cmp.Compare(sa.Addr, sb.Addr), cmp.Compare(sa.Device, sb.Device), cmp.Compare(a, b))
	})
	return o
}

// sizeBlocks runs forward through the trace, following the layout of the segments, to size every block.
// Its map and the layout's blocks are counted in mm, on top of the base entries of analyze's maps.
func (im *importer) sizeBlocks(entries []entry, p *devicePlan, fixed map[int32]int64, mm *mapMeter, base int) error {
	lay := layout{pre: p.blocks} // sorted by address
	backing := make([]lseg, 0, len(p.segs))
	for i := range p.segs {
		s := &p.segs[i]
		if s.expandable {
			lay.exp.add(s.addr, s.end(), s.stream)
			continue
		}
		backing = append(backing, lseg{base: s.addr, end: s.end(), known: s.known, unloaded: true})
		lay.segs = append(lay.segs, &backing[len(backing)-1])
	}
	// Sizes of the blocks the trace allocates; those of pre-existing blocks are found in p.blocks (by address).
	sizes := make(map[uint64]int64)
	sizeOf := func(addr uint64) int64 {
		if n, ok := sizes[addr]; ok {
			return n
		}
		if i, ok := slices.BinarySearchFunc(p.blocks, addr, func(b preBlock, a uint64) int { return cmp.Compare(b.addr, a) }); ok {
			return p.blocks[i].size
		}
		return 0
	}
	// A segment_alloc is recorded immediately before the alloc it serves, at the same address.
	fresh := false
	allocs := 0
	for i := range entries {
		e := &entries[i]
		switch e.act {
		case snapshot.ActionSegmentAlloc:
			if !lay.add(&lseg{base: e.addr, end: e.addr + uint64(e.size), known: true}) {
				im.origin.Inconsistencies++
			}
			fresh = e.size > 0 && i+1 < len(entries) && entries[i+1].addr == e.addr
			continue
		case snapshot.ActionSegmentFree:
			lay.remove(e.addr)
		case snapshot.ActionSegmentMap:
			lay.exp.add(e.addr, e.addr+uint64(e.size), e.stream)
		case snapshot.ActionSegmentUnmap:
			lay.exp.remove(e.addr, e.addr+uint64(e.size))
		case snapshot.ActionAlloc:
			e.block = im.blockSize(e, &lay, fixed, int32(i), fresh)
			sizes[e.addr] = e.block
			allocs++
			if err := mm.grew(&im.mem, base+len(sizes)+allocs/4, "following the trace"); err != nil { // a layout block is a quarter of a map entry
				return err
			}
		case snapshot.ActionFreeRequested:
			e.block = sizeOf(e.addr)
		case snapshot.ActionFreeCompleted:
			e.block = sizeOf(e.addr)
			delete(sizes, e.addr)
			if e.block > smallSize {
				if s := lay.find(e.addr); s != nil {
					s.removeBlock(e.addr)
				}
			}
		case snapshot.ActionOOM:
			e.block = int64(im.rules.allocationSize(uint64(e.size)))
		}
		fresh = false
	}
	return nil
}

// blockSize returns the size of the block an alloc entry got, and records it in the layout.
func (im *importer) blockSize(e *entry, lay *layout, fixed map[int32]int64, idx int32, fresh bool) int64 {
	r := im.rules.roundSize(uint64(e.size))
	var size uint64
	exact := true
	var seg *lseg
	switch {
	case r <= smallSize || lay.exp.contains(e.addr):
		size = r
	default:
		seg = lay.find(e.addr)
		free, ok := uint64(0), false
		if seg != nil {
			free, ok = seg.freeBlockAt(e.addr)
			if fresh && !ok { // a new segment: its one free block is the segment
				free, ok = seg.end-seg.base, seg.base == e.addr
			}
		}
		switch {
		case ok && free >= r:
			size = free
			if im.rules.splits(free, r) {
				size = r
			}
		default:
			size, exact = r, false
			if seg != nil && ok { // the layout says less room than the request: it was wrong
				seg.known = false
			}
		}
	}
	if f, ok := fixed[idx]; ok {
		if exact && uint64(f) != size {
			im.origin.Inconsistencies++
		}
		size, exact = uint64(f), true
	}
	if exact {
		im.origin.BlockSizesExact++
	} else {
		im.origin.BlockSizesEstimated++
	}
	if size > smallSize && seg != nil {
		if exact && seg.known {
			seg.insert(e.addr, size)
		} else {
			seg.known = false
		}
	}
	return int64(min(size, math.MaxInt64))
}

// build turns the records into the snapshot.
func (im *importer) build() (*snapshot.Snapshot, error) {
	plans := make([]devicePlan, 0, len(im.devices))
	nsynth := 0
	if err := im.mem.add(8*int64(len(im.segs)), "ordering the segments"); err != nil {
		return nil, err
	}
	order := im.segmentOrder()
	for _, d := range im.devices {
		p, err := im.analyze(d, order)
		if err != nil {
			return nil, err
		}
		nsynth += len(p.segs) + len(p.blocks)
		for i := range p.blocks {
			if p.blocks[i].pending {
				nsynth++
			}
		}
		plans = append(plans, p)
	}
	ntrace := 0
	for _, t := range im.traces {
		ntrace += len(t)
	}
	if nsynth+ntrace+len(im.annots) > im.lim.MaxEvents {
		return nil, limitErr("", "%d events > Limits.MaxEvents (%d)", nsynth+ntrace+len(im.annots), im.lim.MaxEvents)
	}
	im.placeRecorded()
	em := emitter{im: im, iteration: -1}
	// Room for the phase and iteration markers too: growing the events by copying them would need them twice.
	n := nsynth + ntrace + len(im.annots)
	if err := em.reserve(n + n/64 + 16); err != nil {
		return nil, err
	}
	pre := im.tab.str(PreExistingLabel)
	for _, p := range plans {
		for _, s := range p.segs {
			act := snapshot.ActionSegmentAlloc
			if s.expandable {
				act = snapshot.ActionSegmentMap
			}
			em.add(snapshot.Event{Action: act, Device: int16(p.dev), Stream: s.stream, Addr: s.addr, Size: s.size,
				Stack: s.stack, Label: pre, Iteration: -1})
		}
		for _, b := range p.blocks {
			e := snapshot.Event{Action: snapshot.ActionAlloc, Device: int16(p.dev), Stream: b.stream, Addr: b.addr,
				Size: b.requested, BlockSize: b.size, Stack: b.stack, Label: pre, Iteration: -1}
			if res, ok := im.recordedFinal(p.dev, b.addr); ok {
				e.Category = res.category
			}
			em.add(e)
			if b.pending {
				e.Action = snapshot.ActionFreeRequested
				em.add(e)
			}
		}
	}
	// What each stack says of its phase, read once before the trace is written.
	em.stacks = readStacks(&snapshot.Snapshot{Strings: im.tab.strings, Frames: im.tab.frames, Stacks: im.tab.stacks})
	em.trace()
	if em.err != nil {
		return nil, em.err
	}

	meta := snapshot.Meta{Tool: Source, Source: Source, TimeUnit: "index", AllocatorSettings: im.settings}
	if im.timeKnown {
		meta.TimeUnit = "us"
		// time_us counts from the Unix epoch; a clock that says otherwise leaves the start unknown (and a
		// time beyond year 9999 could not be written as JSON).
		if c := time.UnixMicro(em.t0).UTC(); em.t0 > 0 && c.Year() <= 9999 {
			meta.Created = c
		}
	}
	for _, d := range im.devices {
		meta.Devices = append(meta.Devices, snapshot.DeviceInfo{Index: d, Name: "cuda:" + strconv.Itoa(d), Kind: "unknown"})
	}
	s := &snapshot.Snapshot{Meta: meta, Strings: im.tab.strings, Frames: im.tab.frames, Stacks: im.tab.stacks}
	if err := em.infer(s); err != nil {
		return nil, err
	}
	if im.tab.err != nil {
		return nil, im.tab.err
	}
	origin, err := json.Marshal(im.origin)
	if err != nil {
		return nil, &ImportError{Offset: -1, Err: err}
	}
	s.Meta.Workload = origin
	segs := im.segs
	if segs == nil {
		segs = []snapshot.Segment{}
	}
	s.Strings = im.tab.strings
	s.Footer = &snapshot.Footer{Summary: summarize(em.events), Segments: segs}
	if err := em.columns(s); err != nil {
		return nil, err
	}
	return s, nil
}

// columns moves the events, written and inferred as a slice, into s's columns, which share what events
// repeat: the columns are counted in the budget, and the slice released once they hold everything.
func (em *emitter) columns(s *snapshot.Snapshot) error {
	var ev snapshot.Events
	ev.Grow(len(em.events))
	// About a row for each event but the frees, which share their allocation's: room for them all spares
	// the columns their copies as they grow.
	rows := 0
	for i := range em.events {
		if a := em.events[i].Action; a != snapshot.ActionFreeRequested && a != snapshot.ActionFreeCompleted {
			rows++
		}
	}
	ev.GrowRows(rows)
	charged := int64(0)
	for i := range em.events {
		ev.Append(&em.events[i])
		if i%4096 == 4095 || i == len(em.events)-1 {
			b := ev.Bytes()
			if err := em.im.mem.add(b-charged, "building the events"); err != nil {
				return err
			}
			charged = b
		}
	}
	em.im.mem.release(int64(cap(em.events)) * eventBytes)
	em.events = nil
	s.Events = ev.View()
	return nil
}

// infer applies what Infer finds in the trace written so far (s, whose events are em.events): iteration
// boundaries where no ProfilerStep#N marked them, with an iteration event before each; the category of
// every block the file left without one; the module whose forward allocated it as its scope where the file
// gave none. Tags of a block go on its frees too, as the runtime's do.
func (em *emitter) infer(s *snapshot.Snapshot) error {
	im := em.im
	// Infer reads the Origin for what the file recorded.
	origin, err := json.Marshal(im.origin)
	if err != nil {
		return &ImportError{Offset: -1, Err: err}
	}
	s.Meta.Workload = origin
	inf, t := inferEvents(s, em.events, em.stacks)
	im.origin.Iterations = inf.Iterations.String()
	s.Meta.Iterations = im.origin.Iterations

	var scopes []snapshot.StringID // by FrameID: the module's name, interned; 0 until asked for
	bi := 0
	for i := range em.events {
		e := &em.events[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			if bi < len(inf.Blocks) && inf.Blocks[bi].Seq == i {
				b := inf.Blocks[bi]
				bi++
				e.Category = b.Category
				if e.Scope == 0 && b.Module != 0 {
					if scopes == nil {
						scopes = make([]snapshot.StringID, len(s.Frames))
					}
					if int(b.Module) >= len(scopes) {
						e.Scope = im.tab.str(s.FrameString(b.Module))
					} else {
						if scopes[b.Module] == 0 {
							scopes[b.Module] = im.tab.str(s.FrameString(b.Module))
						}
						e.Scope = scopes[b.Module]
					}
				}
			}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			if a := t.tagged[i]; a >= 0 { // an earlier event: its tags are final
				e.Category, e.Scope = em.events[a].Category, em.events[a].Scope
			}
		}
	}
	if inf.Iterations == IterationsProfilerStep || inf.Iterations == IterationsRecorded || len(inf.Boundaries) == 0 {
		return nil
	}
	// Number the iterations, then make room for their markers and move the events up from the back.
	b := inf.Boundaries
	for k := len(b) - 1; k >= 0; k-- {
		end := len(em.events)
		if k+1 < len(b) {
			end = b[k+1].Seq
		}
		for i := b[k].Seq; i < end; i++ {
			if !t.reconstructed(&em.events[i]) {
				em.events[i].Iteration = b[k].Iteration
			}
		}
	}
	placePhases(t, b)
	n := len(em.events)
	if need := n + len(b); need > cap(em.events) {
		if err := em.reserve(need); err != nil {
			return err
		}
	}
	em.events = em.events[:n+len(b)]
	src := n - 1
	for k := len(b) - 1; k >= 0; k-- {
		for ; src >= b[k].Seq; src-- {
			em.events[src+k+1] = em.events[src]
		}
		at := b[k].Seq + k
		next := em.events[at+1]
		prev := snapshot.PhaseNone
		if b[k].Seq > 0 {
			prev = em.events[b[k].Seq-1].Phase // not moved: it is before the boundary
		}
		// An iteration event carries the new iteration but still the phase before it, as the runtime writes it.
		em.events[at] = snapshot.Event{Time: next.Time, Action: snapshot.ActionIteration, Device: next.Device,
			Phase: prev, Iteration: b[k].Iteration}
	}
	for i := range em.events {
		em.events[i].Seq = uint64(i)
	}
	return nil
}

// placePhases gives the events of a trace with iterations b the phases oomdbg's runtime records where no
// frame or region named one: setup before the first iteration, where the trace holds the whole run (nothing
// was allocated before it: a ring buffer that wrapped begins mid-iteration, not in setup); data from an iteration's start to its first
// event with a phase (the batch, as the boundaries place it); zero_grad from the first free of a gradient
// after the optimizer's last allocation of the iteration, where zero_grad shows no region (set_to_none
// frees the gradients; PyTorch records a free with its allocation's frames, so none name zero_grad); and
// the phase before them for the events left at the end of an iteration (after an Optimizer.step region).
// An iteration where nothing has a phase is left so.
func placePhases(t *trace, b []Boundary) {
	events := t.events
	set := func(e *snapshot.Event, p snapshot.Phase) {
		if !t.reconstructed(e) {
			e.Phase = p
		}
	}
	whole := true
	for i := range events {
		whole = whole && !t.reconstructed(&events[i])
	}
	for i := 0; whole && i < b[0].Seq; i++ {
		if e := &events[i]; e.Phase == snapshot.PhaseNone {
			set(e, snapshot.PhaseSetup)
		}
	}
	for k := range b {
		start, end := b[k].Seq, len(events)
		if k+1 < len(b) {
			end = b[k+1].Seq
		}
		it := events[start:end]
		first := slices.IndexFunc(it, func(e snapshot.Event) bool { return e.Phase != snapshot.PhaseNone })
		if first < 0 {
			continue
		}
		for i := range first {
			set(&it[i], snapshot.PhaseData)
		}
		zeroGradFrees(t, it)
		last := snapshot.PhaseNone
		for i := first; i < len(it); i++ {
			if it[i].Phase != snapshot.PhaseNone {
				last = it[i].Phase
			} else {
				set(&it[i], last)
			}
		}
	}
}

// zeroGradFrees finds zero_grad in one iteration's events where no region marked it: the frees of gradients
// after the optimizer's last allocation, through the optimizer's events (or those of no phase) that follow.
func zeroGradFrees(t *trace, it []snapshot.Event) {
	lastStep := -1
	for i := range it {
		switch e := &it[i]; {
		case e.Phase == snapshot.PhaseZeroGrad:
			return
		case e.Phase == snapshot.PhaseOptimizer && e.Action == snapshot.ActionAlloc:
			lastStep = i
		}
	}
	if lastStep < 0 {
		return
	}
	from := -1
	for i := lastStep + 1; i < len(it); i++ {
		e := &it[i]
		if e.Phase != snapshot.PhaseOptimizer && e.Phase != snapshot.PhaseNone {
			return
		}
		if from < 0 && e.Action == snapshot.ActionFreeRequested && e.Category == snapshot.CategoryGradient {
			from = i
		}
		if from >= 0 && !t.reconstructed(e) {
			e.Phase = snapshot.PhaseZeroGrad
		}
	}
}

// emitter writes the events in order, inferring phases and iterations as it goes.
type emitter struct {
	im     *importer
	events []snapshot.Event
	err    error // the budget ran out: no more events
	t0     int64 // time_us of the first entry: Event.Time counts from it

	iteration int32
	inferred  snapshot.Phase // from the stacks of the latest allocations
	phase     snapshot.Phase // the phase of the events being written
	regions   []region       // record_function regions that set the phase (Optimizer.step#...)
	stacks    []stackFacts   // by StackID
}

// region is an open record_function region that names a phase.
type region struct {
	name  string
	phase snapshot.Phase
}

func (em *emitter) add(e snapshot.Event) {
	if len(em.events) == cap(em.events) && em.reserve(2*cap(em.events)) != nil {
		return
	}
	em.events = append(em.events, e)
	em.events[len(em.events)-1].Seq = uint64(len(em.events) - 1)
}

// eventBytes is the size of an event in memory.
const eventBytes = int64(unsafe.Sizeof(snapshot.Event{}))

// reserve makes room for n events, counted in the budget; the old slice, if any, is alive while it is copied.
func (em *emitter) reserve(n int) error {
	if em.err == nil {
		em.err = em.im.mem.add(int64(n)*eventBytes, "building the events")
	}
	if em.err != nil {
		return em.err
	}
	old := cap(em.events)
	em.events = append(make([]snapshot.Event, 0, n), em.events...)
	em.im.mem.release(int64(old) * eventBytes)
	return nil
}

// setPhase writes a phase marker when the phase the next events carry changes.
func (em *emitter) setPhase(t int64, dev int16) {
	p := em.inferred
	if n := len(em.regions); n > 0 {
		p = em.regions[n-1].phase
	}
	if rp, ok := em.recordedPhase(); ok {
		p = rp
	}
	if p != em.phase {
		em.phase = p
		em.add(snapshot.Event{Time: t, Action: snapshot.ActionPhase, Device: dev, Phase: p, Iteration: em.iteration})
	}
}

// trace writes the trace entries of every device and the annotations: merged by time_us when every entry
// has one, else device after device in recorded order with Event.Time the entry's index (from 1).
func (em *emitter) trace() {
	im := em.im
	annots := im.annots
	slices.SortStableFunc(annots, func(a, b annotation) int { return cmp.Compare(a.time, b.time) })
	if im.timeKnown {
		em.t0 = math.MaxInt64
		for _, t := range im.traces {
			if len(t) > 0 {
				em.t0 = min(em.t0, t[0].time)
			}
		}
		if len(annots) > 0 {
			em.t0 = min(em.t0, annots[0].time)
		}
	}
	// The next entry is the earliest by time over all devices (device order breaks ties), kept in a heap of
	// each device's next entry; time_us that steps back on a device is held at the device's latest. Without
	// times, devices follow each other in order.
	var next devHeap
	cursor := make([]int, len(im.traces))
	for d, tr := range im.traces {
		if len(tr) > 0 {
			t := int64(0)
			if im.timeKnown {
				t = tr[0].time
			}
			next = append(next, devKey{t, d})
		}
	}
	heap.Init(&next)
	ai := 0
	index := int64(0)
	for em.err == nil {
		dev, t := -1, int64(0)
		if len(next) > 0 {
			dev, t = next[0].dev, next[0].time
		}
		// Annotations go before entries of their time (after, for an END), and after all entries when the
		// entries have no time.
		if ai < len(annots) && (dev < 0 || im.timeKnown && (annots[ai].time < t || annots[ai].time == t && annots[ai].start)) {
			a := annots[ai]
			ai++
			at := em.nanos(a.time)
			if !im.timeKnown {
				at = index
			}
			em.annotation(a, at)
			continue
		}
		if dev < 0 {
			for d := range im.traces {
				em.applyRecorded(d, len(im.traces[d]), em.nanos(math.MaxInt64))
			}
			return
		}
		tr := im.traces[dev]
		at := cursor[dev]
		e := &tr[at]
		cursor[dev]++
		if cursor[dev] < len(tr) {
			nt := t
			if im.timeKnown {
				nt = max(tr[cursor[dev]].time, t)
			}
			next[0].time = nt
			heap.Fix(&next, 0)
		} else {
			heap.Pop(&next)
		}
		index++
		et := index
		if im.timeKnown {
			et = em.nanos(t)
		}
		em.applyRecorded(dev, at, et)
		em.entry(e, int16(dev), et)
		if e.act == snapshot.ActionAlloc && im.rec != nil {
			last := &em.events[len(em.events)-1]
			last.Label = im.recordedLabel(dev, at)
			if last.Scope == 0 {
				last.Scope = em.recordedScope()
			}
		}
	}
}

// devKey is a device's next trace entry in the merge: its time, then the device ordinal.
type devKey struct {
	time int64
	dev  int
}

// devHeap is a min-heap of devKeys (container/heap).
type devHeap []devKey

func (h devHeap) Len() int { return len(h) }
func (h devHeap) Less(i, j int) bool {
	return h[i].time < h[j].time || h[i].time == h[j].time && h[i].dev < h[j].dev
}
func (h devHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *devHeap) Push(x any)   { *h = append(*h, x.(devKey)) }
func (h *devHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// nanos converts time_us to nanoseconds since the first entry, saturating on absurd values.
func (em *emitter) nanos(us int64) int64 {
	if us <= em.t0 {
		return 0
	}
	d := uint64(us) - uint64(em.t0) // exact: the difference of two int64s fits a uint64
	if d > math.MaxInt64/1000 {
		return math.MaxInt64 / 1000 * 1000
	}
	return int64(d) * 1000
}

// entry writes one trace entry.
func (em *emitter) entry(e *entry, dev int16, t int64) {
	switch e.act {
	case snapshot.ActionAlloc, snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap, snapshot.ActionOOM:
		// Allocation stacks tell the phase; a free's stack is often its allocation's, so it does not.
		if p, ok := em.stacks[e.stack].phase.phase(); ok {
			em.inferred = p
		}
		em.setPhase(t, dev)
	}
	ev := snapshot.Event{Time: t, Action: e.act, Device: dev, Stream: e.stream, Addr: e.addr, Size: e.size,
		BlockSize: e.block, Stack: e.stack, Scope: e.scope, Category: e.cat, Text: e.text,
		Phase: em.phase, Iteration: em.iteration}
	if e.act == snapshot.ActionOOM {
		ev.DeviceFree = e.extra
	}
	em.add(ev)
}

// annotation writes a record_function region boundary: ProfilerStep#N starts iteration N, Optimizer.step#...
// and Optimizer.zero_grad#... are the optimizer and zero_grad phases, and every other name is an annotation
// whose Label is the stage, "START" or "END".
func (em *emitter) annotation(a annotation, t int64) {
	if n, ok := strings.CutPrefix(a.name, "ProfilerStep#"); ok && !em.recordedIterations() {
		if it, err := strconv.ParseInt(n, 10, 32); err == nil && it >= 0 {
			if a.start {
				em.iteration = int32(it)
				em.add(snapshot.Event{Time: t, Action: snapshot.ActionIteration, Device: a.device, Phase: em.phase, Iteration: em.iteration})
				em.inferred, em.regions = snapshot.PhaseNone, em.regions[:0]
				em.setPhase(t, a.device)
			}
			return
		}
	}
	phase, named := snapshot.PhaseNone, false
	switch {
	case strings.HasPrefix(a.name, "Optimizer.step#"):
		phase, named = snapshot.PhaseOptimizer, true
	case strings.HasPrefix(a.name, "Optimizer.zero_grad#"):
		phase, named = snapshot.PhaseZeroGrad, true
	}
	if named {
		if a.start {
			em.regions = append(em.regions, region{a.name, phase})
		} else {
			for i := len(em.regions) - 1; i >= 0; i-- {
				if em.regions[i].name == a.name {
					em.regions = slices.Delete(em.regions, i, i+1)
					break
				}
			}
			em.inferred = snapshot.PhaseNone // the step is over; the next allocations say what comes
		}
		em.setPhase(t, a.device)
		return
	}
	stage := "END"
	if a.start {
		stage = "START"
	}
	em.add(snapshot.Event{Time: t, Action: snapshot.ActionAnnotation, Device: a.device, Text: em.im.tab.str(a.name),
		Label: em.im.tab.str(stage), Phase: em.phase, Iteration: em.iteration})
}

// summarize counts the events and finds the peaks, as the recorder does: a block counts as allocated from its
// alloc until its free is requested (PyTorch's allocated_bytes), and segments are reserved from segment_alloc
// (or segment_map) to segment_free (or segment_unmap). Sums run over all devices.
func summarize(events []snapshot.Event) snapshot.Summary {
	var counts [snapshot.NumActions]uint64
	var s snapshot.Summary
	var allocated, reserved int64
	for i := range events {
		e := &events[i]
		counts[e.Action]++
		s.EndTime = e.Time
		switch e.Action {
		case snapshot.ActionAlloc:
			allocated += e.BlockSize
			if allocated > s.PeakAllocated {
				s.PeakAllocated, s.PeakAllocatedSeq = allocated, uint64(i)
			}
		case snapshot.ActionFreeRequested:
			allocated -= e.BlockSize
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			reserved += e.Size
			s.PeakReserved = max(s.PeakReserved, reserved)
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			reserved -= e.Size
		}
	}
	s.Events = uint64(len(events))
	s.ByAction = make(map[string]uint64)
	for a, n := range counts {
		if n > 0 {
			s.ByAction[snapshot.Action(a).String()] = n
		}
	}
	return s
}
