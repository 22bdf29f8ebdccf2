package tracer

import (
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

const (
	defaultStackDepth = 48
	modulePath        = "github.com/oomdbg/oomdbg/"

	// chainSlack is how many frame pointers beyond the stack depth a walk follows: a chain longer than that is
	// captured with runtime.Callers, since its tail could decide what runtime.Callers keeps.
	chainSlack = 64
)

// defaultSkippedFrames are left out of every stack: the frames of the allocator model and of this package say
// how memory was handed out, not who asked for it, and the runtime's own frames say nothing to a user.
var defaultSkippedFrames = []string{
	"runtime.",
	modulePath + "tracer.",
	modulePath + "allocator.",
}

// stackTable captures Go stacks and interns them.
//
// The stack a Recorder records is the one runtime.Callers gives, symbolised and filtered. runtime.Callers
// costs about a microsecond on a training loop's call paths, though: it looks every frame's size up in the
// function's tables. Where Go keeps frame pointers (amd64, arm64) the hot path walks them instead, a couple
// of loads per frame, and looks the chain of return addresses up in a cache. The chain decides what
// runtime.Callers returns (the functions, their inlined calls, the wrappers it leaves out), so a chain seen
// before has the stack it had then, and only a new chain, or one longer than the walk follows, pays for
// runtime.Callers.
//
// The walk trusts that every frame on the chain is a Go frame. That holds for Go code called from Go. Under a
// cgo callback the chain runs into C frames; the walk stops where a frame pointer leaves the goroutine's
// stack, but a C frame compiled without frame pointers can leave anything in that register, so a Recorder
// called from a cgo callback should record without stacks (WithStackDepth(0)).
type stackTable struct {
	sink   Sink
	skip   []string
	walk   bool                        // follow frame pointers: framePointers, unless a test turns it off
	unwind int                         // runtime.Callers calls, for tests
	pcs    []uintptr                   // scratch for runtime.Callers
	chain  []uintptr                   // scratch for walkFrames
	chains chainCache                  // whole chains of return addresses seen
	ids    map[string]snapshot.StackID // key: the bytes of runtime.Callers' PCs
	frame  []snapshot.FrameID          // scratch for symbolising
}

func newStackTable(sink Sink, depth int, skip []string) *stackTable {
	return &stackTable{
		sink:  sink,
		skip:  skip,
		walk:  framePointers,
		pcs:   make([]uintptr, depth),
		chain: make([]uintptr, depth+chainSlack),
		ids:   make(map[string]snapshot.StackID),
	}
}

// capture returns the ID of its caller's stack. A chain of frames seen before costs the walk and one table
// lookup; no allocation.
//
// capture is never inlined, so the walk starts in its own frame and the chain holds its return address,
// which tells its call sites apart.
//
//go:noinline
func (t *stackTable) capture() snapshot.StackID {
	if t.walk {
		if n, hash, whole := walkFrames(framePointer(), t.chain); whole && n > 0 {
			chain := t.chain[:n]
			if id, ok := t.chains.find(hash, chain); ok {
				return id
			}
			id := t.callers()
			t.chains.add(hash, chain, id)
			return id
		}
	}
	return t.callers()
}

// walkFrames follows the frame-pointer chain from fp, storing each frame's return address (the word above
// its frame pointer) in chain. It returns how many it stored, their hash, and whether it reached the end of
// the chain: a goroutine's first frame saved a nil frame pointer. The chain runs up one goroutine's stack,
// so a frame pointer at or below the previous one, or further above it than a goroutine's stack can reach
// (a C frame's, under a cgo callback), is not followed and leaves the walk incomplete.
func walkFrames(fp unsafe.Pointer, chain []uintptr) (n int, hash uint64, whole bool) {
	for i := range chain {
		if fp == nil {
			return i, hash, true
		}
		pc := *(*uintptr)(unsafe.Add(fp, unsafe.Sizeof(uintptr(0))))
		chain[i] = pc
		hash = (hash ^ uint64(pc)) * 0x9E3779B97F4A7C15
		next := *(*unsafe.Pointer)(fp)
		if next != nil && uintptr(next)-uintptr(fp)-1 >= maxGoroutineStack {
			return i + 1, hash, false
		}
		fp = next
	}
	return len(chain), hash, fp == nil
}

// maxGoroutineStack bounds a goroutine's stack: the runtime's limit is 1 GB on 64-bit systems.
const maxGoroutineStack = 1 << 30

// chainCache maps chains of return addresses to stack IDs: open addressing on the chains' hashes, with the
// chains stored back to back to check a hit against. It replaced a map keyed by the chains' bytes, whose
// hashing and probing cost as much again as the walk.
type chainCache struct {
	slots []chainSlot // a power of two of them, at most half used
	used  int
	flat  []uintptr
}

type chainSlot struct {
	hash  uint64
	start int // the chain is flat[start:start+n]
	n     int // 0: an empty slot
	stack snapshot.StackID
}

func (c *chainCache) find(hash uint64, chain []uintptr) (snapshot.StackID, bool) {
	if len(c.slots) == 0 {
		return 0, false
	}
	mask := uint64(len(c.slots) - 1)
	for i := hash >> 32 & mask; ; i = (i + 1) & mask {
		s := &c.slots[i]
		if s.n == 0 {
			return 0, false
		}
		if s.hash == hash && slices.Equal(c.flat[s.start:s.start+s.n], chain) {
			return s.stack, true
		}
	}
}

// add records a chain that find did not find.
func (c *chainCache) add(hash uint64, chain []uintptr, stack snapshot.StackID) {
	if 2*(c.used+1) > len(c.slots) {
		c.grow()
	}
	c.insert(chainSlot{hash: hash, start: len(c.flat), n: len(chain), stack: stack})
	c.flat = append(c.flat, chain...)
}

func (c *chainCache) insert(slot chainSlot) {
	mask := uint64(len(c.slots) - 1)
	i := slot.hash >> 32 & mask
	for c.slots[i].n != 0 {
		i = (i + 1) & mask
	}
	c.slots[i] = slot
	c.used++
}

func (c *chainCache) grow() {
	old := c.slots
	c.slots = make([]chainSlot, max(64, 2*len(old)))
	c.used = 0
	for _, s := range old {
		if s.n != 0 {
			c.insert(s)
		}
	}
}

// callers captures capture's caller's stack with runtime.Callers and returns its ID, symbolising it if its
// PCs are new.
func (t *stackTable) callers() snapshot.StackID {
	t.unwind++
	n := runtime.Callers(3, t.pcs) // runtime.Callers, callers, capture
	if n == 0 {
		return 0
	}
	key := bytesOf(t.pcs[:n])
	if id, ok := t.ids[key]; ok {
		return id
	}
	id := t.intern(t.pcs[:n])
	t.ids[strings.Clone(key)] = id
	return id
}

// bytesOf views pcs as a string, for a map key: a lookup with it does not allocate.
func bytesOf(pcs []uintptr) string {
	return unsafe.String((*byte)(unsafe.Pointer(&pcs[0])), len(pcs)*int(unsafe.Sizeof(uintptr(0))))
}

// intern symbolises pcs, drops skipped frames and interns what is left with the sink.
func (t *stackTable) intern(pcs []uintptr) snapshot.StackID {
	t.frame = t.frame[:0]
	frames := runtime.CallersFrames(pcs)
	for {
		f, more := frames.Next()
		if f.Function != "" && !t.skipped(f.Function) {
			t.frame = append(t.frame, t.sink.InternFrame(f.Function, f.File, f.Line))
		}
		if !more {
			break
		}
	}
	return t.sink.InternStack(t.frame)
}

func (t *stackTable) skipped(function string) bool {
	for _, p := range t.skip {
		if strings.HasPrefix(function, p) {
			return true
		}
	}
	return false
}
