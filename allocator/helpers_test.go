package allocator

import (
	"fmt"
	"strings"
	"testing"
)

const (
	kib = 1 << 10
	gib = 1 << 30
)

// traceEvent is one Observer call.
type traceEvent struct {
	Action    string
	Stream    int64
	Addr      uint64
	Size      uint64 // requested (alloc/free), segment or mapped bytes, rounded request (oom)
	Block     uint64 // block size (alloc/free); alloc size (oom)
	Free      uint64 // device free (oom)
	Requested uint64
}

func (e traceEvent) String() string {
	switch e.Action {
	case "alloc", "free_requested", "free_completed":
		return fmt.Sprintf("%s s%d %#x %d/%d", e.Action, e.Stream, e.Addr, e.Size, e.Block)
	case "oom":
		return fmt.Sprintf("oom s%d %d alloc=%d free=%d", e.Stream, e.Size, e.Block, e.Free)
	}
	return fmt.Sprintf("%s s%d %#x %d", e.Action, e.Stream, e.Addr, e.Size)
}

// recorder is an Observer that keeps every event.
type recorder struct {
	events []traceEvent
}

func (r *recorder) Alloc(_ int, s int64, addr, requested, block uint64) {
	r.events = append(r.events, traceEvent{Action: "alloc", Stream: s, Addr: addr, Size: requested, Block: block})
}

func (r *recorder) FreeRequested(_ int, s int64, addr, requested, block uint64) {
	r.events = append(r.events, traceEvent{Action: "free_requested", Stream: s, Addr: addr, Size: requested, Block: block})
}

func (r *recorder) FreeCompleted(_ int, s int64, addr, requested, block uint64) {
	r.events = append(r.events, traceEvent{Action: "free_completed", Stream: s, Addr: addr, Size: requested, Block: block})
}

func (r *recorder) SegmentAlloc(_ int, s int64, addr, size uint64) {
	r.events = append(r.events, traceEvent{Action: "segment_alloc", Stream: s, Addr: addr, Size: size})
}

func (r *recorder) SegmentFree(_ int, s int64, addr, size uint64) {
	r.events = append(r.events, traceEvent{Action: "segment_free", Stream: s, Addr: addr, Size: size})
}

func (r *recorder) SegmentMap(_ int, s int64, addr, size uint64) {
	r.events = append(r.events, traceEvent{Action: "segment_map", Stream: s, Addr: addr, Size: size})
}

func (r *recorder) SegmentUnmap(_ int, s int64, addr, size uint64) {
	r.events = append(r.events, traceEvent{Action: "segment_unmap", Stream: s, Addr: addr, Size: size})
}

func (r *recorder) OOM(_ int, s int64, requested, allocSize, deviceFree uint64) {
	r.events = append(r.events, traceEvent{Action: "oom", Stream: s, Size: requested, Block: allocSize, Free: deviceFree})
}

// since returns the events recorded after the first n, and a mark for the next call.
func (r *recorder) since(n int) []traceEvent { return r.events[n:] }

func (r *recorder) actions(from int) string {
	var parts []string
	for _, e := range r.events[from:] {
		parts = append(parts, e.Action)
	}
	return strings.Join(parts, ",")
}

// env is an allocator on a simulated device with a recorder attached.
type env struct {
	t   testing.TB
	dev *SimDevice
	a   *Allocator
	rec *recorder
}

func newEnv(t testing.TB, capacity, contextReserve uint64, conf string) *env {
	t.Helper()
	cfg, err := ParseConfig(conf)
	if err != nil {
		t.Fatalf("ParseConfig(%q): %v", conf, err)
	}
	return newEnvConfig(t, capacity, contextReserve, cfg)
}

func newEnvConfig(t testing.TB, capacity, contextReserve uint64, cfg Config) *env {
	dev := NewSimDevice(0, capacity, contextReserve)
	a := New(dev, cfg)
	rec := &recorder{}
	a.SetObserver(rec)
	return &env{t: t, dev: dev, a: a, rec: rec}
}

func (e *env) malloc(size uint64, stream int64) uint64 {
	e.t.Helper()
	addr, err := e.a.Malloc(size, stream)
	if err != nil {
		e.t.Fatalf("Malloc(%d, %d): %v", size, stream, err)
	}
	return addr
}

func (e *env) free(addr uint64) {
	e.t.Helper()
	if err := e.a.Free(addr); err != nil {
		e.t.Fatalf("Free(%#x): %v", addr, err)
	}
}

func (e *env) blockSize(addr uint64) uint64 {
	e.t.Helper()
	n, ok := e.a.BlockSize(addr)
	if !ok {
		e.t.Fatalf("BlockSize(%#x): not allocated", addr)
	}
	return n
}

// wantEvents compares events with want, ignoring fields left zero in want except Action.
func wantEvents(t *testing.T, got, want []traceEvent) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d events, want %d:\n got  %v\n want %v", len(got), len(want), got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Action != w.Action ||
			(w.Addr != 0 && g.Addr != w.Addr) ||
			(w.Size != 0 && g.Size != w.Size) ||
			(w.Block != 0 && g.Block != w.Block) ||
			(w.Free != 0 && g.Free != w.Free) ||
			(w.Stream != 0 && g.Stream != w.Stream) {
			t.Fatalf("event %d: got %v, want %v\n all: %v", i, g, w, got)
		}
	}
}
