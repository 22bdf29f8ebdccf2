package torch

import (
	"cmp"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unsafe"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/snapshot"
)

// This file reads what oomdbg record adds to PyTorch's snapshot (the top-level "oomdbg" key,
// docs/pytorch-snapshots.md §9b): marks where iterations, phases and module scopes begin, and tags that say
// which blocks hold parameters, gradients, optimizer state and the batch. They are placed in the trace by
// the allocator's own counts of allocations and frees, read when the mark was made, else by time, and
// applied as the events are written: a recorded file's phases, iterations, scopes and those categories are
// the recorder's, not inferred.

// RecordedFormat is the format of the "oomdbg" key this package reads.
const RecordedFormat = 1

// Recorded describes the tags oomdbg record wrote into a snapshot, as Origin.Recorded.
type Recorded struct {
	Tool   string `json:"tool,omitempty"`  // "oomdbg record 0.4.0"
	Torch  string `json:"torch,omitempty"` // torch.__version__ of the job
	Reason string `json:"reason"`          // why the dump was written: exit, oom, step, SIGTERM, SIGUSR1, exception: ...
	Rank   int    `json:"rank"`            // RANK, -1 when unset
	Steps  int    `json:"steps"`           // optimizer steps done when it was written
	// Marks counts the iteration, phase and scope marks; Placed how many of them were placed in the trace,
	// ByCounts of those by the allocator's counts (exactly), the others by time.
	Marks    int `json:"marks"`
	Placed   int `json:"marks_placed"`
	ByCounts int `json:"marks_by_counts"`
	// Iterations counts the iterations the recorder marked.
	Iterations int `json:"iterations"`
	// Tags counts the blocks the recorder tagged; Matched those found in the trace or the final state.
	Tags    int `json:"tags"`
	Matched int `json:"tags_matched"`
	// Categories are the categories the recorder tagged blocks with: where it names one, a block it did
	// not tag is not of that category.
	Categories []string `json:"categories,omitempty"`
	// Notes are what the recorder said it could not do (a feature this PyTorch lacks).
	Notes []string `json:"notes,omitempty"`
}

// Caps on what the key may hold, beyond Limits: no recorder writes more.
const (
	recordedMaxString = 4 << 10
	recordedMaxNotes  = 64
)

// markKind is what a mark says.
type markKind uint8

const (
	markIteration markKind = iota + 1 // an iteration begins; name is its number
	markPhase                         // a phase begins; name is the phase
	markEnd                           // a phase ended; name is the phase
	markEnter                         // a module's forward begins; name is its path
	markExit                          // a module's forward ends
)

var markKinds = map[string]markKind{"iteration": markIteration, "phase": markPhase, "end": markEnd, "enter": markEnter, "exit": markExit}

// recPoint is a moment of the recorded run: its time, and where the trace was then by the allocator's
// counts of allocations and frees on the device (-1: not read; a dump-time tag has both -1 and device -1).
type recPoint struct {
	time          int64
	device        int16
	allocs, frees int64
}

type recMark struct {
	recPoint
	kind      markKind
	name      string
	phase     snapshot.Phase
	iteration int32
	seq       int // order in the file
	dev, pos  int // where it was placed: before trace entry pos of device dev; pos < 0 when not placed
}

type recTag struct {
	recPoint
	addr     uint64
	size     int64
	category snapshot.Category
	name     string
	pos      int // where it was placed in its device's trace, -1 when not
	entry    int // the alloc entry of the block it matched there, -1 when none
}

// recording is what the import reads of the "oomdbg" key and what it makes of it.
type recording struct {
	info   Recorded
	counts map[int16][2]int64 // by device: the allocator's allocations and frees when the dump was written
	marks  []recMark
	tags   []recTag
	// What placement decided: the marks in the order they apply, and each tagged alloc entry's category
	// and name, by device and entry index; final-state blocks by device and address.
	entryTags map[[2]int]tagResult
	finalTags map[blockKey]tagResult
	next      int // the next mark to apply, in marks
	phase     snapshot.Phase
	phased    bool // a phase mark has been applied: the recorder's phase decides
	scopes    []snapshot.StringID
	index     map[int]*deviceIndex // by device, built once
}

type blockKey struct {
	dev  int16
	addr uint64
}

type tagResult struct {
	category snapshot.Category
	name     string
}

// parseRecorded reads the "oomdbg" key.
func (im *importer) parseRecorded(v pickle.Value) error {
	const root = "oomdbg"
	if !isDict(v) {
		return wantErr(root, "dict", v)
	}
	path := func() string { return root }
	format, _, err := im.optInt(v, "format", path)
	if err != nil {
		return err
	}
	if format != RecordedFormat {
		// A newer recorder: PyTorch's part of the file still imports.
		im.origin.Recorded = &Recorded{Notes: []string{fmt.Sprintf("the tags are in format %d, which this oomdbg does not read", format)}}
		return nil
	}
	r := &recording{counts: map[int16][2]int64{}}
	info := &r.info
	for _, f := range []struct {
		key string
		dst *string
	}{{"tool", &info.Tool}, {"torch", &info.Torch}, {"reason", &info.Reason}} {
		s, err := im.optString(v, f.key, path)
		if err != nil {
			return err
		}
		*f.dst = strings.Clone(truncate(s, recordedMaxString))
	}
	for _, f := range []struct {
		key string
		dst *int
	}{{"rank", &info.Rank}, {"steps", &info.Steps}} {
		n, ok, err := im.optInt(v, f.key, path)
		if err != nil {
			return err
		}
		*f.dst = -1
		if ok {
			*f.dst = int(max(min(n, 1<<31-1), -1))
		}
	}
	if nv, ok := im.get(v, "notes"); ok {
		l, ok := im.list(nv)
		if !ok {
			return wantErr(root+".notes", "list", nv)
		}
		for i, x := range l[:min(len(l), recordedMaxNotes)] {
			s, err := im.toString(x, field{func() string { return root + ".notes" }, itoa(i)})
			if err != nil {
				return err
			}
			info.Notes = append(info.Notes, strings.Clone(truncate(s, recordedMaxString)))
		}
	}
	if cv, ok := im.get(v, "counts"); ok {
		l, ok := im.list(cv)
		if !ok {
			return wantErr(root+".counts", "list", cv)
		}
		if err := im.admit(root+".counts", len(l)); err != nil {
			return err
		}
		for i, d := range l {
			p, err := im.parsePoint(d, func() string { return root + ".counts[" + itoa(i) + "]" })
			if err != nil {
				return err
			}
			if p.device >= 0 && p.allocs >= 0 && p.frees >= 0 {
				r.counts[p.device] = [2]int64{p.allocs, p.frees}
			}
		}
	}
	if err := im.parseMarks(v, r); err != nil {
		return err
	}
	if err := im.parseTags(v, r); err != nil {
		return err
	}
	im.rec = r
	im.origin.Recorded = info
	return nil
}

// parsePoint reads a moment: time_us, device, allocs, frees.
func (im *importer) parsePoint(d pickle.Value, path func() string) (recPoint, error) {
	p := recPoint{device: -1, allocs: -1, frees: -1}
	if !isDict(d) {
		return p, wantErr(path(), "dict", d)
	}
	var err error
	if p.time, _, err = im.optInt(d, "time_us", path); err != nil {
		return p, err
	}
	dev, ok, err := im.optInt(d, "device", path)
	if err != nil {
		return p, err
	}
	if ok && dev >= 0 {
		dv, err := checkDevice(dev, field{path, "device"})
		if err != nil {
			return p, err
		}
		p.device = int16(dv)
	}
	for _, f := range []struct {
		key string
		dst *int64
	}{{"allocs", &p.allocs}, {"frees", &p.frees}} {
		n, ok, err := im.optInt(d, f.key, path)
		if err != nil {
			return p, err
		}
		if ok {
			*f.dst = max(n, -1)
		}
	}
	return p, nil
}

func (im *importer) parseMarks(v pickle.Value, r *recording) error {
	mv, ok := im.get(v, "marks")
	if !ok {
		return nil
	}
	l, ok := im.list(mv)
	if !ok {
		return wantErr("oomdbg.marks", "list", mv)
	}
	if err := im.admit("oomdbg.marks", len(l)); err != nil {
		return err
	}
	if err := im.mem.add(int64(len(l))*int64(unsafe.Sizeof(recMark{})), "reading oomdbg.marks"); err != nil {
		return err
	}
	r.marks = make([]recMark, 0, len(l))
	for i, d := range l {
		path := func() string { return "oomdbg.marks[" + itoa(i) + "]" }
		p, err := im.parsePoint(d, path)
		if err != nil {
			return err
		}
		m := recMark{recPoint: p, seq: i, pos: -1}
		ks, err := im.optString(d, "kind", path)
		if err != nil {
			return err
		}
		if m.kind = markKinds[ks]; m.kind == 0 {
			return schemaErr(path()+".kind", "unknown mark %q", truncate(ks, 64))
		}
		name, err := im.optString(d, "name", path)
		if err != nil {
			return err
		}
		if err := im.mem.add(int64(min(len(name), recordedMaxString)), "reading oomdbg.marks"); err != nil {
			return err
		}
		m.name = strings.Clone(truncate(name, recordedMaxString))
		switch m.kind {
		case markPhase, markEnd:
			ph, ok := snapshot.ParsePhase(m.name)
			if !ok || ph == snapshot.PhaseNone {
				return schemaErr(path()+".name", "unknown phase %q", truncate(name, 64))
			}
			m.phase = ph
		case markIteration:
			n, err := parseIteration(m.name)
			if err != nil {
				return schemaErr(path()+".name", "%v", err)
			}
			m.iteration = n
			r.info.Iterations++
		}
		r.marks = append(r.marks, m)
	}
	r.info.Marks = len(r.marks)
	return nil
}

func parseIteration(s string) (int32, error) {
	n := int64(0)
	if s == "" || len(s) > 9 {
		return 0, fmt.Errorf("iteration %q: want a number from 0 to 999999999", truncate(s, 64))
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("iteration %q: want a number from 0 to 999999999", truncate(s, 64))
		}
		n = n*10 + int64(c-'0')
	}
	return int32(n), nil
}

func (im *importer) parseTags(v pickle.Value, r *recording) error {
	tv, ok := im.get(v, "tags")
	if !ok {
		return nil
	}
	l, ok := im.list(tv)
	if !ok {
		return wantErr("oomdbg.tags", "list", tv)
	}
	if err := im.admit("oomdbg.tags", len(l)); err != nil {
		return err
	}
	if err := im.mem.add(int64(len(l))*int64(unsafe.Sizeof(recTag{})), "reading oomdbg.tags"); err != nil {
		return err
	}
	r.tags = make([]recTag, 0, len(l))
	seen := map[snapshot.Category]bool{}
	for i, d := range l {
		path := func() string { return "oomdbg.tags[" + itoa(i) + "]" }
		p, err := im.parsePoint(d, path)
		if err != nil {
			return err
		}
		t := recTag{recPoint: p, pos: -1, entry: -1}
		addr, ok, err := im.optInt(d, "address", path)
		if err != nil {
			return err
		}
		if !ok {
			return schemaErr(path(), `missing "address"`)
		}
		t.addr = uint64(addr)
		if t.size, ok, err = im.optInt(d, "size", path); err != nil {
			return err
		} else if !ok || t.size < 0 {
			return schemaErr(path(), "want a size")
		}
		cs, err := im.optString(d, "category", path)
		if err != nil {
			return err
		}
		c, ok := snapshot.ParseCategory(cs)
		if !ok {
			return schemaErr(path()+".category", "unknown category %q", truncate(cs, 64))
		}
		t.category = c
		seen[c] = true
		name, err := im.optString(d, "name", path)
		if err != nil {
			return err
		}
		if err := im.mem.add(int64(min(len(name), recordedMaxString)), "reading oomdbg.tags"); err != nil {
			return err
		}
		t.name = strings.Clone(truncate(name, recordedMaxString))
		r.tags = append(r.tags, t)
	}
	r.info.Tags = len(r.tags)
	for c := range snapshot.NumCategories {
		if seen[snapshot.Category(c)] {
			r.info.Categories = append(r.info.Categories, snapshot.Category(c).String())
		}
	}
	return nil
}

// ---- placement ----

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
