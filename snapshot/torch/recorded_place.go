package torch

import (
	"cmp"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// The placement of what oomdbg record wrote (recorded.go reads it): each tag and mark put on the trace entry
// it names, by counts or by time, and applied as the events are emitted.

// deviceIndex is what placement reads of one device's trace: where its n-th alloc and n-th free request are,
// and its times (held at their running maximum, as the merge holds them).
type deviceIndex struct {
	entries []entry
	allocs  []int // entry index of each alloc, in order
	frees   []int // entry index of each free_requested
	times   []int64
	base    [2]int64 // the counts before the trace's first entry; ok false when unknown
	based   bool
}

func (im *importer) indexDevice(dev int) deviceIndex {
	tr := im.traces[dev]
	x := deviceIndex{entries: tr}
	var t int64
	for i := range tr {
		switch tr[i].act {
		case snapshot.ActionAlloc:
			x.allocs = append(x.allocs, i)
		case snapshot.ActionFreeRequested:
			x.frees = append(x.frees, i)
		}
		if im.timeKnown {
			t = max(t, tr[i].time)
			x.times = append(x.times, t)
		}
	}
	if c, ok := im.rec.counts[int16(dev)]; ok {
		x.base = [2]int64{c[0] - int64(len(x.allocs)), c[1] - int64(len(x.frees))}
		x.based = x.base[0] >= 0 && x.base[1] >= 0
	}
	return x
}

// byCounts places a point by the allocator's counts: before the first entry after its allocs-th alloc and
// frees-th free request of the trace (and the free completions that follow them at once). ok is false
// when the counts do not fit the trace.
func (x *deviceIndex) byCounts(p recPoint) (int, bool) {
	if !x.based || p.allocs < 0 || p.frees < 0 {
		return 0, false
	}
	ka, kf := p.allocs-x.base[0], p.frees-x.base[1]
	if ka < 0 || kf < 0 {
		return 0, true // before the trace's window: the ring buffer dropped it
	}
	if ka > int64(len(x.allocs)) || kf > int64(len(x.frees)) {
		return 0, false
	}
	pos := 0
	if ka > 0 {
		pos = x.allocs[ka-1] + 1
	}
	if kf > 0 {
		pos = max(pos, x.frees[kf-1]+1)
	}
	if ka < int64(len(x.allocs)) && pos > x.allocs[ka] {
		return 0, false // the counts contradict each other
	}
	for pos < len(x.entries) && x.entries[pos].act == snapshot.ActionFreeCompleted {
		pos++
	}
	return pos, true
}

// byTime places a point by time: before the first entry at its time or later (after, for the end of a
// module's forward). ok is false when the trace has no times.
func (x *deviceIndex) byTime(t int64, after bool) (int, bool) {
	if x.times == nil && len(x.entries) > 0 {
		return 0, false
	}
	if after {
		return sort.Search(len(x.times), func(i int) bool { return x.times[i] > t }), true
	}
	return sort.Search(len(x.times), func(i int) bool { return x.times[i] >= t }), true
}

// placeRecorded places the recording's marks and tags in the trace, before the events are written.
func (im *importer) placeRecorded() {
	r := im.rec
	if r == nil {
		return
	}
	device := func(d int) *deviceIndex {
		if d < 0 || d >= len(im.traces) {
			return nil
		}
		return deviceIndexOf(im, d)
	}
	// A mark without a device (a module scope) is on the device of the latest mark that had one.
	current := int16(-1)
	for d := range im.traces {
		if len(im.traces[d]) > 0 {
			current = int16(d)
			break
		}
	}
	for i := range r.marks {
		m := &r.marks[i]
		if m.device >= 0 {
			current = m.device
		} else {
			m.device = current
		}
		x := device(int(m.device))
		if x == nil {
			continue
		}
		if pos, ok := x.byCounts(m.recPoint); ok {
			m.dev, m.pos = int(m.device), pos
			r.info.ByCounts++
		} else if pos, ok := x.byTime(m.time, m.kind == markExit); ok {
			m.dev, m.pos = int(m.device), pos
		}
		if m.pos >= 0 {
			r.info.Placed++
		}
	}
	im.matchTags(device)
	im.batchStarts()
	im.teardown()
	slices.SortStableFunc(r.marks, func(a, b recMark) int {
		if c := cmp.Compare(a.dev, b.dev); c != 0 {
			return c
		}
		return cmp.Compare(a.pos, b.pos)
	})
}

// tagRank orders the categories a block may be tagged with more than once: a weight passed as an input is
// still a weight.
func tagRank(c snapshot.Category) int {
	switch c {
	case snapshot.CategoryParameter:
		return 4
	case snapshot.CategoryOptimizerState:
		return 3
	case snapshot.CategoryGradient:
		return 2
	case snapshot.CategoryInput:
		return 1
	}
	return 0
}

// matchTags finds the block each tag was about: the one alive at the tag's moment whose memory holds its
// address, in the trace where it was allocated there, else in the final state. A tag inside a block (a
// view) costs a scan of the blocks alive then; scans stop after a budget linear in the input, so that no
// input makes the import quadratic.
func (im *importer) matchTags(device func(int) *deviceIndex) {
	r := im.rec
	r.entryTags = make(map[[2]int]tagResult)
	r.finalTags = make(map[blockKey]tagResult)
	type placed struct {
		tag int
		pos int
	}
	byDev := make(map[int][]placed)
	var atEnd []int
	budget := 64 * len(r.tags)
	for d := range im.traces {
		budget += 64 * len(im.traces[d])
	}
	for i := range r.tags {
		t := &r.tags[i]
		if t.device < 0 {
			atEnd = append(atEnd, i)
			continue
		}
		x := device(int(t.device))
		if x == nil {
			continue
		}
		pos, ok := x.byCounts(t.recPoint)
		if !ok {
			if pos, ok = x.byTime(t.time, true); !ok {
				continue
			}
		}
		t.pos = pos
		byDev[int(t.device)] = append(byDev[int(t.device)], placed{i, pos})
	}
	put := func(key [2]int, t *recTag) {
		if have, ok := r.entryTags[key]; !ok || tagRank(t.category) > tagRank(have.category) {
			r.entryTags[key] = tagResult{t.category, t.name}
		}
	}
	type span struct {
		addr, end uint64
		dev, i    int // the alloc entry, or i < 0 for a block of the final state
	}
	var alive []span // the blocks alive at the end: the trace's, then the final state's
	for d := range im.traces {
		tr := im.traces[d]
		ps := byDev[d]
		slices.SortStableFunc(ps, func(a, b placed) int { return cmp.Compare(a.pos, b.pos) })
		open := make(map[uint64]int)
		k := 0
		match := func(pos int) {
			for ; k < len(ps) && ps[k].pos <= pos; k++ {
				t := &r.tags[ps[k].tag]
				i, ok := open[t.addr]
				for _, j := range open { // a view inside a block: rare, so a scan, within the budget
					if ok || budget <= 0 {
						break
					}
					budget--
					if e := &tr[j]; t.addr > e.addr && t.addr < e.addr+uint64(max(e.size, e.block)) {
						i, ok = j, true
					}
				}
				if ok {
					put([2]int{d, i}, t)
					t.entry = i
					r.info.Matched++
				}
			}
		}
		for i := range tr {
			match(i)
			switch e := &tr[i]; e.act {
			case snapshot.ActionAlloc:
				open[e.addr] = i
			case snapshot.ActionFreeRequested:
				delete(open, e.addr)
			}
		}
		match(len(tr))
		for addr, i := range open {
			alive = append(alive, span{addr, addr + uint64(max(tr[i].size, tr[i].block, 1)), d, i})
		}
	}
	if len(atEnd) > 0 {
		for _, sg := range im.segs {
			for _, b := range sg.Blocks {
				if b.State != stateInactive {
					alive = append(alive, span{b.Addr, b.Addr + uint64(max(b.Size, 1)), sg.Device, -1})
				}
			}
		}
		// At one address the trace's block first: it is the final state's too, and carries the events.
		slices.SortStableFunc(alive, func(a, b span) int {
			if c := cmp.Compare(a.addr, b.addr); c != 0 {
				return c
			}
			return cmp.Compare(b.i, a.i)
		})
	}
	for _, ti := range atEnd {
		t := &r.tags[ti]
		j := sort.Search(len(alive), func(j int) bool { return alive[j].addr > t.addr }) - 1
		for j > 0 && alive[j-1].addr == alive[j].addr {
			j--
		}
		if j < 0 || t.addr >= alive[j].end {
			continue
		}
		sp := alive[j]
		if sp.i >= 0 {
			put([2]int{sp.dev, sp.i}, t)
		} else {
			key := blockKey{int16(sp.dev), sp.addr}
			if have, ok := r.finalTags[key]; !ok || tagRank(t.category) > tagRank(have.category) {
				r.finalTags[key] = tagResult{t.category, t.name}
			}
		}
		r.info.Matched++
	}
	for key, res := range r.entryTags {
		im.traces[key[0]][key[1]].cat = res.category
	}
}

// batchStarts moves the start of a training forward back to the allocation of the batch it received, and
// with it the iteration that forward began: the batch is loaded to the device before the forward, and no
// hook runs then. It moves back over the entries between only when no mark lies between them (but
// zero_grad's, which a loop calls anywhere around its batch) and no weight or optimizer state was allocated
// there; the entries moved over are the data phase.
func (im *importer) batchStarts() {
	r := im.rec
	var order []int // the placed marks but scopes, by device, position and file order
	for i := range r.marks {
		if m := &r.marks[i]; m.pos >= 0 && m.kind != markEnter && m.kind != markExit {
			order = append(order, i)
		}
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ma, mb := &r.marks[a], &r.marks[b]
		if c := cmp.Compare(ma.dev, mb.dev); c != 0 {
			return c
		}
		if c := cmp.Compare(ma.pos, mb.pos); c != 0 {
			return c
		}
		return cmp.Compare(ma.seq, mb.seq)
	})
	// The batch's tags by device and position; the weights allocated, counted up to each entry.
	inputs := make(map[int][]*recTag)
	for k := range r.tags {
		if t := &r.tags[k]; t.category == snapshot.CategoryInput && t.entry >= 0 && t.device >= 0 {
			inputs[int(t.device)] = append(inputs[int(t.device)], t)
		}
	}
	for _, ts := range inputs {
		slices.SortStableFunc(ts, func(a, b *recTag) int { return cmp.Compare(a.pos, b.pos) })
	}
	weights := make(map[int][]int32)
	for key, res := range r.entryTags {
		if res.category == snapshot.CategoryParameter || res.category == snapshot.CategoryOptimizerState {
			w := weights[key[0]]
			if w == nil {
				w = make([]int32, len(im.traces[key[0]])+1)
				weights[key[0]] = w
			}
			w[key[1]+1]++
		}
	}
	for _, w := range weights {
		for i := 1; i < len(w); i++ {
			w[i] += w[i-1]
		}
	}
	var added []recMark
	dev, floor, iter := -1, 0, -1 // the latest blocking mark's position, and an iteration mark after it
	for _, mi := range order {
		m := &r.marks[mi]
		if m.dev != dev {
			dev, floor, iter = m.dev, 0, -1
		}
		switch {
		case m.kind == markIteration:
			iter = mi
			continue
		case (m.kind == markPhase || m.kind == markEnd) && m.phase == snapshot.PhaseZeroGrad:
			continue
		case m.kind != markPhase || m.phase != snapshot.PhaseForward:
			floor, iter = m.pos, -1
			continue
		}
		// A forward: its batch was tagged as its mark was made, at the same counts.
		ts := inputs[dev]
		q := m.pos
		for k := sort.Search(len(ts), func(k int) bool { return ts[k].pos >= m.pos }); k < len(ts) && ts[k].pos == m.pos; k++ {
			q = min(q, ts[k].entry)
		}
		w := weights[dev]
		if q < m.pos && q >= floor && (w == nil || w[m.pos] == w[q]) {
			if iter >= 0 && r.marks[iter].pos == m.pos {
				r.marks[iter].pos = q
			}
			added = append(added, recMark{recPoint: m.recPoint, kind: markPhase, name: "data", phase: snapshot.PhaseData,
				iteration: m.iteration, seq: m.seq, dev: m.dev, pos: q})
		}
		floor, iter = m.pos, -1
	}
	// The data marks go right after the iteration marks moved to the same place: seq orders them.
	r.marks = append(r.marks, added...)
}

// teardown ends the last iteration of a dump written at exit where the program's teardown begins: after
// the recorder's last mark, a run of frees with no allocation among them is the job letting its model and
// optimizer go as it ends (the exit hook runs after that), not part of the last step. Those events are
// iteration -1, as setup's are, so that the last iteration ends where training did.
func (im *importer) teardown() {
	r := im.rec
	if r.info.Reason != "exit" {
		return
	}
	last := make(map[int]int)
	for i := range r.marks {
		if m := &r.marks[i]; m.pos >= 0 && m.kind != markEnter && m.kind != markExit {
			last[m.dev] = max(last[m.dev], m.pos)
		}
	}
	for dev, p := range last {
		tr := im.traces[dev]
		if p >= len(tr) || slices.ContainsFunc(tr[p:], func(e entry) bool { return e.act == snapshot.ActionAlloc }) {
			continue
		}
		r.marks = append(r.marks, recMark{kind: markIteration, name: "-1", iteration: -1, seq: len(r.marks), dev: dev, pos: p,
			recPoint: recPoint{device: int16(dev), allocs: -1, frees: -1}})
	}
}

// deviceIndexOf is indexDevice, built once per device.
func deviceIndexOf(im *importer, dev int) *deviceIndex {
	if im.rec.index == nil {
		im.rec.index = make(map[int]*deviceIndex)
	}
	if x, ok := im.rec.index[dev]; ok {
		return x
	}
	x := im.indexDevice(dev)
	im.rec.index[dev] = &x
	return &x
}

// ---- applying marks as the events are written ----

// applyRecorded applies the marks placed before entry pos of device dev (pos = the trace's length: after
// its last entry), at time t.
func (em *emitter) applyRecorded(dev, pos int, t int64) {
	r := em.im.rec
	if r == nil {
		return
	}
	for r.next < len(r.marks) {
		m := &r.marks[r.next]
		if m.pos < 0 {
			r.next++
			continue
		}
		if m.dev != dev || m.pos > pos {
			return
		}
		r.next++
		em.applyMark(m, t)
	}
}

func (em *emitter) applyMark(m *recMark, t int64) {
	r := em.im.rec
	dev := int16(m.dev)
	switch m.kind {
	case markIteration:
		em.iteration = m.iteration
		em.add(snapshot.Event{Time: t, Action: snapshot.ActionIteration, Device: dev, Phase: em.phase, Iteration: em.iteration})
	case markPhase:
		r.phase, r.phased = m.phase, true
		em.setPhase(t, dev)
	case markEnter:
		if len(r.scopes) < 4096 {
			r.scopes = append(r.scopes, em.im.tab.str(m.name))
		}
	case markExit:
		id := em.im.tab.str(m.name)
		for i := len(r.scopes) - 1; i >= 0; i-- {
			if r.scopes[i] == id {
				r.scopes = r.scopes[:i]
				break
			}
		}
	}
}

// recordedPhase returns the phase the recorder says the next events have, once it has said one.
func (em *emitter) recordedPhase() (snapshot.Phase, bool) {
	if r := em.im.rec; r != nil && r.phased {
		return r.phase, true
	}
	return snapshot.PhaseNone, false
}

// recordedScope returns the module whose forward is running, by the recorder's scope marks, or 0.
func (em *emitter) recordedScope() snapshot.StringID {
	if r := em.im.rec; r != nil && len(r.scopes) > 0 {
		return r.scopes[len(r.scopes)-1]
	}
	return 0
}

// recordedIterations reports whether the recorder marked the iterations: ProfilerStep#N regions are then
// only annotations.
func (em *emitter) recordedIterations() bool {
	r := em.im.rec
	return r != nil && r.info.Iterations > 0
}

// recordedLabel returns the name the recorder gave the block allocated by entry i of device dev, and the
// category of a final-state block the trace never allocated.
func (im *importer) recordedLabel(dev, i int) snapshot.StringID {
	if r := im.rec; r != nil {
		if res, ok := r.entryTags[[2]int{dev, i}]; ok && res.name != "" {
			return im.tab.str(res.name)
		}
	}
	return 0
}

func (im *importer) recordedFinal(dev int, addr uint64) (tagResult, bool) {
	if r := im.rec; r != nil {
		res, ok := r.finalTags[blockKey{int16(dev), addr}]
		return res, ok
	}
	return tagResult{}, false
}
