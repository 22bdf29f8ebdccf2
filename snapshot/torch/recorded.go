package torch

import (
	"fmt"
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
