package tracer

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

// frameSink interns like a Writer and keeps the stacks' frames as text, to compare stacks across sinks.
type frameSink struct {
	discard
	frames []string // FrameID i at i-1
	stacks [][]snapshot.FrameID
	ids    map[string]snapshot.StackID
}

type discard struct{}

func (discard) InternString(string) snapshot.StringID { return 0 }
func (discard) Write(*snapshot.Event) error           { return nil }
func (discard) Flush() error                          { return nil }
func (discard) Close(*snapshot.Footer) error          { return nil }

func (s *frameSink) InternFrame(function, file string, line int) snapshot.FrameID {
	s.frames = append(s.frames, fmt.Sprintf("%s %s:%d", function, file, line))
	return snapshot.FrameID(len(s.frames))
}

func (s *frameSink) InternStack(frames []snapshot.FrameID) snapshot.StackID {
	var key []string
	for _, f := range frames {
		key = append(key, s.frames[f-1])
	}
	k := strings.Join(key, "\n")
	if id, ok := s.ids[k]; ok {
		return id
	}
	if s.ids == nil {
		s.ids = map[string]snapshot.StackID{}
	}
	s.stacks = append(s.stacks, slices.Clone(frames))
	s.ids[k] = snapshot.StackID(len(s.stacks))
	return s.ids[k]
}

func (s *frameSink) stack(id snapshot.StackID) string {
	if id == 0 {
		return ""
	}
	var fs []string
	for _, f := range s.stacks[id-1] {
		fs = append(fs, s.frames[f-1])
	}
	return strings.Join(fs, "\n")
}

// twoTables captures every stack twice from the same line: by frame pointers (where the architecture has
// them) and with runtime.Callers alone, the truth the first must match.
type twoTables struct {
	fast, slow         *stackTable
	fastSink, slowSink frameSink
	got                [][2]snapshot.StackID
}

func newTwoTables(depth int) *twoTables {
	// Keep this package's test functions: they are the call paths under test.
	skip := []string{"runtime.", modulePath + "tracer.(*stackTable)."}
	p := &twoTables{}
	p.fast = newStackTable(&p.fastSink, depth, skip)
	p.slow = newStackTable(&p.slowSink, depth, skip)
	p.slow.walk = false
	return p
}

//go:noinline
func (p *twoTables) leaf() {
	f, s := p.fast.capture(), p.slow.capture()
	p.got = append(p.got, [2]snapshot.StackID{f, s})
}

//go:noinline
func nested(p *twoTables, n int) {
	if n == 0 {
		p.leaf()
		return
	}
	nested(p, n-1)
}

// Small enough to be inlined: runtime.Callers reports them, a frame-pointer walk sees only their caller.
func inlined1(p *twoTables) { inlined2(p) }
func inlined2(p *twoTables) { inlined3(p) }
func inlined3(p *twoTables) { p.leaf() }

//go:noinline
func callsInlined(p *twoTables) { inlined1(p) }

type leafer interface{ callLeaf(p *twoTables) }

type inner struct{}

//go:noinline
func (inner) callLeaf(p *twoTables) { p.leaf() }

// outer's callLeaf is a compiler-made wrapper, which runtime.Callers leaves out.
type outer struct{ inner }

//go:noinline
func viaDefer(p *twoTables) {
	defer p.leaf()
}

//go:noinline
func viaPanic(p *twoTables) {
	defer func() {
		recover()
		p.leaf()
	}()
	panic("unwinding")
}

var padSum byte

//go:noinline
func grownStack(p *twoTables, n int) {
	var pad [1024]byte // forces the goroutine's stack to grow, and be copied, on the way down
	pad[n] = byte(n)
	if n == 0 {
		p.leaf()
	} else {
		grownStack(p, n-1)
	}
	padSum += pad[n]
}

type generic[T any] []T

//go:noinline
func (g generic[T]) call(p *twoTables) { p.leaf() }

// callPaths are the shapes of call paths the recorder meets: plain and inlined calls, wrappers, closures,
// method values, defers, panics, goroutines, reflection, generics, deep and grown stacks.
func callPaths(p *twoTables) map[string]func() {
	var l leafer = &outer{}
	method := p.leaf
	return map[string]func(){
		"direct":         p.leaf,
		"nested":         func() { nested(p, 5) },
		"inlined":        func() { callsInlined(p) },
		"wrapper":        func() { l.callLeaf(p) },
		"method value":   func() { method() },
		"closure":        func() { func() { p.leaf() }() },
		"defer":          func() { viaDefer(p) },
		"panic":          func() { viaPanic(p) },
		"goroutine":      func() { done := make(chan bool); go func() { p.leaf(); done <- true }(); <-done },
		"reflect":        func() { reflect.ValueOf(p.leaf).Call(nil) },
		"generic":        func() { generic[int]{}.call(p); generic[string]{}.call(p) },
		"grown stack":    func() { grownStack(p, 40) },
		"at depth":       func() { nested(p, 40) },
		"past depth":     func() { nested(p, 60) },                           // runtime.Callers keeps 48 frames
		"past the chain": func() { nested(p, defaultStackDepth+chainSlack) }, // the walk gives up: runtime.Callers
	}
}

// TestFramePointerStacks: stacks captured by walking frame pointers are the stacks runtime.Callers gives,
// frame for frame, whatever the shape of the call path, the first time and from the cache.
func TestFramePointerStacks(t *testing.T) {
	p := newTwoTables(defaultStackDepth)
	paths := callPaths(p)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range paths {
			if !yield(n) {
				return
			}
		}
	})
	for round := range 3 {
		unwinds := p.fast.unwind
		for _, name := range names {
			p.got = p.got[:0]
			paths[name]()
			if len(p.got) == 0 {
				t.Fatalf("%s: no stack captured", name)
			}
			for _, ids := range p.got {
				fast, slow := p.fastSink.stack(ids[0]), p.slowSink.stack(ids[1])
				if fast != slow || fast == "" {
					t.Errorf("round %d, %s: frame-pointer stack\n%s\n\nruntime.Callers stack\n%s", round, name, fast, slow)
				}
				if ids[0] != ids[1] {
					t.Errorf("round %d, %s: stack IDs %d and %d differ", round, name, ids[0], ids[1])
				}
			}
		}
		if !framePointers || round == 0 {
			continue
		}
		// A chain seen before is found in the cache: only the chain too long to walk needs runtime.Callers.
		if got := p.fast.unwind - unwinds; got != 1 {
			t.Errorf("round %d: %d runtime.Callers calls, want 1 (the stack past the chain limit)", round, got)
		}
	}
	if got, want := len(p.fastSink.stacks), len(p.slowSink.stacks); got != want {
		t.Errorf("%d distinct stacks by frame pointers, %d by runtime.Callers", got, want)
	}

	// Stacks deeper than the depth keep their innermost frames: leaf and nested.
	p.got = p.got[:0]
	paths["past depth"]()
	if frames := strings.Split(p.fastSink.stack(p.got[0][0]), "\n"); len(frames) != defaultStackDepth ||
		!strings.Contains(frames[0], "twoTables).leaf") || !strings.Contains(frames[len(frames)-1], "tracer.nested") {
		t.Errorf("a stack past the depth has %d frames, from %s to %s; want %d, from leaf to nested",
			len(frames), frames[0], frames[len(frames)-1], defaultStackDepth)
	}
}

// TestWalkFramesStopsOffTheStack: the walk follows a chain that ends in a nil frame pointer, and stops,
// without following it, at one that points down the stack or further up than a goroutine's stack reaches.
func TestWalkFramesStopsOffTheStack(t *testing.T) {
	// A fake stack of three frames, each two words: the caller's frame pointer, then the return address.
	mem := make([]uintptr, 6)
	at := func(i int) uintptr { return uintptr(unsafe.Pointer(&mem[i])) }
	cases := map[string]struct {
		last      uintptr // the outermost frame's saved frame pointer
		wantWhole bool
	}{
		"ends":           {0, true},
		"points down":    {at(0), false},
		"points at self": {at(4), false},
		"leaves":         {at(4) + maxGoroutineStack + 64, false},
	}
	for name, c := range cases {
		t.Run(name, func(t *testing.T) {
			mem[0], mem[1] = at(2), 0x1001
			mem[2], mem[3] = at(4), 0x1002
			mem[4], mem[5] = c.last, 0x1003
			chain := make([]uintptr, 8)
			n, _, whole := walkFrames(unsafe.Pointer(&mem[0]), chain)
			if n != 3 || whole != c.wantWhole || !slices.Equal(chain[:n], []uintptr{0x1001, 0x1002, 0x1003}) {
				t.Errorf("walk = %#x, whole %v; want the three return addresses, whole %v", chain[:n], whole, c.wantWhole)
			}
		})
	}
}
