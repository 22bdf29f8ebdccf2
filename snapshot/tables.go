package snapshot

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// internTables assigns IDs to strings, frames and stacks on the writing side, and remembers which entries
// the file does not hold yet. IDs are dense and assigned in order, so a chunk's new entries need no IDs in the
// file: they continue the reader's count.
type internTables struct {
	stringIDs map[string]StringID
	strings   []string // ID i at index i-1
	frameIDs  map[Frame]FrameID
	frames    []Frame
	stackIDs  map[string]StackID // keyed by the frame IDs' bytes, little-endian
	stackEnds []int              // stack i spans stackFrames[stackEnds[i-2]:stackEnds[i-1]]
	stackFlat []FrameID
	key       []byte // scratch for stack keys

	// Entries already written to the file.
	sentStrings, sentFrames, sentStacks int
	// bytes counts the tables as a reader's Limits.TableBytes does.
	bytes int64
	// err is the first misuse (an undefined frame in a stack) or overflow (tables beyond a default Reader's
	// limits); Write reports it.
	err error
}

// full reports whether adding an entry of size bytes would take the tables past a default Reader's limits,
// and if so records the error. Past them the file could not be read back, so the entry is refused.
func (t *internTables) full(count, limit int, size int64, what string) bool {
	if count < limit && t.bytes+size <= writeLimits.TableBytes {
		t.bytes += size
		return false
	}
	if t.err == nil {
		t.err = fmt.Errorf("%w: more %s than a reader accepts (%d entries, %d table bytes)", ErrLimit, what, count, t.bytes)
	}
	return true
}

func newInternTables() *internTables {
	return &internTables{
		stringIDs: make(map[string]StringID),
		frameIDs:  make(map[Frame]FrameID),
		stackIDs:  make(map[string]StackID),
	}
}

// writeLimits are the limits the Writer keeps to, so that a default Reader reads what it writes.
var writeLimits = DefaultLimits()

func (t *internTables) internString(s string) StringID {
	if s == "" {
		return 0
	}
	if id, ok := t.stringIDs[s]; ok {
		return id
	}
	// Clone: the caller's string may be a slice of a large buffer that the table should not keep alive.
	key := strings.Clone(s)
	s = key
	if len(s) > writeLimits.StringBytes {
		// Truncate at a rune boundary; a longer string would make the file unreadable with default limits.
		cut := writeLimits.StringBytes
		for cut > 0 && !utf8.RuneStart(s[cut]) {
			cut--
		}
		s = s[:cut]
	}
	if t.full(len(t.strings), writeLimits.Strings, int64(uvarintLen(uint64(len(s)))+len(s))+16, "strings") {
		return 0
	}
	t.strings = append(t.strings, s)
	id := StringID(len(t.strings))
	t.stringIDs[key] = id
	return id
}

func (t *internTables) internFrame(function, file string, line int) FrameID {
	f := Frame{Function: t.internString(function), File: t.internString(file), Line: clampInt32(line)}
	if id, ok := t.frameIDs[f]; ok {
		return id
	}
	if t.full(len(t.frames), writeLimits.Frames, 12, "frames") {
		return 0
	}
	t.frames = append(t.frames, f)
	id := FrameID(len(t.frames))
	t.frameIDs[f] = id
	return id
}

func clampInt32(v int) int32 {
	return int32(max(math.MinInt32, min(math.MaxInt32, v)))
}

func (t *internTables) internStack(frames []FrameID) StackID {
	if len(frames) == 0 {
		return 0
	}
	if len(frames) > writeLimits.StackDepth {
		frames = frames[:writeLimits.StackDepth] // keep the innermost frames: they say where the allocation happened
	}
	t.key = t.key[:0]
	for _, f := range frames {
		t.key = binary.LittleEndian.AppendUint32(t.key, uint32(f))
	}
	if id, ok := t.stackIDs[string(t.key)]; ok { // no allocation: the compiler does not copy for a lookup
		return id
	}
	for _, f := range frames {
		if f == 0 || int(f) > len(t.frames) {
			if t.err == nil {
				t.err = fmt.Errorf("%w: stack refers to frame %d, which was not interned", ErrInvalidEvent, f)
			}
			return 0
		}
	}
	if t.full(len(t.stackEnds), writeLimits.Stacks, 4*int64(len(frames))+4, "stacks") {
		return 0
	}
	t.stackFlat = append(t.stackFlat, frames...)
	t.stackEnds = append(t.stackEnds, len(t.stackFlat))
	id := StackID(len(t.stackEnds))
	t.stackIDs[string(t.key)] = id
	return id
}

// pending reports whether some entries were interned but not written.
func (t *internTables) pending() bool {
	return t.sentStrings < len(t.strings) || t.sentFrames < len(t.frames) || t.sentStacks < len(t.stackEnds)
}

// appendPending appends the table section of a chunk (docs/format.md §5.1) holding pending entries, in ID
// order, and marks them written. It stops adding entries once dst has grown by budget bytes; frames follow
// only when all strings are out and stacks only when all frames are, so every entry refers to entries
// defined before it. It reports whether everything pending was written.
func (t *internTables) appendPending(dst []byte, budget int) ([]byte, bool) {
	// Strings.
	ns := 0
	size := 0
	for i := t.sentStrings; i < len(t.strings); i++ {
		if size >= budget {
			break
		}
		size += uvarintLen(uint64(len(t.strings[i]))) + len(t.strings[i])
		ns++
	}
	dst = binary.AppendUvarint(dst, uint64(ns))
	for _, s := range t.strings[t.sentStrings : t.sentStrings+ns] {
		dst = binary.AppendUvarint(dst, uint64(len(s)))
		dst = append(dst, s...)
	}
	t.sentStrings += ns

	// Frames.
	nf := 0
	if t.sentStrings == len(t.strings) {
		for i := t.sentFrames; i < len(t.frames) && size < budget; i++ {
			size += 12
			nf++
		}
	}
	dst = binary.AppendUvarint(dst, uint64(nf))
	for _, f := range t.frames[t.sentFrames : t.sentFrames+nf] {
		dst = binary.AppendUvarint(dst, uint64(f.Function))
		dst = binary.AppendUvarint(dst, uint64(f.File))
		dst = binary.AppendUvarint(dst, zigzag(int64(f.Line)))
	}
	t.sentFrames += nf

	// Stacks.
	nk := 0
	if t.sentFrames == len(t.frames) {
		for i := t.sentStacks; i < len(t.stackEnds) && size < budget; i++ {
			size += 4 * (t.stackEnds[i] - t.stackStart(i))
			nk++
		}
	}
	dst = binary.AppendUvarint(dst, uint64(nk))
	for i := t.sentStacks; i < t.sentStacks+nk; i++ {
		frames := t.stackFlat[t.stackStart(i):t.stackEnds[i]]
		dst = binary.AppendUvarint(dst, uint64(len(frames)))
		for _, f := range frames {
			dst = binary.AppendUvarint(dst, uint64(f))
		}
	}
	t.sentStacks += nk
	return dst, !t.pending()
}

// stackStart is where the stack at index i (ID i+1) starts in stackFlat.
func (t *internTables) stackStart(i int) int {
	if i == 0 {
		return 0
	}
	return t.stackEnds[i-1]
}

// tables holds what a reader has decoded of a snapshot's tables. Index 0 of each is the zero entry, so a
// lookup by ID is an index.
type tables struct {
	strings   []string
	frames    []Frame
	stackEnds []uint32 // stack ID k spans stackFlat[stackEnds[k-1]:stackEnds[k]]; stackEnds[0] == 0
	stackFlat []FrameID
	bytes     int64 // memory the tables hold, for Limits.TableBytes
}

func newTables() tables {
	return tables{strings: []string{""}, frames: []Frame{{}}, stackEnds: []uint32{0}}
}

func (t *tables) string(id StringID) string {
	if int(id) < len(t.strings) {
		return t.strings[id]
	}
	return ""
}

func (t *tables) frame(id FrameID) Frame {
	if int(id) < len(t.frames) {
		return t.frames[id]
	}
	return Frame{}
}

func (t *tables) stack(id StackID) []FrameID {
	if id == 0 || int(id) >= len(t.stackEnds) {
		return nil
	}
	return t.stackFlat[t.stackEnds[id-1]:t.stackEnds[id]:t.stackEnds[id]]
}

func (t *tables) numStrings() int { return len(t.strings) - 1 }
func (t *tables) numFrames() int  { return len(t.frames) - 1 }
func (t *tables) numStacks() int  { return len(t.stackEnds) - 1 }

// decodeSection reads the table section at the start of an events chunk's payload (docs/format.md §5.1),
// appends its entries and returns the rest of the payload. Every count and length is checked against lim
// and against the bytes left before anything is allocated for it.
func (t *tables) decodeSection(p []byte, lim *Limits) ([]byte, error) {
	c := cursor{b: p}

	// Strings. They are cut from one string holding the section's bytes: one allocation per chunk.
	n := c.uvarint()
	if c.bad {
		return nil, corruptf("string count: bad varint")
	}
	if n > uint64(c.rest()) { // each string takes at least its length byte
		return nil, corruptf("string count %d exceeds the %d bytes left", n, c.rest())
	}
	if uint64(t.numStrings())+n > uint64(lim.Strings) {
		return nil, limitf("more than %d strings", lim.Strings)
	}
	if n > 0 {
		sectionStart := c.i
		// First pass: validate lengths and find the section's end.
		for range n {
			l := c.uvarint()
			if c.bad || l > uint64(c.rest()) {
				return nil, corruptf("string length runs past the chunk")
			}
			if l > uint64(lim.StringBytes) {
				return nil, limitf("string of %d bytes (limit %d)", l, lim.StringBytes)
			}
			c.i += int(l)
		}
		section := p[sectionStart:c.i]
		t.bytes += int64(len(section)) + 16*int64(n)
		if t.bytes > lim.TableBytes {
			return nil, limitf("tables exceed %d bytes", lim.TableBytes)
		}
		all := string(section)
		sc := cursor{b: section}
		t.strings = slices.Grow(t.strings, int(n))
		for range n {
			l := int(sc.uvarint())
			t.strings = append(t.strings, all[sc.i:sc.i+l])
			sc.i += l
		}
	}

	// Frames: function and file string IDs, line.
	n = c.uvarint()
	if c.bad || n > uint64(c.rest())/3 { // each frame takes at least three bytes
		return nil, corruptf("frame count %d exceeds the bytes left", n)
	}
	if uint64(t.numFrames())+n > uint64(lim.Frames) {
		return nil, limitf("more than %d frames", lim.Frames)
	}
	t.bytes += 12 * int64(n)
	if t.bytes > lim.TableBytes {
		return nil, limitf("tables exceed %d bytes", lim.TableBytes)
	}
	t.frames = slices.Grow(t.frames, int(n))
	maxString := uint64(t.numStrings())
	for range n {
		fn, file := c.uvarint(), c.uvarint()
		line := c.varint()
		if c.bad {
			return nil, corruptf("frame: bad varint")
		}
		if fn > maxString || file > maxString || line != int64(int32(line)) {
			return nil, corruptf("frame refers to undefined string %d or %d, or line %d out of range", fn, file, line)
		}
		t.frames = append(t.frames, Frame{Function: StringID(fn), File: StringID(file), Line: int32(line)})
	}

	// Stacks: depth, then frame IDs, innermost first.
	n = c.uvarint()
	if c.bad || n > uint64(c.rest())/2 { // each stack takes a depth and at least one frame
		return nil, corruptf("stack count %d exceeds the bytes left", n)
	}
	if uint64(t.numStacks())+n > uint64(lim.Stacks) {
		return nil, limitf("more than %d stacks", lim.Stacks)
	}
	t.stackEnds = slices.Grow(t.stackEnds, int(n))
	maxFrame := uint64(t.numFrames())
	for range n {
		depth := c.uvarint()
		if c.bad || depth == 0 || depth > uint64(c.rest()) {
			return nil, corruptf("stack depth %d: empty or runs past the chunk", depth)
		}
		if depth > uint64(lim.StackDepth) {
			return nil, limitf("stack of %d frames (limit %d)", depth, lim.StackDepth)
		}
		t.bytes += 4*int64(depth) + 4
		if t.bytes > lim.TableBytes {
			return nil, limitf("tables exceed %d bytes", lim.TableBytes)
		}
		t.stackFlat = slices.Grow(t.stackFlat, int(depth))
		for range depth {
			f := c.uvarint()
			if c.bad || f == 0 || f > maxFrame {
				return nil, corruptf("stack refers to undefined frame %d", f)
			}
			t.stackFlat = append(t.stackFlat, FrameID(f))
		}
		if uint64(len(t.stackFlat)) > math.MaxUint32 {
			return nil, limitf("stack entries exceed 2^32")
		}
		t.stackEnds = append(t.stackEnds, uint32(len(t.stackFlat)))
	}
	return p[c.i:], nil
}
