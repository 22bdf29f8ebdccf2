package torch

import (
	"math"
	"strings"
	"unsafe"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/snapshot"
)

// entry is one trace entry, compact. The importer keeps these rather than the decoded dicts so that its later
// passes touch 64 bytes per entry.
type entry struct {
	time   int64 // time_us, when recorded
	addr   uint64
	size   int64
	stream int64
	extra  int64 // oom: device_free
	block  int64 // the block size, filled in by the layout pass
	stack  snapshot.StackID
	scope  snapshot.StringID
	text   snapshot.StringID // annotate: the annotation
	act    snapshot.Action
	cat    snapshot.Category
}

// actions maps PyTorch's action strings to events; "annotate" (≈2.11+, _annotate_memory) becomes an
// annotation on the block.
func actionOf(s string) (snapshot.Action, bool) {
	switch s {
	case "alloc":
		return snapshot.ActionAlloc, true
	case "free_requested":
		return snapshot.ActionFreeRequested, true
	case "free_completed":
		return snapshot.ActionFreeCompleted, true
	case "segment_alloc":
		return snapshot.ActionSegmentAlloc, true
	case "segment_free":
		return snapshot.ActionSegmentFree, true
	case "segment_map":
		return snapshot.ActionSegmentMap, true
	case "segment_unmap":
		return snapshot.ActionSegmentUnmap, true
	case "snapshot":
		return snapshot.ActionSnapshot, true
	case "oom":
		return snapshot.ActionOOM, true
	case "annotate":
		return snapshot.ActionAnnotation, true
	}
	return snapshot.ActionInvalid, false
}

// parseTraces reads device_traces: one list of entries per device ordinal, oldest first.
func (im *importer) parseTraces(v pickle.Value) error {
	l, ok := im.list(v)
	if !ok {
		return wantErr("device_traces", "list", v)
	}
	if len(l) > math.MaxInt16+1 {
		return schemaErr("device_traces", "%d devices", len(l))
	}
	total := 0
	lists := make([][]pickle.Value, len(l))
	for dev, tv := range l {
		tl, ok := im.list(tv)
		if !ok {
			return wantErr("device_traces["+itoa(dev)+"]", "list", tv)
		}
		lists[dev] = tl
		total += len(tl)
	}
	if err := im.admit("device_traces", total); err != nil {
		return err
	}
	if err := im.fits(total); err != nil {
		return err
	}
	if err := im.mem.add(int64(total)*int64(unsafe.Sizeof(entry{}))+48*int64(len(l)), "reading device_traces"); err != nil {
		return err
	}
	im.traces = make([][]entry, len(l))
	backing := make([]entry, 0, total)
	im.timeKnown = total > 0
	for dev, tl := range lists {
		start := len(backing)
		for i, d := range tl {
			path := func() string { return "device_traces[" + itoa(dev) + "][" + itoa(i) + "]" }
			if !isDict(d) {
				return wantErr(path(), "dict", d)
			}
			e, keep, err := im.parseEntry(d, path)
			if err != nil {
				return err
			}
			if keep {
				backing = append(backing, e)
			}
		}
		im.traces[dev] = backing[start:len(backing):len(backing)]
		if len(tl) > 0 {
			im.seeDevice(dev)
		}
	}
	im.origin.TraceEntries = total
	im.timeKnown = im.timeKnown && len(backing) > 0 // entries of unknown actions are skipped before their time is read
	return nil
}

// The keys of a trace entry the importer reads, in pick order.
var entryKeys = [...]string{"action", "addr", "size", "stream", "time_us", "frames", "device_free", "category",
	"user_metadata", "compile_context", "pool_id", "internal_metadata", "forward_frames"}

func (im *importer) parseEntry(d pickle.Value, path func() string) (entry, bool, error) {
	var e entry
	var v [len(entryKeys)]pickle.Value
	found := im.keys.entry.Pick(d, v[:])
	if found&1 == 0 {
		return e, false, schemaErr(path(), `missing "action"`)
	}
	as, ok := im.doc.Str(v[0])
	if !ok {
		return e, false, wantErr(path()+".action", "str", v[0])
	}
	act, ok := actionOf(as)
	if !ok {
		// A newer PyTorch may record actions this importer does not know: skip them, and say so.
		if im.origin.SkippedActions == nil {
			im.origin.SkippedActions = make(map[string]int)
		}
		if len(im.origin.SkippedActions) < 64 {
			im.origin.SkippedActions[strings.Clone(truncate(as, 64))]++
		}
		return e, false, nil
	}
	e.act = act
	var err error
	if act == snapshot.ActionOOM {
		// An OOM entry carries the device's free bytes in place of an address.
		if found&(1<<6) != 0 {
			if e.extra, err = im.toInt(v[6], field{path, "device_free"}); err != nil {
				return e, false, err
			}
		}
	} else {
		if found&(1<<1) == 0 {
			return e, false, schemaErr(path(), `missing "addr"`)
		}
		addr, err := im.toInt(v[1], field{path, "addr"})
		if err != nil {
			return e, false, err
		}
		e.addr = uint64(addr)
	}
	if found&(1<<2) == 0 {
		return e, false, schemaErr(path(), `missing "size"`)
	}
	if e.size, err = im.toSize(v[2], field{path, "size"}); err != nil {
		return e, false, err
	}
	if found&(1<<3) != 0 {
		if e.stream, err = im.toInt(v[3], field{path, "stream"}); err != nil {
			return e, false, err
		}
	}
	if found&(1<<4) != 0 {
		if e.time, err = im.toInt(v[4], field{path, "time_us"}); err != nil {
			return e, false, err
		}
		im.seen.timeUS = true
	} else {
		im.timeKnown = false
	}
	if found&(1<<5) != 0 {
		if e.stack, err = im.framesOf(v[5], func() string { return path() + ".frames" }); err != nil {
			return e, false, err
		}
	}
	// Tags PyTorch does not record but tools add: the memory profiler's category (_profile_to_snapshot).
	if found&(1<<7) != 0 && !v[7].IsNone() {
		cs, ok := im.doc.Str(v[7])
		if !ok {
			return e, false, wantErr(path()+".category", "str", v[7])
		}
		e.cat, _ = snapshot.ParseCategory(strings.ToLower(cs))
		im.origin.CategoriesRecorded = true
	}
	// user_metadata (_set_memory_metadata) and the compile context name the region an allocation belongs to,
	// which is what the scope tag is for.
	if found&(1<<8|1<<9) != 0 {
		im.seen.userMetadata = true
	}
	if ms, ok := im.doc.Str(v[8]); ok && ms != "" {
		e.scope = im.tab.str(ms)
	}
	if cs, ok := im.doc.Str(v[9]); ok && cs != "" && cs != "N/A" && e.scope == 0 {
		e.scope = im.tab.str(cs)
	}
	if act == snapshot.ActionAnnotation {
		// _annotate_memory's text travels as the entry's metadata.
		im.seen.g5 = true
		e.text, e.scope = e.scope, 0
		if ms, ok := im.doc.Str(v[8]); ok && ms != "" {
			e.text = im.tab.str(ms)
		}
		if e.text == 0 {
			e.text = im.tab.str("annotate")
		}
	}
	if found&(1<<10|1<<11|1<<12) != 0 {
		im.seen.g5 = true
	}
	return e, true, im.tab.err
}

// annotation is one external_annotations entry: a record_function region's START or END.
type annotation struct {
	time   int64
	device int16
	start  bool
	name   string
}

// parseAnnotations reads external_annotations.
func (im *importer) parseAnnotations(v pickle.Value) error {
	l, ok := im.list(v)
	if !ok {
		return wantErr("external_annotations", "list", v)
	}
	if err := im.admit("external_annotations", len(l)); err != nil {
		return err
	}
	if err := im.mem.add(int64(len(l))*int64(unsafe.Sizeof(annotation{})), "reading external_annotations"); err != nil {
		return err
	}
	im.annots = make([]annotation, 0, len(l))
	for i, d := range l {
		path := func() string { return "external_annotations[" + itoa(i) + "]" }
		if !isDict(d) {
			return wantErr(path(), "dict", d)
		}
		var a annotation
		stage, err := im.optString(d, "stage", path)
		if err != nil {
			return err
		}
		switch stage {
		case "START":
			a.start = true
		case "END":
		default:
			return schemaErr(path()+".stage", "want START or END, got %q", truncate(stage, 64))
		}
		if a.name, err = im.optString(d, "name", path); err != nil {
			return err
		}
		if err := im.mem.add(int64(len(a.name)), "reading external_annotations"); err != nil {
			return err
		}
		a.name = strings.Clone(a.name)
		dev, _, err := im.optInt(d, "device", path)
		if err != nil {
			return err
		}
		// The device is the current one when the region began; -1 (none current) counts as device 0.
		dv, err := checkDevice(max(dev, 0), field{path, "device"})
		if err != nil {
			return err
		}
		a.device = int16(dv)
		if a.time, _, err = im.optInt(d, "time_us", path); err != nil {
			return err
		}
		im.annots = append(im.annots, a)
	}
	return nil
}
