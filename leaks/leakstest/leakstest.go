// Package leakstest records oomdbg's training workload in tests, so that a test can check a configuration
// for leaks in a line:
//
//	func TestNoLeak(t *testing.T) {
//		t.Parallel()
//		cfg := train.DefaultMLP()
//		cfg.Steps = 8
//		leakstest.CheckWorkload(t, cfg)
//	}
//
// Recordings are reproducible: the same configuration gives the same snapshot bytes (a fixed clock, creation
// time, host and tool version), so they can serve as golden fixtures. Every call records into its own
// buffers: tests using the package may run in parallel.
package leakstest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Created, Host and ToolVersion are what reproducible recordings say about when, where and by what they
// were made.
var (
	Created     = time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	Host        = "test"
	ToolVersion = "test"
)

// TB is the part of testing.TB the package uses; *testing.T and *testing.B are TBs.
type TB interface {
	Helper()
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}

// Record runs cfg and returns its snapshot, read back from the bytes a file would hold. It fails t when the
// configuration cannot run. A run that ends in an OOM is recorded as it is.
func Record(t TB, cfg train.Config) *snapshot.Snapshot {
	t.Helper()
	data, _, err := Encode(context.Background(), cfg)
	if err != nil {
		t.Fatalf("recording the workload: %v", err)
		return nil // for a TB whose Fatalf returns
	}
	s, err := snapshot.Read(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("reading the recording back: %v", err)
		return nil
	}
	return s
}

// CheckWorkload records cfg and checks it with leaks.Check.
func CheckWorkload(t TB, cfg train.Config, opts ...leaks.Option) {
	t.Helper()
	if s := Record(t, cfg); s != nil {
		leaks.Check(t, s, opts...)
	}
}

// Encode runs cfg and returns its snapshot file and the run's result. The bytes depend on cfg and the code
// that runs it alone, not on the caller: events are stamped by a clock that ticks 100 ns per event, the
// metadata carries Created, Host and ToolVersion, and stacks stop below this package.
func Encode(ctx context.Context, cfg train.Config) ([]byte, *train.Result, error) {
	var raw bytes.Buffer
	res, err := train.Record(ctx, cfg, &raw, train.RecordOptions{ToolVersion: ToolVersion, Tracer: []tracer.Option{Clock()}})
	if err != nil {
		return nil, nil, err
	}
	s, err := snapshot.Read(&raw)
	if err != nil {
		return nil, nil, err
	}
	s.Meta.Created, s.Meta.Host = Created, Host
	trimStacks(s, false)
	var out bytes.Buffer
	if err := Rewrite(&out, s); err != nil {
		return nil, nil, err
	}
	return out.Bytes(), res, nil
}

// trimStacks cuts every stack at this package's first frame, leaving out the caller's test and the test
// runner (and the package's own frame unless keep), and renumbers the stacks that became equal.
func trimStacks(s *snapshot.Snapshot, keep bool) {
	const self = "github.com/oomdbg/oomdbg/leaks/leakstest."
	ids := map[string]snapshot.StackID{}
	remap := make([]snapshot.StackID, len(s.Stacks))
	stacks := [][]snapshot.FrameID{nil}
	for id, st := range s.Stacks[1:] {
		for i, f := range st {
			if strings.HasPrefix(s.String(s.Frame(f).Function), self) {
				if keep {
					i++
				}
				st = st[:i]
				break
			}
		}
		key := fmt.Sprint(st)
		nid, ok := ids[key]
		if !ok {
			nid = snapshot.StackID(len(stacks))
			ids[key] = nid
			stacks = append(stacks, st)
		}
		remap[id+1] = nid
	}
	s.Stacks = stacks
	s.Events.MapStacks(func(id snapshot.StackID) snapshot.StackID { return remap[id] })
}

// Clock returns a tracer clock that advances 100 ns per reading, for reproducible recordings.
func Clock() tracer.Option {
	var now int64
	return tracer.WithClock(func() int64 { now += 100; return now })
}

// Rewrite writes s as a snapshot file: its metadata, its events, the strings, frames and stacks they use
// (interned as the events need them, so entries no event uses are left out), and its footer.
func Rewrite(w io.Writer, s *snapshot.Snapshot) error {
	sw, err := snapshot.NewWriter(w, s.Meta)
	if err != nil {
		return err
	}
	strs := map[snapshot.StringID]snapshot.StringID{0: 0}
	str := func(id snapshot.StringID) snapshot.StringID {
		n, ok := strs[id]
		if !ok {
			n = sw.InternString(s.String(id))
			strs[id] = n
		}
		return n
	}
	stacks := map[snapshot.StackID]snapshot.StackID{0: 0}
	var frames []snapshot.FrameID
	for _, e := range s.Events.All() {
		e.Scope, e.Label, e.Text = str(e.Scope), str(e.Label), str(e.Text)
		st, ok := stacks[e.Stack]
		if !ok {
			frames = frames[:0]
			for _, f := range s.Stack(e.Stack) {
				fr := s.Frame(f)
				frames = append(frames, sw.InternFrame(s.String(fr.Function), s.String(fr.File), int(fr.Line)))
			}
			st = sw.InternStack(frames)
			stacks[e.Stack] = st
		}
		e.Stack = st
		if err := sw.Write(&e); err != nil {
			return err
		}
	}
	return sw.Close(s.Footer)
}

// Fragmentation records a loop whose allocated memory stays flat while its reserved memory grows every
// iteration: the pattern of variable-length batches. Each iteration allocates an activation a little
// larger than any before it; the caching allocator cannot serve it from the segments it cached (each is too
// small) and takes a new one from the device. The model's weights stay allocated throughout.
func Fragmentation(t TB, iterations int) *snapshot.Snapshot {
	t.Helper()
	var buf bytes.Buffer
	if err := EncodeFragmentation(&buf, iterations); err != nil {
		t.Fatalf("recording the fragmentation loop: %v", err)
		return nil
	}
	s, err := snapshot.Read(&buf)
	if err != nil {
		t.Fatalf("reading the recording back: %v", err)
		return nil
	}
	return s
}

// EncodeFragmentation writes the snapshot Fragmentation reads. Like Encode's, its bytes do not depend on the
// caller.
func EncodeFragmentation(w io.Writer, iterations int) error {
	var raw bytes.Buffer
	if err := recordFragmentation(&raw, iterations); err != nil {
		return err
	}
	s, err := snapshot.Read(&raw)
	if err != nil {
		return err
	}
	trimStacks(s, true)
	return Rewrite(w, s)
}

func recordFragmentation(w io.Writer, iterations int) error {
	const capacity, context = 24 << 30, 512 << 20
	meta := snapshot.Meta{
		Tool: "oomdbg", ToolVersion: ToolVersion, Created: Created, Host: Host, Source: "oomdbg", TimeUnit: "ns",
		Devices: []snapshot.DeviceInfo{{Index: 0, Name: "simulated GPU (meta)", Kind: "meta", Capacity: capacity, ContextReserve: context}},
	}
	sw, err := snapshot.NewWriter(w, meta)
	if err != nil {
		return err
	}
	rec := tracer.New(sw, Clock())
	cfg, _ := allocator.ParseConfig("")
	a := allocator.New(allocator.NewSimDevice(0, capacity, context), cfg)
	a.SetObserver(rec)

	rec.TagNextAlloc(snapshot.CategoryParameter, "f32[1024,1024] weight")
	weight, err := a.Malloc(4<<20, 0)
	if err != nil {
		return err
	}
	for i := range iterations {
		rec.BeginIteration(i)
		rec.SetPhase(snapshot.PhaseData)
		seq := 1000 + 200*i // tokens in this batch: every batch is longer than the last
		rec.TagNextAlloc(snapshot.CategoryInput, fmt.Sprintf("i64[16,%d] batch", seq))
		batch, err := a.Malloc(uint64(16*seq*8), 0)
		if err != nil {
			return err
		}
		rec.SetPhase(snapshot.PhaseForward)
		rec.TagNextAlloc(snapshot.CategoryActivation, fmt.Sprintf("f32[16,%d,1024] hidden", seq))
		hidden, err := a.Malloc(uint64(16*seq*1024*4), 0)
		if err != nil {
			return err
		}
		rec.SetPhase(snapshot.PhaseBackward)
		if err := a.Free(hidden); err != nil {
			return err
		}
		if err := a.Free(batch); err != nil {
			return err
		}
		rec.HeapDump("iteration end", []tracer.Retainer{{Holder: 1, Description: "model.weight", Addr: weight}})
	}
	segs := a.Segments()
	out := make([]snapshot.Segment, len(segs))
	for i, s := range segs {
		blocks := make([]snapshot.Block, len(s.Blocks))
		for j, b := range s.Blocks {
			blocks[j] = snapshot.Block{Addr: b.Addr, Size: int64(b.Size), Requested: int64(b.Requested), State: b.State}
		}
		out[i] = snapshot.Segment{Device: s.Device, Stream: s.Stream, Addr: s.Addr, Size: int64(s.Size), Pool: s.Pool,
			Expandable: s.Expandable, Blocks: blocks}
	}
	return rec.Close(out)
}
