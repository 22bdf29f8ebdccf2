package replay

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// Count is how many of Total comparisons matched.
type Count struct {
	Matched int `json:"matched"`
	Total   int `json:"total"`
}

func (c *Count) add(ok bool) {
	c.Total++
	if ok {
		c.Matched++
	}
}

// Percent returns the matched share in percent (100 when there was nothing to compare).
func (c Count) Percent() float64 {
	if c.Total == 0 {
		return 100
	}
	return 100 * float64(c.Matched) / float64(c.Total)
}

// Mismatch is one place where the model did not do what the recording did.
type Mismatch struct {
	Seq  uint64 `json:"seq"`  // the recorded event
	What string `json:"what"` // what differed, in a sentence
}

// maxMismatches bounds the mismatches a report keeps; the counts stay exact.
const maxMismatches = 20

// Fidelity is how closely the allocator model reproduces one device's recording under the recorded settings.
type Fidelity struct {
	Device int `json:"device"`
	// NewSegments compares, for each segment the recording created for an allocation, the size of the one the
	// model created for it.
	NewSegments Count `json:"new_segments"`
	// ExtraSegments counts segments the model created where the recording reused a cached block.
	ExtraSegments int `json:"extra_segments"`
	// ReusedInTrace compares the addresses (as offsets in their segments) of allocations the recording served
	// from cached blocks of segments created during the trace; ReusedPreExisting the same inside segments
	// from before the trace that were rebuilt.
	ReusedInTrace     Count `json:"reused_in_trace"`
	ReusedPreExisting Count `json:"reused_pre_existing"`
	// Unknown counts allocations the recording served from memory the replay could not rebuild (a segment
	// from before the trace whose layout is not certain): not replayed, not compared.
	Unknown int `json:"unknown"`
	// Releases compares the segments released by each run of segment_free with those the model releases;
	// ExtraReleases counts segments the model released and the recording kept.
	Releases      Count `json:"releases"`
	ExtraReleases int   `json:"extra_releases"`
	// BlockSizes compares the block size the model hands out with the snapshot's (which the importer computed,
	// for a PyTorch trace).
	BlockSizes Count `json:"block_sizes"`
	// PreExistingSegments counts the segments alive before the trace; Rebuilt those rebuilt in the model;
	// NotRebuilt says, for the others, why not.
	PreExistingSegments int            `json:"pre_existing_segments"`
	Rebuilt             int            `json:"rebuilt"`
	NotRebuilt          map[string]int `json:"not_rebuilt,omitempty"`
	PreExistingBlocks   int            `json:"pre_existing_blocks"`
	// Inferred counts the blocks from before the trace, in the segments rebuilt, whose sizes were inferred
	// (Sizing says how): blocks the trace frees, which the final state therefore does not hold.
	Inferred Sizing `json:"inferred_block_sizes"`
	// FinalState compares each segment of the snapshot's final state the model knows with the model's own
	// at the end: the same size and the same blocks (offset, size, state).
	FinalState Count `json:"final_state"`
	// Untracked counts allocations in memory the replay does not follow: the pages of expandable segments
	// (whose addresses the model reserves for itself), or an address outside every segment known. They are
	// not replayed.
	Untracked int `json:"untracked,omitempty"`
	// OOMs counts the recorded out-of-memory errors (the replay device never runs out).
	OOMs       int        `json:"ooms,omitempty"`
	Mismatches []Mismatch `json:"mismatches,omitempty"`
}

func (f *Fidelity) mismatch(seq uint64, format string, args ...any) {
	if len(f.Mismatches) < maxMismatches {
		f.Mismatches = append(f.Mismatches, Mismatch{Seq: seq, What: fmt.Sprintf(format, args...)})
	}
}

// Settings is the allocator configuration a replay ran under.
type Settings struct {
	// Conf is the settings string (PYTORCH_CUDA_ALLOC_CONF form); "" is PyTorch's defaults.
	Conf string `json:"conf"`
	// Assumed says the snapshot did not record its settings (PyTorch before about 2.4), so the recorded
	// settings are taken to be PyTorch's defaults; Note says why else they may be.
	Assumed bool   `json:"assumed,omitempty"`
	Note    string `json:"note,omitempty"`
}

// RecordedSettings returns the allocator settings a snapshot was recorded with, as an allocator.Config.
func RecordedSettings(s *snapshot.Snapshot) (allocator.Config, Settings) {
	st := Settings{Conf: s.Meta.AllocatorSettings}
	if o, ok := torch.OriginOf(s); ok && !o.SettingsKnown {
		st.Assumed = true
		st.Note = "not in the snapshot (PyTorch before 2.4), PyTorch's defaults assumed"
	}
	cfg, err := allocator.ParseConfig(s.Meta.AllocatorSettings)
	if err != nil {
		st.Assumed = true
		st.Note = fmt.Sprintf("%q does not parse (%v), PyTorch's defaults assumed", s.Meta.AllocatorSettings, err)
		return allocator.Config{}, st
	}
	return cfg, st
}

// ErrNoTrace means a snapshot holds no allocator events to replay (a state-only snapshot).
var ErrNoTrace = errors.New("the snapshot holds no allocation trace to replay (only the allocator state)")

// CheckFidelity replays every device's trace under the recorded settings and compares the model with the
// recording, device by device.
func CheckFidelity(s *snapshot.Snapshot) ([]Fidelity, Settings, error) {
	cfg, st := RecordedSettings(s)
	var out []Fidelity
	for _, t := range splitDevices(s) {
		if len(t.seqs) == 0 {
			continue
		}
		f, err := t.fidelity(cfg)
		if err != nil {
			return nil, st, err
		}
		out = append(out, f)
	}
	if len(out) == 0 {
		return nil, st, ErrNoTrace
	}
	return out, st, nil
}

// segMap relates recorded segments to the model's: recorded base -> model base, with the recorded ranges
// ordered for lookups by address.
type segMap struct {
	segs   map[uint64]mapped // by recorded base
	ranges spanSet           // recorded segments the model mirrors
}

type mapped struct {
	model   uint64 // the model's base
	inTrace bool   // made during the trace, not rebuilt from before it
}

func newSegMap(capacity int) segMap {
	return segMap{segs: make(map[uint64]mapped, capacity), ranges: newSpanSet(capacity)}
}

func (m *segMap) add(rec span, model uint64, inTrace bool) {
	m.segs[rec.addr] = mapped{model, inTrace}
	m.ranges.add(rec)
}

func (m *segMap) remove(addr uint64) bool {
	if !m.ranges.remove(addr) {
		return false
	}
	delete(m.segs, addr)
	return true
}

// find returns the recorded segment holding addr.
func (m *segMap) find(addr uint64) (span, bool) { return m.ranges.holding(addr) }

// fidelity replays one device.
func (t *deviceTrace) fidelity(cfg allocator.Config) (Fidelity, error) {
	f := Fidelity{Device: t.dev, PreExistingSegments: len(t.preSegs), PreExistingBlocks: len(t.preBlocks)}
	dev := newTraceDevice(t.dev, t.maxAddr)
	a := allocator.New(dev, allocator.Config{TieOrder: cfg.TieOrder})
	plans, unknown, inferred := t.plan(cfg)
	f.Inferred = inferred
	if err := build(a, dev, plans); err != nil {
		return f, err
	}
	a.SetConfig(cfg)
	obs := &recorder{}
	a.SetObserver(obs)

	m := newSegMap(len(plans))
	model := newSegMap(len(plans))                    // the model's segments, by its addresses
	live := make(map[uint64]uint64, len(t.preBlocks)) // recorded block -> model block
	unknownSegs := newSpanSet(len(unknown))
	for _, p := range plans {
		m.add(span{p.seg.addr, p.seg.size}, p.seg.addr, false)
		model.add(span{p.seg.addr, p.seg.size}, p.seg.addr, false)
		for _, tl := range p.tiles {
			if tl.inUse {
				live[tl.addr] = tl.addr
			}
		}
	}
	f.Rebuilt = len(plans)
	for _, seg := range t.preSegs {
		if why, ok := unknown[seg.addr]; ok {
			if f.NotRebuilt == nil {
				f.NotRebuilt = map[string]int{}
			}
			f.NotRebuilt[why]++
			unknownSegs.add(span{seg.addr, seg.size})
		}
	}
	inUnknown := func(addr uint64) bool {
		_, ok := unknownSegs.holding(addr)
		return ok
	}

	var pending *snapshot.Event // the segment_alloc just recorded, waiting for its alloc
	// The model segments released by the current run of segment_free, in the order released, and those of
	// them the recording has not released yet.
	var released []uint64
	unmatched := map[uint64]bool{}
	deferred := newDeferredFrees(a)
	for _, ev := range t.events() {
		e := &ev
		if err := deferred.next(a, e.Action, e.Addr, live); err != nil {
			return f, fmt.Errorf("replay: event %d: %w", e.Seq, err)
		}
		if e.Action != snapshot.ActionSegmentFree && released != nil {
			for _, addr := range released {
				if unmatched[addr] {
					f.ExtraReleases++
					f.mismatch(e.Seq, "the model released the segment at %#x, which the recording kept", addr)
					model.remove(addr)
				}
			}
			released = nil
			clear(unmatched)
		}
		switch e.Action {
		case snapshot.ActionSegmentAlloc:
			p := *e
			pending = &p
			dev.hint = e.Addr
			continue
		case snapshot.ActionAlloc:
			f.alloc(a, e, pending, obs, &m, &model, live, inUnknown)
		case snapshot.ActionFreeCompleted:
			// A block the replay did not make (in memory it does not follow) has nothing to free.
			if deferred.completed(a, e.Addr) {
				break
			}
			if addr, ok := live[e.Addr]; ok {
				delete(live, e.Addr)
				if err := a.Free(addr); err != nil {
					return f, fmt.Errorf("replay: event %d: %w", e.Seq, err)
				}
			}
		case snapshot.ActionSegmentFree:
			if released == nil {
				obs.reset()
				if err := a.EmptyCache(); err != nil {
					return f, fmt.Errorf("replay: event %d: %w", e.Seq, err)
				}
				released = make([]uint64, 0, len(obs.segFrees))
				for _, s := range obs.segFrees {
					released = append(released, s.addr)
					unmatched[s.addr] = true
				}
			}
			rec, known := m.find(e.Addr)
			if !known || rec.addr != e.Addr {
				unknownSegs.remove(e.Addr)
				continue
			}
			want := m.segs[e.Addr].model
			f.Releases.add(unmatched[want])
			if unmatched[want] {
				delete(unmatched, want)
				model.remove(want)
			} else {
				f.mismatch(e.Seq, "the recording released the segment at %#x; the model kept it", e.Addr)
			}
			m.remove(e.Addr)
		case snapshot.ActionOOM:
			f.OOMs++
		}
		pending = nil
		dev.hint = 0
	}
	if err := deferred.end(a, live); err != nil {
		return f, fmt.Errorf("replay: %w", err)
	}
	for _, addr := range released {
		if unmatched[addr] {
			f.ExtraReleases++
			f.mismatch(0, "the model released the segment at %#x, which the recording kept", addr)
		}
	}
	f.compareFinal(t, a, &m)
	return f, nil
}

// alloc replays one recorded allocation and compares where the model put it.
func (f *Fidelity) alloc(a *allocator.Allocator, e *snapshot.Event, pending *snapshot.Event, obs *recorder,
	m, model *segMap, live map[uint64]uint64, inUnknown func(uint64) bool) {
	fresh := pending != nil && pending.Addr == e.Addr
	rec, known := m.find(e.Addr)
	if !fresh && !known {
		// Served from memory the replay does not have (a segment from before the trace not rebuilt, or an
		// expandable segment's mapped pages).
		if inUnknown(e.Addr) {
			f.Unknown++
		} else {
			f.Untracked++
		}
		return
	}
	obs.reset()
	maddr, err := a.Malloc(uint64(max(e.Size, 0)), e.Stream)
	if err != nil {
		f.mismatch(e.Seq, "the model failed the allocation: %v", err)
		return
	}
	live[e.Addr] = maddr
	f.BlockSizes.add(int64(obs.block) == e.BlockSize)
	if int64(obs.block) != e.BlockSize {
		f.mismatch(e.Seq, "block of %d bytes in the model, %d by the importer", obs.block, e.BlockSize)
	}
	for _, s := range obs.segAllocs {
		model.add(s, s.addr, true)
	}
	if fresh {
		ok := len(obs.segAllocs) == 1 && int64(obs.segAllocs[0].size) == pending.Size
		f.NewSegments.add(ok)
		if !ok {
			f.mismatch(e.Seq, "the recording created a segment of %d bytes; the model %v", pending.Size, obs.segAllocs)
			if len(obs.segAllocs) == 0 {
				// The model served it from its cache: relate the recorded segment to wherever that block is.
				if ms, ok := model.find(maddr); ok {
					m.add(span{pending.Addr, uint64(pending.Size)}, ms.addr, true)
				}
				return
			}
		}
		m.add(span{pending.Addr, uint64(pending.Size)}, obs.segAllocs[0].addr, true)
		if maddr != obs.segAllocs[0].addr {
			f.mismatch(e.Seq, "the model put the allocation at %#x, not at the base of its new segment", maddr)
		}
		return
	}
	if len(obs.segAllocs) > 0 {
		f.ExtraSegments++
		f.mismatch(e.Seq, "the model created a segment of %d bytes; the recording reused a block at %#x", obs.segAllocs[0].size, e.Addr)
	}
	ms, ok := model.find(maddr)
	same := ok && m.segs[rec.addr].model == ms.addr && maddr-ms.addr == e.Addr-rec.addr
	if m.segs[rec.addr].inTrace {
		f.ReusedInTrace.add(same)
	} else {
		f.ReusedPreExisting.add(same)
	}
	if !same {
		f.mismatch(e.Seq, "the recording reused %#x (offset %#x in the segment at %#x); the model chose %#x",
			e.Addr, e.Addr-rec.addr, rec.addr, maddr)
	}
}

// compareFinal compares the final state the snapshot holds with the model's, segment by segment.
func (f *Fidelity) compareFinal(t *deviceTrace, a *allocator.Allocator, m *segMap) {
	all := a.Segments() // by address
	for _, want := range t.final {
		mp, ok := m.segs[want.Addr]
		base := mp.model
		if !ok || want.Expandable {
			continue
		}
		i, ok := slices.BinarySearchFunc(all, base, func(s allocator.Segment, addr uint64) int { return cmp.Compare(s.Addr, addr) })
		var s allocator.Segment
		if ok {
			s = all[i]
		}
		same := ok && int64(s.Size) == want.Size && len(s.Blocks) == len(want.Blocks)
		for i := 0; same && i < len(s.Blocks); i++ {
			mb, wb := s.Blocks[i], want.Blocks[i]
			same = mb.Addr-base == wb.Addr-want.Addr && int64(mb.Size) == wb.Size && mb.State == wb.State
		}
		f.FinalState.add(same)
		if !same {
			f.mismatch(0, "at the end, the segment at %#x differs from the snapshot's", want.Addr)
		}
	}
}

// recorder is the observer of a replay: what the allocator did during one call.
type recorder struct {
	segAllocs []span
	segFrees  []span
	block     uint64
}

func (r *recorder) reset() {
	r.segAllocs, r.segFrees, r.block = r.segAllocs[:0], r.segFrees[:0], 0
}

func (r *recorder) Alloc(device int, stream int64, addr, requested, block uint64) { r.block = block }
func (r *recorder) FreeRequested(int, int64, uint64, uint64, uint64)              {}
func (r *recorder) FreeCompleted(int, int64, uint64, uint64, uint64)              {}
func (r *recorder) SegmentAlloc(device int, stream int64, addr, size uint64) {
	r.segAllocs = append(r.segAllocs, span{addr, size})
}
func (r *recorder) SegmentFree(device int, stream int64, addr, size uint64) {
	r.segFrees = append(r.segFrees, span{addr, size})
}
func (r *recorder) SegmentMap(int, int64, uint64, uint64)   {}
func (r *recorder) SegmentUnmap(int, int64, uint64, uint64) {}
func (r *recorder) OOM(int, int64, uint64, uint64, uint64)  {}
