package torch

import (
	"encoding/binary"
	"hash/maphash"
	"slices"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/snapshot"
)

// tables interns strings, frames and stacks the way snapshot.Writer does (dense IDs in first-use order, 0 for
// "" and for the empty stack, the same caps), so that an imported snapshot writes out unchanged.
//
// PyTorch shares each distinct frame dict and traceback list between all the entries that have it, and the
// pickle decoder keeps that sharing: a traceback seen before is found by its list's ID in a slice, so a
// repeated traceback costs one lookup. JSON has no sharing; its frames are interned by content.
type tables struct {
	strings  []string
	frames   []snapshot.Frame
	stacks   [][]snapshot.FrameID
	stringID map[string]snapshot.StringID
	frameID  map[snapshot.Frame]snapshot.FrameID
	stackID  map[string]snapshot.StackID

	// byID is indexed by Doc.ID, which numbers lists and dicts apart: a traceback list's StackID+1, a frame
	// dict's FrameID+1 or dropFrame, 0 while not seen.
	byID      []uint32
	byContent map[frameKey]uint32         // a frame's fields -> FrameID+1, or dropFrame
	byValues  map[[3]pickle.Value]uint32  // a frame dict's name, filename and line as Values -> as byID
	byRaw     map[uint64]rawStack         // a hash of a traceback list's elements -> the list and its stack
	byHash    map[uint64]snapshot.StackID // a hash of a stack's frame IDs -> a stack with that hash
	scratch   []snapshot.FrameID
	key       []byte

	keepAll  bool    // no frame filter
	bytes    int64   // table memory, counted as snapshot.Limits.TableBytes counts it
	err      error   // the first table over a limit
	mem      *budget // the import's
	parseMem int64   // bytes counted for what endParse drops
}

const dropFrame = ^uint32(0) // byID: the frame is filtered out

// writeLimits are the limits snapshot.Writer keeps to; the importer keeps to them too.
var writeLimits = snapshot.DefaultLimits()

// newTables returns empty tables for a Doc of n containers, counted in mem.
func newTables(keepAll bool, n int, mem *budget) (*tables, error) {
	if err := mem.add(4*int64(n), "indexing the tracebacks"); err != nil {
		return nil, err
	}
	return &tables{
		strings:   []string{""},
		frames:    []snapshot.Frame{{}},
		stacks:    [][]snapshot.FrameID{nil},
		stringID:  make(map[string]snapshot.StringID),
		frameID:   make(map[snapshot.Frame]snapshot.FrameID),
		stackID:   make(map[string]snapshot.StackID),
		byContent: make(map[frameKey]uint32),
		byValues:  make(map[[3]pickle.Value]uint32),
		byRaw:     make(map[uint64]rawStack),
		byHash:    make(map[uint64]snapshot.StackID),
		byID:      make([]uint32, n),
		keepAll:   keepAll,
		mem:       mem,
		parseMem:  4 * int64(n),
	}, nil
}

// endParse drops what only reading the decoded input needs: the indexes by Doc container and by Values,
// which refer to the Doc, and those of frames and stacks, which only interning uses. Strings may still be
// interned after.
func (t *tables) endParse() {
	t.mem.release(t.parseMem)
	t.parseMem = 0
	t.byID, t.byContent, t.byValues, t.byRaw, t.byHash = nil, nil, nil, nil, nil
	t.frameID, t.stackID, t.scratch, t.key = nil, nil, nil, nil
}

// full records a table overflow and reports whether one happened. An entry of size bytes, in maps maps
// (parseMaps of them dropped by endParse), is counted against the limits and the import's budget.
func (t *tables) full(count, limit int, size int64, maps, parseMaps int, what string) bool {
	if t.err != nil {
		return true
	}
	if count >= limit || t.bytes+size > writeLimits.TableBytes {
		t.err = limitErr("", "more %s than a snapshot holds (%d entries, %d table bytes)", what, count, t.bytes)
		return true
	}
	if err := t.mem.add(size+int64(maps)*mapEntryBytes, what); err != nil {
		t.err = err
		return true
	}
	t.bytes += size
	t.parseMem += int64(parseMaps) * mapEntryBytes
	return false
}

func (t *tables) str(s string) snapshot.StringID {
	if s == "" {
		return 0
	}
	if id, ok := t.stringID[s]; ok {
		return id
	}
	key := s
	if len(s) > writeLimits.StringBytes {
		// Cut at a rune boundary, as the Writer would: the file format holds no longer strings.
		cut := writeLimits.StringBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	s = strings.Clone(s) // the decoded string is a view of the Doc's text
	if len(key) == len(s) {
		key = s
	}
	if t.full(len(t.strings), writeLimits.Strings, int64(len(s))+20, 1, 0, "interned strings") {
		return 0
	}
	id := snapshot.StringID(len(t.strings))
	t.strings = append(t.strings, s)
	t.stringID[key] = id
	return id
}

// frameKey is a frame as PyTorch writes it.
type frameKey struct {
	name, file string
	line       int64
}

// frame interns one frame; 0 when it is filtered out or a table is full. Old snapshots repeat equal frames in
// distinct dicts, so frames are also remembered by content: a frame seen before costs one lookup.
func (t *tables) frame(name, file string, line int64) snapshot.FrameID {
	k := frameKey{name, file, line}
	if id, ok := t.byContent[k]; ok {
		if id == dropFrame {
			return 0
		}
		return snapshot.FrameID(id - 1)
	}
	if !t.keepAll && hiddenFrame(name, file) {
		t.byContent[k] = dropFrame
		return 0
	}
	f := snapshot.Frame{Function: t.str(name), File: t.str(file), Line: int32(max(-1<<31, min(1<<31-1, line)))}
	id, ok := t.frameID[f]
	if !ok {
		if t.full(len(t.frames), writeLimits.Frames, 12, 3, 3, "interned frames") { // frameID, byContent, byValues
			return 0
		}
		id = snapshot.FrameID(len(t.frames))
		t.frames = append(t.frames, f)
		t.frameID[f] = id
	}
	// Cloned: the key must not keep a slice of a large decoded buffer alive (a no-op for short strings).
	t.byContent[frameKey{t.strings[f.Function], t.strings[f.File], line}] = uint32(id) + 1
	return id
}

// stackHashSeed and stackHash hash a stack's frame IDs as framesOf collects them.
const stackHashSeed uint64 = 0x2545f4914f6cdd1d

func stackHash(h uint64, f snapshot.FrameID) uint64 {
	h = (h ^ uint64(f)) * 0x9e3779b97f4a7c15
	return h ^ h>>29
}

// stack interns the frames in t.scratch (innermost first), whose stackHash is h; an empty stack is 0.
// Snapshots repeat equal tracebacks in distinct lists, so a stack is first looked for by its hash, then
// compared.
func (t *tables) stack(h uint64) snapshot.StackID {
	frames := t.scratch
	if len(frames) == 0 {
		return 0
	}
	if len(frames) > writeLimits.StackDepth {
		// Keep the innermost frames: they say where memory was asked for.
		frames = frames[:writeLimits.StackDepth]
		h = stackHashSeed
		for _, f := range frames {
			h = stackHash(h, f)
		}
	}
	if id, ok := t.byHash[h]; ok && slices.Equal(t.stacks[id], frames) {
		return id
	}
	t.key = t.key[:0]
	for _, f := range frames {
		t.key = binary.LittleEndian.AppendUint32(t.key, uint32(f))
	}
	id, ok := t.stackID[string(t.key)]
	if !ok {
		if t.full(len(t.stacks), writeLimits.Stacks, 4*int64(len(frames))+4, 3, 3, "interned stacks") { // stackID, byHash, byRaw
			return 0
		}
		id = snapshot.StackID(len(t.stacks))
		t.stacks = append(t.stacks, append([]snapshot.FrameID(nil), frames...))
		t.stackID[string(t.key)] = id
	}
	if _, ok := t.byHash[h]; !ok {
		t.byHash[h] = id
	}
	return id
}

// omitFunctions and omitFilenames are memory_viz's frameFilter (MemoryViz.js, and _frame_filter in
// torch/cuda/_memory_viz.py): the unwinder, the interpreter loop and dispatcher plumbing, which every stack
// has and nobody reads.
var (
	omitFunctions = []string{"unwind::unwind", "CapturedTraceback::gather", "gather_with_cpp", "_start",
		"__libc_start_main", "PyEval_", "PyObject_", "PyFunction_"}
	omitFilenames = []string{"core/boxing", "/Register", "/Redispatch", "pythonrun.c", "Modules/main.c",
		"Objects/call.c", "Objects/methodobject.c", "pycore_ceval.h", "ceval.c", "cpython/abstract.h"}
)

// hiddenFrame is frameFilter: true for a frame memory_viz does not show.
func hiddenFrame(name, file string) bool {
	for _, s := range omitFunctions {
		if strings.Contains(name, s) {
			return true
		}
	}
	for _, s := range omitFilenames {
		if strings.Contains(file, s) {
			return true
		}
	}
	return false
}

// framesOf interns the traceback v (a list of frame dicts, innermost first) at path, returning its stack.
func (im *importer) framesOf(v pickle.Value, path func() string) (snapshot.StackID, error) {
	l, ok := im.list(v)
	if !ok {
		if v.IsNone() {
			return 0, nil
		}
		return 0, wantErr(path(), "list", v)
	}
	t := im.tab
	doc := im.doc
	id := doc.ID(v)
	if t.byID[id] != 0 {
		return snapshot.StackID(t.byID[id] - 1), nil
	}
	// Equal tracebacks in distinct lists hold the same frame dicts: a hash of the list's Values, checked by
	// comparing them, finds the stack without walking the frames (f3 has 6,000 such lists of 190 frames).
	var raw uint64
	if len(l) >= minRawFrames {
		raw = maphash.Bytes(rawSeed, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(l))), len(l)*8))
		if r, ok := t.byRaw[raw]; ok && slices.Equal(r.elems, l) {
			t.byID[id] = uint32(r.stack) + 1
			return r.stack, nil
		}
	}
	if cap(t.scratch) < len(l) {
		t.scratch = make([]snapshot.FrameID, 0, max(len(l), 2*cap(t.scratch)))
	}
	scratch := t.scratch[:0]
	h := stackHashSeed
	byID := t.byID
	for i, d := range l {
		if !isDict(d) {
			return 0, wantErr(path()+"["+itoa(i)+"]", "dict", d)
		}
		// PyTorch shares each frame dict: most are seen before, and found by their ID.
		did := doc.ID(d)
		f := byID[did]
		if f == 0 {
			var err error
			if f, err = im.resolveFrame(d, path, i); err != nil {
				return 0, err
			}
		}
		if f != dropFrame {
			scratch = append(scratch, snapshot.FrameID(f-1))
			h = stackHash(h, snapshot.FrameID(f-1))
		}
	}
	t.scratch = scratch
	s := t.stack(h)
	t.byID[id] = uint32(s) + 1
	if raw != 0 && t.err == nil {
		if _, ok := t.byRaw[raw]; !ok {
			t.byRaw[raw] = rawStack{l, s}
		}
	}
	return s, t.err
}

// minRawFrames is the length from which a traceback list is looked up by the hash of its elements: below it,
// walking the frames costs less than hashing.
const minRawFrames = 8

// rawSeed seeds the hash of traceback lists; it only has to be unpredictable to the input.
var rawSeed = maphash.MakeSeed()

// rawStack is a traceback list seen before, as the Doc's Values of its frame dicts, and its stack.
type rawStack struct {
	elems []pickle.Value
	stack snapshot.StackID
}

// resolveFrame reads frame dict d (element i of the traceback at path) and remembers it by its ID.
// It returns FrameID+1, or dropFrame for a frame the filter hides.
func (im *importer) resolveFrame(d pickle.Value, path func() string, i int) (uint32, error) {
	fid, err := im.frameDict(d, func() string { return path() + "[" + itoa(i) + "]" })
	if err != nil {
		return 0, err
	}
	f := dropFrame
	if fid != 0 {
		f = uint32(fid) + 1
	}
	t := im.tab
	did := im.doc.ID(d)
	t.byID[did] = f
	return f, nil
}

// The keys of a frame dict the importer reads, in pick order.
var frameKeys = [...]string{"name", "filename", "line"}

// frameDict reads one frame {filename, line, name}; FX annotations are ignored.
func (im *importer) frameDict(d pickle.Value, path func() string) (snapshot.FrameID, error) {
	var v [len(frameKeys)]pickle.Value
	found := im.keys.frame.Pick(d, v[:])
	// Old snapshots repeat equal frames in distinct dicts; their strs are shared or interned, so the Values
	// of the fields find a frame seen before without reading its strings.
	cache := found == 7
	if f, ok := im.tab.byValues[v]; ok && cache {
		if f == dropFrame {
			return 0, nil
		}
		return snapshot.FrameID(f - 1), nil
	}
	name, err := im.toString(v[0], field{path, "name"})
	if err != nil {
		return 0, err
	}
	file, err := im.toString(v[1], field{path, "filename"})
	if err != nil {
		return 0, err
	}
	var line int64
	if found&(1<<2) != 0 {
		if line, err = im.toInt(v[2], field{path, "line"}); err != nil {
			return 0, err
		}
	}
	fid := im.tab.frame(name, file, line)
	if cache && im.tab.err == nil {
		f := dropFrame
		if fid != 0 {
			f = uint32(fid) + 1
		}
		im.tab.byValues[v] = f
	}
	return fid, nil
}
