package snapshot_test

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

func TestRoundTrip(t *testing.T) {
	scripts := map[string]script{
		"every action": everyAction,
		"extremes":     extremes,
		"random":       random(1, 5000),
		"many blocks":  manyBlocks,
		"empty":        func(snapshottest.Sink) []snapshot.Event { return nil },
	}
	options := map[string][]snapshot.WriterOption{
		"defaults":          nil,
		"one event a chunk": {snapshot.WithChunkEvents(1)},
		"7 events a chunk":  {snapshot.WithChunkEvents(7)},
		"stored":            {snapshot.WithCompressionLevel(0), snapshot.WithChunkEvents(100)},
		"fastest":           {snapshot.WithCompressionLevel(1)},
		"best":              {snapshot.WithCompressionLevel(19)},
	}
	footers := map[string]*snapshot.Footer{"footer": testFooter(42), "no footer": nil}
	for name, sc := range scripts {
		for oname, opts := range options {
			for fname, footer := range footers {
				t.Run(name+"/"+oname+"/"+fname, func(t *testing.T) {
					data, want := encode(t, sc, footer, opts...)
					// The format holds any int64; the reader's cap on sizes (TestSizesPastWhatAnyDeviceHolds) is
					// off here, so that the extremes round-trip.
					s := readAll(t, data, snapshot.WithLimits(snapshot.Limits{SizeBytes: -1}))
					sameEvents(t, s.Events, want)
					for i, e := range s.Events.All() {
						if e.Seq != uint64(i) {
							t.Fatalf("event %d has Seq %d", i, e.Seq)
						}
					}
					if !reflect.DeepEqual(s.Footer, footer) {
						t.Errorf("footer = %+v, want %+v", s.Footer, footer)
					}
					if s.Warning != nil {
						t.Errorf("warning on a complete file: %v", s.Warning)
					}
					if !reflect.DeepEqual(s.Meta, testMeta()) {
						t.Errorf("meta = %+v, want %+v", s.Meta, testMeta())
					}
					// Every ID an event uses resolves.
					for _, e := range s.Events.All() {
						for _, id := range []snapshot.StringID{e.Scope, e.Label, e.Text} {
							if id != 0 && s.String(id) == "" {
								t.Fatalf("event %d: string %d does not resolve", e.Seq, id)
							}
						}
						if e.Stack != 0 && len(s.Stack(e.Stack)) == 0 {
							t.Fatalf("event %d: stack %d does not resolve", e.Seq, e.Stack)
						}
					}
				})
			}
		}
	}
}

// TestRoundTripTables checks that tables resolve to what was interned, through Snapshot and Reader.
func TestRoundTripTables(t *testing.T) {
	type frame struct {
		fn, file string
		line     int
	}
	frames := []frame{{"main.main", "main.go", 12}, {"runtime.goexit", "asm.s", 1700}, {"", "", 0}, {"f", "", -3}}
	var ids []snapshot.FrameID
	var stackIDs []snapshot.StackID
	stacks := [][]int{{0, 1}, {1}, {3, 2, 1, 0}}
	data, _ := encode(t, func(s snapshottest.Sink) []snapshot.Event {
		for _, f := range frames {
			ids = append(ids, s.InternFrame(f.fn, f.file, f.line))
		}
		for _, st := range stacks {
			var fs []snapshot.FrameID
			for _, i := range st {
				fs = append(fs, ids[i])
			}
			stackIDs = append(stackIDs, s.InternStack(fs))
		}
		return []snapshot.Event{emit(s, snapshot.Event{Action: snapshot.ActionAlloc, Stack: stackIDs[2]})}
	}, nil)
	s := readAll(t, data)
	r, err := snapshot.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(); err != nil {
		t.Fatal(err)
	}
	for i, f := range frames {
		for name, got := range map[string]snapshot.Frame{"Snapshot": s.Frame(ids[i]), "Reader": r.Frame(ids[i])} {
			if s.String(got.Function) != f.fn || s.String(got.File) != f.file || int(got.Line) != f.line {
				t.Errorf("%s: frame %d = %+v, want %+v", name, ids[i], got, f)
			}
		}
	}
	for i, st := range stacks {
		for name, got := range map[string][]snapshot.FrameID{"Snapshot": s.Stack(stackIDs[i]), "Reader": r.Stack(stackIDs[i])} {
			if len(got) != len(st) {
				t.Fatalf("%s: stack %d has %d frames, want %d", name, stackIDs[i], len(got), len(st))
			}
			for j := range st {
				if got[j] != ids[st[j]] {
					t.Errorf("%s: stack %d frame %d = %d, want %d", name, stackIDs[i], j, got[j], ids[st[j]])
				}
			}
		}
	}
	if s.String(0) != "" || s.Stack(0) != nil || s.String(9999) != "" || s.Stack(9999) != nil || s.Frame(9999) != (snapshot.Frame{}) {
		t.Error("zero and unknown IDs must resolve to zero values")
	}
}

// TestRoundTripGenerated checks the generator's trace against the independently interned truth.
func TestRoundTripGenerated(t *testing.T) {
	leaky := snapshottest.Tiny()
	leaky.LeakLoss = true
	small := snapshottest.GPT2Small()
	small.Iterations = 3
	for name, cfg := range map[string]snapshottest.Config{"tiny": snapshottest.Tiny(), "leaky": leaky, "gpt2-small": small} {
		t.Run(name, func(t *testing.T) {
			want := snapshottest.Trace(cfg)
			var buf bytes.Buffer
			if err := snapshottest.Encode(&buf, cfg); err != nil {
				t.Fatal(err)
			}
			got := readAll(t, buf.Bytes())
			sameEvents(t, got.Events, want.Events.Slice(0, want.Events.Len()))
			for name, pair := range map[string][2]any{
				"strings": {got.Strings, want.Strings}, "frames": {got.Frames, want.Frames},
				"stacks": {got.Stacks, want.Stacks}, "footer": {got.Footer, want.Footer}, "meta": {got.Meta, want.Meta},
			} {
				if !reflect.DeepEqual(pair[0], pair[1]) {
					t.Errorf("%s differ", name)
				}
			}
		})
	}
}

func TestWriterInterning(t *testing.T) {
	w, err := snapshot.NewWriter(io.Discard, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	if id := w.InternString(""); id != 0 {
		t.Errorf(`InternString("") = %d, want 0`, id)
	}
	if id := w.InternStack(nil); id != 0 {
		t.Errorf("InternStack(nil) = %d, want 0", id)
	}
	a, b := w.InternString("a"), w.InternString("b")
	if a != 1 || b != 2 || w.InternString("a") != a {
		t.Errorf("string IDs a=%d b=%d, want dense from 1 and stable", a, b)
	}
	f := w.InternFrame("fn", "file.go", 3)
	if w.InternFrame("fn", "file.go", 3) != f || w.InternFrame("fn", "file.go", 4) == f {
		t.Error("frame IDs must be stable and distinct per line")
	}
	st := w.InternStack([]snapshot.FrameID{f, f})
	if w.InternStack([]snapshot.FrameID{f, f}) != st || w.InternStack([]snapshot.FrameID{f}) == st {
		t.Error("stack IDs must be stable and distinct per frame list")
	}
	// Repeats cost no allocation: the recorder interns on every event.
	frames := []snapshot.FrameID{f, f}
	for name, fn := range map[string]func(){
		"string": func() { w.InternString("a") },
		"frame":  func() { w.InternFrame("fn", "file.go", 3) },
		"stack":  func() { w.InternStack(frames) },
	} {
		if n := testing.AllocsPerRun(100, fn); n != 0 {
			t.Errorf("repeated Intern %s allocates %.0f times", name, n)
		}
	}
}

func TestWriterLimits(t *testing.T) {
	long := strings.Repeat("é", 40000) // 80,000 bytes
	deep := make([]snapshot.FrameID, 3000)
	var id snapshot.StringID
	var sid snapshot.StackID
	data, _ := encode(t, func(s snapshottest.Sink) []snapshot.Event {
		id = s.InternString(long)
		f := s.InternFrame("f", "g", 1)
		for i := range deep {
			deep[i] = f
		}
		sid = s.InternStack(deep)
		return []snapshot.Event{emit(s, snapshot.Event{Action: snapshot.ActionAnnotation, Text: id, Stack: sid})}
	}, nil)
	s := readAll(t, data)
	got := s.String(id)
	if len(got) > snapshot.DefaultLimits().StringBytes || !strings.HasPrefix(long, got) || len(got) < 60000 {
		t.Errorf("long string stored as %d bytes; want a prefix within the limit", len(got))
	}
	if n := len(s.Stack(sid)); n != snapshot.DefaultLimits().StackDepth {
		t.Errorf("deep stack stored with %d frames, want %d", n, snapshot.DefaultLimits().StackDepth)
	}
}

func TestWriterRejects(t *testing.T) {
	w, err := snapshot.NewWriter(io.Discard, testMeta())
	if err != nil {
		t.Fatal(err)
	}
	w.InternString("one")
	for name, e := range map[string]snapshot.Event{
		"invalid action":   {Action: snapshot.ActionInvalid},
		"future action":    {Action: snapshot.Action(snapshot.NumActions)},
		"invalid phase":    {Action: snapshot.ActionAlloc, Phase: snapshot.Phase(snapshot.NumPhases)},
		"invalid category": {Action: snapshot.ActionAlloc, Category: snapshot.Category(200)},
		"undefined scope":  {Action: snapshot.ActionAlloc, Scope: 2},
		"undefined label":  {Action: snapshot.ActionAlloc, Label: 5},
		"undefined text":   {Action: snapshot.ActionAnnotation, Text: 9},
		"undefined stack":  {Action: snapshot.ActionAlloc, Stack: 1},
	} {
		t.Run(name, func(t *testing.T) {
			if err := w.Write(&e); !errors.Is(err, snapshot.ErrInvalidEvent) {
				t.Errorf("Write = %v, want ErrInvalidEvent", err)
			}
		})
	}
	// A rejected event leaves the Writer usable.
	if err := w.Write(&snapshot.Event{Action: snapshot.ActionAlloc, Scope: 1}); err != nil {
		t.Fatalf("valid event after rejected ones: %v", err)
	}
	if w.InternStack([]snapshot.FrameID{42}) != 0 {
		t.Error("a stack of undefined frames must be 0")
	}
	if err := w.Write(&snapshot.Event{Action: snapshot.ActionAlloc}); !errors.Is(err, snapshot.ErrInvalidEvent) {
		t.Errorf("Write after a bad InternStack = %v, want ErrInvalidEvent", err)
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	if err := w.Write(&snapshot.Event{Action: snapshot.ActionAlloc}); !errors.Is(err, snapshot.ErrWriterClosed) {
		t.Errorf("Write after Close = %v, want ErrWriterClosed", err)
	}
	if err := w.Close(nil); !errors.Is(err, snapshot.ErrWriterClosed) {
		t.Errorf("second Close = %v, want ErrWriterClosed", err)
	}
}

// failWriter fails after n bytes, like a full disk.
type failWriter struct{ n int }

func (w *failWriter) Write(p []byte) (int, error) {
	if len(p) > w.n {
		n := w.n
		w.n = 0
		return n, errors.New("no space left on device")
	}
	w.n -= len(p)
	return len(p), nil
}

func TestWriterUnderlyingError(t *testing.T) {
	w, err := snapshot.NewWriter(&failWriter{n: 1000}, testMeta(), snapshot.WithChunkEvents(1))
	if err != nil {
		t.Fatal(err)
	}
	var werr error
	for i := 0; i < 100 && werr == nil; i++ {
		werr = w.Write(&snapshot.Event{Action: snapshot.ActionAlloc, Addr: uint64(i) << 20, Size: int64(i)})
	}
	if werr == nil || !strings.Contains(werr.Error(), "no space") {
		t.Fatalf("Write = %v, want the disk error", werr)
	}
	if err := w.Write(&snapshot.Event{Action: snapshot.ActionAlloc}); err == nil {
		t.Error("the error must stick")
	}
	if err := w.Close(nil); err == nil {
		t.Error("Close after a failed write must fail")
	}
}

// TestChunkBoundaries checks when the Writer writes a chunk out: after phase and iteration markers, when
// full, when old. ReadChunk returns one chunk at a time, so its batches are the chunks.
func TestChunkBoundaries(t *testing.T) {
	ms := int64(1e6)
	tests := map[string]struct {
		opts   []snapshot.WriterOption
		events []snapshot.Event
		want   []int // events per chunk
	}{
		"markers": {
			events: []snapshot.Event{
				{Action: snapshot.ActionAlloc}, {Action: snapshot.ActionPhase, Phase: snapshot.PhaseForward},
				{Action: snapshot.ActionAlloc}, {Action: snapshot.ActionAlloc}, {Action: snapshot.ActionIteration, Iteration: 1},
				{Action: snapshot.ActionAlloc},
			},
			want: []int{2, 3, 1},
		},
		"full": {
			opts:   []snapshot.WriterOption{snapshot.WithChunkEvents(2)},
			events: []snapshot.Event{{Action: snapshot.ActionAlloc}, {Action: snapshot.ActionAlloc}, {Action: snapshot.ActionAlloc}, {Action: snapshot.ActionAlloc}, {Action: snapshot.ActionAlloc}},
			want:   []int{2, 2, 1},
		},
		"age": {
			opts: []snapshot.WriterOption{snapshot.WithChunkAge(100 * 1e6)},
			events: []snapshot.Event{
				{Action: snapshot.ActionAlloc, Time: 0}, {Action: snapshot.ActionAlloc, Time: 50 * ms},
				{Action: snapshot.ActionAlloc, Time: 100 * ms}, {Action: snapshot.ActionAlloc, Time: 150 * ms},
				{Action: snapshot.ActionAlloc, Time: 250 * ms},
			},
			want: []int{3, 2},
		},
		"age off": {
			opts: []snapshot.WriterOption{snapshot.WithChunkAge(0)},
			events: []snapshot.Event{
				{Action: snapshot.ActionAlloc, Time: 0}, {Action: snapshot.ActionAlloc, Time: 1e15},
			},
			want: []int{2},
		},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			w, err := snapshot.NewWriter(&buf, testMeta(), tt.opts...)
			if err != nil {
				t.Fatal(err)
			}
			for _, e := range tt.events {
				if err := w.Write(&e); err != nil {
					t.Fatal(err)
				}
			}
			if err := w.Close(nil); err != nil {
				t.Fatal(err)
			}
			r, err := snapshot.NewReader(&buf)
			if err != nil {
				t.Fatal(err)
			}
			var got []int
			for {
				var ev snapshot.Events
				err := r.ReadChunk(&ev)
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatal(err)
				}
				got = append(got, ev.Len())
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("chunks of %v events, want %v", got, tt.want)
			}
		})
	}
}
