package tracer

import (
	"runtime"
	"strings"
	"unsafe"

	"github.com/oomdbg/oomdbg/snapshot"
)

const (
	defaultStackDepth = 48
	modulePath        = "github.com/oomdbg/oomdbg/"
)

// defaultSkippedFrames are left out of every stack: the frames of the allocator model and of this package say
// how memory was handed out, not who asked for it, and the runtime's own frames say nothing to a user.
var defaultSkippedFrames = []string{
	"runtime.",
	modulePath + "tracer.",
	modulePath + "workloads/alloc.",
}

// stackTable captures Go stacks and interns them by their program counters.
type stackTable struct {
	sink  Sink
	skip  []string
	pcs   []uintptr                   // scratch for runtime.Callers
	ids   map[string]snapshot.StackID // key: the PCs' bytes
	frame []snapshot.FrameID          // scratch for symbolising
}

func newStackTable(sink Sink, depth int, skip []string) *stackTable {
	return &stackTable{
		sink: sink,
		skip: skip,
		pcs:  make([]uintptr, depth),
		ids:  make(map[string]snapshot.StackID),
	}
}

// capture returns the ID of the calling goroutine's stack, skipping skip frames as runtime.Callers does.
// A stack seen before costs the walk and one map lookup; no allocation.
func (t *stackTable) capture(skip int) snapshot.StackID {
	n := runtime.Callers(skip, t.pcs)
	if n == 0 {
		return 0
	}
	// Key the map by the PCs' bytes: the conversion in the index expression does not allocate.
	key := unsafe.String((*byte)(unsafe.Pointer(&t.pcs[0])), n*int(unsafe.Sizeof(uintptr(0))))
	if id, ok := t.ids[key]; ok {
		return id
	}
	id := t.intern(t.pcs[:n])
	t.ids[strings.Clone(key)] = id
	return id
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
