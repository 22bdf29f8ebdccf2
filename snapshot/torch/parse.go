package torch

import (
	"math"
	"math/bits"
	"strconv"
	"strings"
	"unsafe"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/snapshot"
)

// This file reads the decoded snapshot's segments and settings into compact records, and parse_traces.go its
// trace entries and annotations, checking every field they use (fields.go reads one). Fields are keyed on
// presence (docs/pytorch-snapshots.md §10): a missing optional field means "not recorded", a present field
// of the wrong type is an error naming its path.

// admit counts n more records (segments, blocks, trace entries, annotations) against the limit: Limits.MaxEvents,
// and one record per input byte. No snapshot spends less than a byte per record, but a pickle can repeat one
// list many times through its memo (PyTorch shares only frames and tracebacks): this keeps such a file from
// expanding into more records than it has bytes.
func (im *importer) admit(path string, n int) error {
	im.records += n
	if limit := min(int64(im.lim.MaxEvents), im.inputLen); int64(im.records) > limit {
		return limitErr(path, "%d records > %d (Limits.MaxEvents %d, input bytes %d)", im.records, limit, im.lim.MaxEvents, im.inputLen)
	}
	return nil
}

// Block states as PyTorch spells them.
const (
	stateAllocated   = "active_allocated"
	statePendingFree = "active_pending_free"
	stateInactive    = "inactive"
)

// parseSegments reads the final allocator state: a list of segment dicts.
func (im *importer) parseSegments(v pickle.Value, name string) error {
	l, ok := im.list(v)
	if !ok {
		return wantErr(name, "list", v)
	}
	n := len(l)
	total := 0
	for i, seg := range l {
		if !isDict(seg) {
			return wantErr(name+"["+itoa(i)+"]", "dict", seg)
		}
		if bv, ok := im.get(seg, "blocks"); ok {
			if bl, ok := im.list(bv); ok {
				total += len(bl)
			}
		}
	}
	if err := im.admit(name, n+total); err != nil {
		return err
	}
	if err := im.mem.add(int64(n)*(int64(unsafe.Sizeof(snapshot.Segment{}))+4)+int64(total)*(int64(unsafe.Sizeof(snapshot.Block{}))+4), "reading "+name); err != nil {
		return err
	}
	// One backing array for every block: the footer's segments slice into it.
	blocks := make([]snapshot.Block, 0, total)
	im.blockStacks = make([]snapshot.StackID, 0, total)
	im.segs = make([]snapshot.Segment, 0, n)
	im.segStacks = make([]snapshot.StackID, 0, n)
	for i, seg := range l {
		path := func() string { return name + "[" + itoa(i) + "]" }
		s, stack, err := im.parseSegment(seg, path, &blocks)
		if err != nil {
			return err
		}
		im.segs = append(im.segs, s)
		im.segStacks = append(im.segStacks, stack)
		im.seeDevice(s.Device)
	}
	return nil
}

// The keys of a segment dict the importer reads, in pick order.
var segmentKeys = [...]string{"device", "address", "total_size", "stream", "segment_type", "is_expandable", "frames", "blocks"}

func (im *importer) parseSegment(seg pickle.Value, path func() string, blocks *[]snapshot.Block) (snapshot.Segment, snapshot.StackID, error) {
	var s snapshot.Segment
	var v [len(segmentKeys)]pickle.Value
	found := im.keys.segment.Pick(seg, v[:])
	for _, req := range [...]int{0, 1, 2, 7} { // device, address, total_size, blocks
		if found&(1<<req) == 0 {
			return s, 0, schemaErr(path(), "missing %q", segmentKeys[req])
		}
	}
	dev, err := im.toInt(v[0], field{path, "device"})
	if err != nil {
		return s, 0, err
	}
	if s.Device, err = checkDevice(dev, field{path, "device"}); err != nil {
		return s, 0, err
	}
	addr, err := im.toInt(v[1], field{path, "address"})
	if err != nil {
		return s, 0, err
	}
	s.Addr = uint64(addr)
	if s.Size, err = im.toSize(v[2], field{path, "total_size"}); err != nil {
		return s, 0, err
	}
	if found&(1<<3) != 0 {
		if s.Stream, err = im.toInt(v[3], field{path, "stream"}); err != nil {
			return s, 0, err
		}
	}
	if s.Pool, err = im.toString(v[4], field{path, "segment_type"}); err != nil {
		return s, 0, err
	}
	switch s.Pool {
	case "":
		s.Pool = "large"
		if s.Size <= smallBuffer {
			s.Pool = "small"
		}
	case "large": // the constants, not views of the decoded text, which the snapshot should not keep alive
		s.Pool = "large"
	case "small":
		s.Pool = "small"
	default:
		s.Pool = strings.Clone(s.Pool)
	}
	if s.Expandable, err = toBool(v[5], field{path, "is_expandable"}); err != nil {
		return s, 0, err
	}
	var stack snapshot.StackID
	if found&(1<<6) != 0 {
		im.seen.segmentFrames = true
		if stack, err = im.framesOf(v[6], func() string { return path() + ".frames" }); err != nil {
			return s, 0, err
		}
	}
	bl, ok := im.list(v[7])
	if !ok {
		return s, 0, wantErr(path()+".blocks", "list", v[7])
	}
	start := len(*blocks)
	next := s.Addr // legacy blocks have no address: they tile the segment from its base
	for j, bd := range bl {
		bpath := func() string { return path() + ".blocks[" + itoa(j) + "]" }
		if !isDict(bd) {
			return s, 0, wantErr(bpath(), "dict", bd)
		}
		b, bstack, err := im.parseBlock(bd, bpath, next)
		if err != nil {
			return s, 0, err
		}
		next = b.Addr + uint64(b.Size)
		*blocks = append(*blocks, b)
		im.blockStacks = append(im.blockStacks, bstack)
	}
	s.Blocks = (*blocks)[start:len(*blocks):len(*blocks)]
	return s, stack, nil
}

// The keys of a block dict the importer reads, in pick order.
var blockKeys = [...]string{"size", "address", "state", "requested_size", "frames", "history"}

func (im *importer) parseBlock(bd pickle.Value, path func() string, next uint64) (snapshot.Block, snapshot.StackID, error) {
	var b snapshot.Block
	var v [len(blockKeys)]pickle.Value
	found := im.keys.block.Pick(bd, v[:])
	if found&1 == 0 {
		return b, 0, schemaErr(path(), `missing "size"`)
	}
	var err error
	if b.Size, err = im.toSize(v[0], field{path, "size"}); err != nil {
		return b, 0, err
	}
	b.Addr = next
	if found&(1<<1) != 0 {
		addr, err := im.toInt(v[1], field{path, "address"})
		if err != nil {
			return b, 0, err
		}
		b.Addr = uint64(addr)
		im.seen.blockAddress = true
	}
	if b.State, err = im.toString(v[2], field{path, "state"}); err != nil {
		return b, 0, err
	}
	switch b.State {
	case stateAllocated:
		b.State = stateAllocated // the constant, not a view of the decoded text
	case statePendingFree:
		b.State = statePendingFree
	case stateInactive:
		b.State = stateInactive
	case "active_awaiting_free": // the spelling of the _snapshot() docstring; the C++ code writes the other
		b.State = statePendingFree
	default:
		return b, 0, schemaErr(path()+".state", "unknown block state %q", truncate(b.State, 64))
	}
	var req int64
	hasReq := found&(1<<3) != 0
	if hasReq {
		if req, err = im.toInt(v[3], field{path, "requested_size"}); err != nil {
			return b, 0, err
		}
	}
	var stack snapshot.StackID
	if found&(1<<4) != 0 {
		if stack, err = im.framesOf(v[4], func() string { return path() + ".frames" }); err != nil {
			return b, 0, err
		}
	}
	// The legacy format (<= 2.0) keeps the block's allocations in "history", newest first; memory_viz reads
	// history[0] for the frames and, without requested_size, the size asked for.
	if found&(1<<5) != 0 {
		im.seen.history = true
		hl, ok := im.list(v[5])
		if !ok {
			return b, 0, wantErr(path()+".history", "list", v[5])
		}
		if len(hl) > 0 {
			h := hl[0]
			hpath := func() string { return path() + ".history[0]" }
			if !isDict(h) {
				return b, 0, wantErr(hpath(), "dict", h)
			}
			if fv, ok := im.get(h, "frames"); ok && stack == 0 {
				if stack, err = im.framesOf(fv, func() string { return hpath() + ".frames" }); err != nil {
					return b, 0, err
				}
			}
			if !hasReq {
				if req, hasReq, err = im.optInt(h, "real_size", hpath); err != nil {
					return b, 0, err
				}
			}
		}
	}
	if hasReq {
		b.Requested = max(req, 0)
	}
	return b, stack, nil
}

// parseSettings reads allocator_settings (≈2.4+) into the PYTORCH_CUDA_ALLOC_CONF string shown to the user
// and the rules used to size blocks.
func (im *importer) parseSettings(v pickle.Value) error {
	d := v
	if !isDict(d) {
		return wantErr("allocator_settings", "dict", v)
	}
	path := func() string { return "allocator_settings" }
	im.origin.SettingsKnown = true
	conf, err := im.optString(d, "PYTORCH_CUDA_ALLOC_CONF", path)
	if err != nil {
		return err
	}
	if err := im.rules.applyConf(conf); err != nil {
		im.origin.SettingsError = err.Error()
	}
	// The effective values win over the string: settings can change at run time. They are also rendered as
	// a settings string for snapshots that recorded none.
	var eff torchrules.Config
	if ms, ok, err := im.optInt(d, "max_split_size", path); err != nil {
		return err
	} else if ok {
		if ms < 0 || uint64(ms) >= 1<<62 {
			im.rules.maxSplit = math.MaxUint64
		} else {
			im.rules.maxSplit = uint64(ms)
			eff.MaxSplitSize = uint64(ms)
		}
	}
	if rv, ok := im.get(d, "roundup_power2_divisions"); ok {
		rd := rv
		if !isDict(rd) {
			return wantErr("allocator_settings.roundup_power2_divisions", "dict", rv)
		}
		// Keyed by the interval's start in MiB, "1" to "32768"; other keys are not intervals and are ignored.
		var t [roundupIntervals]uint64
		p := im.doc.Pairs(rd)
		for j := 0; j < len(p); j += 2 {
			key, _ := im.doc.Str(p[j])
			mib, err := strconv.ParseUint(key, 10, 16)
			i := bits.TrailingZeros64(mib)
			if err != nil || mib == 0 || mib&(mib-1) != 0 || i >= roundupIntervals || key[0] == '0' {
				continue
			}
			n, err := im.toInt(p[j+1], field{func() string { return "allocator_settings.roundup_power2_divisions" }, key})
			if err != nil {
				return err
			}
			if n < 0 || n > 1<<20 || n&(n-1) != 0 {
				return schemaErr("allocator_settings.roundup_power2_divisions."+key, "want 0 or a power of two, got %d", n)
			}
			t[i] = uint64(n)
		}
		im.rules.setDivisions(t)
		eff.RoundupPower2Divisions = t
	}
	if g, ok := im.get(d, "garbage_collection_threshold"); ok {
		f, ok := im.asFloat(g)
		if !ok {
			return wantErr("allocator_settings.garbage_collection_threshold", "float", g)
		}
		if f > 0 {
			eff.GarbageCollectionThreshold = f
		}
	}
	exp, err := im.optBool(d, "expandable_segments", path)
	if err != nil {
		return err
	}
	if im.has(d, "expandable_segments") {
		im.rules.expandable = exp
	}
	eff.ExpandableSegments = exp
	for _, k := range []string{"release_lock_on_cudamalloc", "pinned_use_cuda_host_register", "graph_capture_record_stream_reuse"} {
		b, err := im.optBool(d, k, path)
		if err != nil {
			return err
		}
		if b {
			eff.Inert = append(eff.Inert, torchrules.Setting{Key: k, Value: "True"})
		}
		if k == "graph_capture_record_stream_reuse" && im.has(d, k) {
			im.seen.g4 = true
		}
	}
	if n, ok, err := im.optInt(d, "pinned_num_register_threads", path); err != nil {
		return err
	} else if ok && n != 1 && n > 0 {
		eff.Inert = append(eff.Inert, torchrules.Setting{Key: "pinned_num_register_threads", Value: strconv.FormatInt(n, 10)})
	}
	if im.has(d, "max_round_threshold") || im.has(d, "max_cached_size") {
		im.seen.g5 = true
	}
	// The string as the user set it, when there was one; otherwise the settings rendered from the values.
	if conf != "" {
		im.settings = strings.Clone(conf)
	} else {
		im.settings = eff.String()
	}
	return nil
}
