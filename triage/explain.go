package triage

import (
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// reportFrames is how many frames of a stack the report keeps.
const reportFrames = 6

// peak is the peak of the device d of the snapshot whole: its events are numbered in whole.
func peak(whole *snapshot.Snapshot, d *onDevice, top int) Peak {
	tl := d.tl
	s := tl.Snapshot()
	pa, pr := tl.Peak(timeline.Allocated), tl.Peak(timeline.Reserved)
	p := Peak{Device: d.index, Devices: max(len(whole.DevicesWithMemory()), 1), Allocated: pa.Bytes, Event: d.whole(pa.Seq),
		Reserved: pr.Bytes, ReservedEvent: d.whole(pr.Seq), Phase: snapshot.PhaseNone.String()}
	if pa.Seq >= 0 {
		e := s.Events.At(pa.Seq)
		p.Time, p.Phase, p.Iteration = e.Time, e.Phase.String(), e.Iteration
	}
	p.Alive = alive(s, tl.LiveAt(pa.Seq, nil), top)
	return p
}

// oom explains the snapshot's first out-of-memory error with its own device's memory.
func oom(tl *timeline.Timeline, top int) *OOM {
	ooms := tl.OOMs()
	if len(ooms) == 0 {
		return nil
	}
	d, err := deviceOf(tl, int(tl.Snapshot().Events.At(ooms[0]).Device))
	if err != nil {
		return nil
	}
	return oomOn(tl, d, top)
}

// oomOn explains the snapshot's first out-of-memory error, which is on device d when it has one: the
// allocated and reserved memory, the free blocks and what was alive are d's, its events numbered in the
// whole snapshot tl indexes.
func oomOn(tl *timeline.Timeline, d *onDevice, top int) *OOM {
	ooms := tl.OOMs()
	if len(ooms) == 0 {
		return nil
	}
	if dev := int(tl.Snapshot().Events.At(ooms[0]).Device); dev != d.index {
		var err error
		if d, err = deviceOf(tl, dev); err != nil {
			return nil
		}
	}
	dtl, seq := d.tl, d.local(ooms[0])
	s := dtl.Snapshot()
	e := s.Events.At(seq)
	o := &OOM{
		Device: d.index, Event: seq, Phase: e.Phase.String(), Iteration: e.Iteration,
		Requested: e.Size, AllocSize: e.BlockSize, Free: e.DeviceFree,
		Label: s.String(e.Label), Scope: s.String(e.Scope), Stack: frames(s, e.Stack),
		Allocated: dtl.Allocated(seq), Reserved: dtl.Reserved(seq),
	}
	if o.AllocSize <= 0 {
		o.AllocSize = o.Requested
	}
	o.Message, o.Exact = oomMessage(s.Meta, &e, o.AllocSize, o.Allocated, o.Reserved)
	oomFragmentation(dtl, o, e.Device, e.Stream)
	o.Alive = alive(s, dtl.LiveAt(seq, nil), top)
	o.Event = d.whole(seq)
	return o
}

// alive describes the blocks of a live set.
func alive(s *snapshot.Snapshot, live []timeline.Allocation, top int) Alive {
	a := Alive{ByCategory: categoryMap(timeline.CategoryBytes(live)), ByScope: []Share{}, ByStack: []StackShare{}, Top: []Allocation{}}
	for _, g := range head(timeline.GroupBlocks(live, timeline.ByScope), top) {
		a.ByScope = append(a.ByScope, Share{Name: timeline.GroupName(s, timeline.ByScope, g.Key), Bytes: g.Bytes, Count: g.Count})
	}
	for _, g := range head(timeline.GroupBlocks(live, timeline.ByStack), top) {
		a.ByStack = append(a.ByStack, StackShare{Frames: frames(s, snapshot.StackID(g.Key)), Bytes: g.Bytes, Count: g.Count})
	}
	largest := make([]timeline.Allocation, len(live))
	copy(largest, live)
	sortLargest(largest)
	for _, b := range head(largest, top) {
		a.Top = append(a.Top, allocation(s, &b))
	}
	return a
}

func allocation(s *snapshot.Snapshot, b *timeline.Allocation) Allocation {
	return Allocation{
		Event: b.Alloc, Bytes: b.Size, Requested: b.Requested, Category: b.Category.String(),
		Scope: timeline.GroupName(s, timeline.ByScope, int64(b.Scope)), Label: s.String(b.Label), Phase: b.Phase.String(),
		Iteration: b.Iteration, Stack: frames(s, b.Stack),
	}
}

// allScopes is every scope of a live set, largest first.
func allScopes(s *snapshot.Snapshot, live []timeline.Allocation) []Share {
	var out []Share
	for _, g := range timeline.GroupBlocks(live, timeline.ByScope) {
		out = append(out, Share{Name: timeline.GroupName(s, timeline.ByScope, g.Key), Bytes: g.Bytes, Count: g.Count})
	}
	return out
}

// frames returns the user frames of a stack as "function file:line".
func frames(s *snapshot.Snapshot, id snapshot.StackID) []string {
	out := []string{}
	for _, f := range s.UserFrames(id, reportFrames) {
		out = append(out, s.FrameString(f))
	}
	return out
}

// gaps is the memory of device d that no tensor uses.
func gaps(d *onDevice, r *Report) Gaps {
	tl := d.tl
	g := Gaps{Device: d.index}
	for _, dev := range r.Devices {
		if dev.Index == d.index {
			g.ContextReserve = dev.ContextReserve
		}
	}
	if p := tl.Peak(timeline.Allocated); p.Seq >= 0 {
		g.ReservedUnallocatedAtPeak = max(0, tl.Reserved(p.Seq)-p.Bytes)
	}
	if n := tl.Len(); n > 0 {
		g.ReservedUnallocatedAtEnd = max(0, tl.Reserved(n-1)-tl.Allocated(n-1))
	}
	if r.OOM != nil {
		v := max(0, r.OOM.Reserved-r.OOM.Allocated)
		g.ReservedUnallocatedAtOOM = &v
	}
	return g
}

// iterations is the breakdown of every phase of every iteration. Checkpointing interleaves recompute spans
// with backward: the backward phase covers them all (as the allocator's statistics of the phase do), and a
// recompute entry after it sums up the recompute spans.
func iterations(d *onDevice) []Iteration {
	out := iterationsOf(d.tl)
	if d.seqs == nil {
		return out
	}
	end := func(e int) int { return d.whole(e-1) + 1 } // one past the last
	for i := range out {
		it := &out[i]
		it.StartEvent, it.EndEvent = d.whole(it.StartEvent), end(it.EndEvent)
		for j := range it.Phases {
			p := &it.Phases[j]
			p.StartEvent, p.EndEvent, p.PeakEvent = d.whole(p.StartEvent), end(p.EndEvent), d.whole(p.PeakEvent)
		}
	}
	return out
}

// iterationsOf is iterations of one timeline, its events numbered in it.
func iterationsOf(tl *timeline.Timeline) []Iteration {
	out := []Iteration{}
	var it *Iteration
	backward, recompute := -1, -1 // indices in it.Phases of the open backward phase and its recompute summary
	var before [snapshot.NumCategories]int64
	var rcDelta [snapshot.NumCategories]int64
	for _, p := range tl.Phases() {
		if it == nil || it.Iteration != p.Iteration {
			out = append(out, Iteration{Iteration: p.Iteration, StartEvent: p.Start})
			it = &out[len(out)-1]
			backward, recompute = -1, -1
		}
		pk := tl.PeakIn(timeline.Allocated, p.Start, p.End)
		ph := Phase{
			Name: p.Phase.String(), StartEvent: p.Start, EndEvent: p.End, PeakAllocated: pk.Bytes, PeakEvent: pk.Seq,
			EndAllocated: tl.Allocated(p.End - 1), EndByCategory: categoryMap(p.After), DeltaByCategory: deltas(p.After, p.Before),
		}
		it.EndEvent, it.EndAllocated = p.End, ph.EndAllocated
		it.PeakAllocated = max(it.PeakAllocated, ph.PeakAllocated)
		inBackward := backward >= 0 && (p.Phase == snapshot.PhaseRecompute || p.Phase == snapshot.PhaseBackward && recompute >= 0)
		if !inBackward {
			if p.Phase == snapshot.PhaseBackward {
				backward, recompute, before = len(it.Phases), -1, p.Before
			} else {
				backward, recompute = -1, -1
			}
			it.Phases = append(it.Phases, ph)
			continue
		}
		bw := &it.Phases[backward]
		if ph.PeakAllocated > bw.PeakAllocated {
			bw.PeakAllocated, bw.PeakEvent = ph.PeakAllocated, ph.PeakEvent
		}
		bw.EndEvent, bw.EndAllocated, bw.EndByCategory, bw.DeltaByCategory = ph.EndEvent, ph.EndAllocated, ph.EndByCategory, deltas(p.After, before)
		if p.Phase != snapshot.PhaseRecompute {
			continue
		}
		if recompute < 0 {
			recompute, rcDelta = len(it.Phases), [snapshot.NumCategories]int64{}
			it.Phases = append(it.Phases, ph)
		}
		rc := &it.Phases[recompute]
		if ph.PeakAllocated > rc.PeakAllocated {
			rc.PeakAllocated, rc.PeakEvent = ph.PeakAllocated, ph.PeakEvent
		}
		for c := range rcDelta {
			rcDelta[c] += p.After[c] - p.Before[c]
		}
		rc.EndEvent, rc.EndAllocated, rc.EndByCategory = ph.EndEvent, ph.EndAllocated, ph.EndByCategory
		rc.DeltaByCategory = categoryMap(rcDelta)
	}
	return out
}

// deltas names the change of every category's bytes.
func deltas(after, before [snapshot.NumCategories]int64) map[string]int64 {
	var d [snapshot.NumCategories]int64
	for c := range d {
		d[c] = after[c] - before[c]
	}
	return categoryMap(d)
}

// categoryMap names every category's bytes.
func categoryMap(by [snapshot.NumCategories]int64) map[string]int64 {
	m := make(map[string]int64, snapshot.NumCategories)
	for c, n := range by {
		m[snapshot.Category(c).String()] = n
	}
	return m
}

func head[T any](s []T, n int) []T {
	if len(s) > n {
		return s[:n]
	}
	return s
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

func joinComma(parts []string) string {
	var kept []string
	for _, p := range parts {
		if p != "" {
			kept = append(kept, p)
		}
	}
	return strings.Join(kept, ", ")
}
