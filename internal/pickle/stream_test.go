package pickle

import (
	"bytes"
	"errors"
	"io"
	"math"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/oomdbg/oomdbg/internal/torchtest"
)

// streamInputs returns the pickles the stream tests read: the real snapshots and every pickle of
// testdata/python.
func streamInputs(t *testing.T) map[string][]byte {
	t.Helper()
	in := map[string][]byte{}
	for _, name := range torchtest.Fixtures {
		if data := torchtest.OptionalFixture(t, name); data != nil {
			in[name] = data
		}
	}
	files, err := filepath.Glob("testdata/python/*.pickle")
	if err != nil || len(files) < 70 {
		t.Fatalf("expected the pickles of testdata/gen.py, found %d (%v)", len(files), err)
	}
	for _, f := range files {
		in[filepath.Base(f)] = mustRead(t, f)
	}
	return in
}

// smallReads hands out its input a few bytes at a time, as a pipe written in small pieces does: 1 to 17
// bytes per Read, chosen by a seeded generator.
type smallReads struct {
	data []byte
	rng  *rand.Rand
}

func (r *smallReads) Read(p []byte) (int, error) {
	if len(r.data) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), len(r.data), 1+r.rng.IntN(17))
	copy(p, r.data[:n])
	r.data = r.data[n:]
	return n, nil
}

// pipe returns the read end of an OS pipe that a goroutine writes data into in pieces of at most 4 KiB.
func pipe(t *testing.T, data []byte) *os.File {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	go func() {
		defer w.Close()
		for len(data) > 0 {
			n := min(len(data), 4096)
			if _, err := w.Write(data[:n]); err != nil {
				return // the reader stopped early: a failed decode
			}
			data = data[n:]
		}
	}()
	return r
}

// readers are the ways a stream test hands a pickle over.
var readers = map[string]func(t *testing.T, data []byte) io.Reader{
	"one byte per read": func(t *testing.T, data []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
	"small reads":       func(t *testing.T, data []byte) io.Reader { return &smallReads{data, rand.New(rand.NewPCG(1, 2))} },
	"EOF with the data": func(t *testing.T, data []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(data)) },
	"pipe":              func(t *testing.T, data []byte) io.Reader { return pipe(t, data) },
}

// TestStreamAgrees decodes every test pickle and real snapshot from a stream, handed over in small reads
// and through a pipe, and checks the Doc is the one the whole-buffer decode makes, Value for Value (so the
// same values, the same sharing and container IDs) and to the byte of input read.
func TestStreamAgrees(t *testing.T) {
	for name, data := range streamInputs(t) {
		whole, err := DecodeDoc(data)
		if err != nil {
			continue // refused opcodes and self-references: TestStreamErrorsAgree covers failures
		}
		for how, reader := range readers {
			t.Run(name+"/"+how, func(t *testing.T) {
				doc, err := DecodeDocReader(reader(t, data))
				if err != nil {
					t.Fatal(err)
				}
				sameDoc(t, doc, whole)
			})
		}
	}
}

// sameDoc fails unless got and want hold the same Values: the same root, containers of the same contents
// under the same IDs, strs and bytes of the same contents under the same numbers, the same numbers.
func sameDoc(t *testing.T, got, want *Doc) {
	t.Helper()
	if got.Root() != want.Root() || got.Containers() != want.Containers() || got.InputSize() != want.InputSize() {
		t.Fatalf("root %v, %d containers, %d bytes read; want %v, %d, %d",
			got.Root(), got.Containers(), got.InputSize(), want.Root(), want.Containers(), want.InputSize())
	}
	for id := range want.Containers() {
		g, w := got.cont(uint64(id)), want.cont(uint64(id))
		if !slices.Equal(got.elems(g), want.elems(w)) || g.indexed != w.indexed || g.shape != w.shape ||
			!slices.Equal(got.shapeKeys(g), want.shapeKeys(w)) {
			t.Fatalf("container %d: %v (shape %d); want %v (shape %d)", id, got.elems(g), g.shape, want.elems(w), w.shape)
		}
	}
	if len(got.spans) != len(want.spans) {
		t.Fatalf("%d strs and bytes; want %d", len(got.spans), len(want.spans))
	}
	for i, sp := range want.spans {
		if gs := got.spans[i]; string(got.text[gs.off:gs.off+gs.n]) != string(want.text[sp.off:sp.off+sp.n]) {
			t.Fatalf("str or bytes %d differs", i)
		}
	}
	if !slices.Equal(got.wides, want.wides) || !slices.EqualFunc(got.floats, want.floats, sameFloat) ||
		!slices.EqualFunc(got.bigs, want.bigs, func(a, b *big.Int) bool { return a.Cmp(b) == 0 }) {
		t.Fatalf("numbers differ: %v %v %v; want %v %v %v", got.wides, got.floats, got.bigs, want.wides, want.floats, want.bigs)
	}
}

func sameFloat(a, b float64) bool { return math.Float64bits(a) == math.Float64bits(b) }

// TestStreamErrorsAgree checks that a stream fails as the whole-buffer decode does, with the same error at
// the same offset: for every pickle of the test data, every prefix of f7 and of a snapshot-like pickle, and
// every byte of them overwritten.
func TestStreamErrorsAgree(t *testing.T) {
	check := func(t *testing.T, data []byte, what string) {
		t.Helper()
		_, want := DecodeDoc(data)
		_, got := DecodeDocReader(&smallReads{data, rand.New(rand.NewPCG(5, 6))})
		if (want == nil) != (got == nil) || want != nil && want.Error() != got.Error() {
			t.Fatalf("%s: stream: %v; whole buffer: %v", what, got, want)
		}
	}
	for name, data := range streamInputs(t) {
		check(t, data, name)
	}
	for name, data := range map[string][]byte{
		"f7":               torchtest.OptionalFixture(t, torchtest.F7),
		"snapshot_like.p2": mustRead(t, "testdata/python/snapshot_like.p2.pickle"),
	} {
		if data == nil {
			continue
		}
		t.Run(name, func(t *testing.T) {
			for n := range len(data) {
				check(t, data[:n], "cut")
			}
			buf := make([]byte, len(data))
			for i := range data {
				for _, b := range []byte{0x00, 0xff, data[i] ^ 0x80, '(', 'h', '.', opFrame} {
					copy(buf, data)
					buf[i] = b
					check(t, buf, "overwritten")
				}
			}
		})
	}
}

// counting counts the bytes read through it.
type counting struct {
	r io.Reader
	n int64
}

func (c *counting) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestSparseFile hands the stream decoder 2 GiB files that start like a pickle: a file of zeros after the
// PROTO opcode, one whose FRAME claims more than the file holds, and one that declares a 1 GiB str. Each must
// fail after reading no more than it needed, allocating a bounded amount: a buffer for the first two, and
// for the str no more than the memory ceiling allows, whatever the file's size.
func TestSparseFile(t *testing.T) {
	tests := map[string]struct {
		head     string
		lim      Limits
		cause    error
		maxRead  int64 // bytes the decode may read from the file
		maxAlloc uint64
	}{
		"zeros":          {"\x80\x04", Limits{}, ErrMalformed, window, 1 << 20},
		"frame of 2^62":  {"\x80\x04\x95\x00\x00\x00\x00\x00\x00\x00\x40", Limits{}, ErrLimit, 2*frameAhead + window, 8 << 20},
		"str of 1 GiB":   {"\x80\x04X\x00\x00\x00\x40", Limits{MaxMemory: 64 << 20}, ErrMemory, 64 << 20, 128 << 20},
		"str over limit": {"\x80\x04\x8d\x00\x00\x00\x00\x01\x00\x00\x00", Limits{}, ErrLimit, window, 1 << 20},
	}
	for name, tt := range tests {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sparse.pickle")
			f, err := os.Create(path)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if _, err := f.WriteString(tt.head); err != nil {
				t.Fatal(err)
			}
			if err := f.Truncate(2 << 30); err != nil { // what truncate(1) does: a hole, no disk used
				t.Skipf("cannot make a sparse file here: %v", err)
			}
			if _, err := f.Seek(0, io.SeekStart); err != nil {
				t.Fatal(err)
			}
			r := &counting{r: f}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			_, err = tt.lim.DecodeDocReader(r)
			runtime.ReadMemStats(&after)
			var de *DecodeError
			if !errors.Is(err, tt.cause) || !errors.As(err, &de) {
				t.Fatalf("got %v; want a *DecodeError wrapping %v", err, tt.cause)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; r.n > tt.maxRead || alloc > tt.maxAlloc {
				t.Errorf("read %d bytes and allocated %d for a file of 2 GiB; want at most %d and %d", r.n, alloc, tt.maxRead, tt.maxAlloc)
			}
			t.Logf("%v (read %d bytes)", err, r.n)
		})
	}
}

// TestDocFootprint checks that Footprint counts what the Go runtime holds for a Doc: the heap a decoded Doc
// keeps alive, measured by the runtime after a collection, is within a few percent of it.
func TestDocFootprint(t *testing.T) {
	// measure returns the heap that stays alive after decode, and the Doc's Footprint. Nothing of a decode
	// outlives the call, so one measure does not see the last one's Doc.
	measure := func(t *testing.T, decode func() (*Doc, error)) (live, fp int64) {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		doc, err := decode()
		if err != nil {
			t.Fatal(err)
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		runtime.KeepAlive(doc)
		return int64(after.HeapAlloc) - int64(before.HeapAlloc), doc.Footprint()
	}
	for _, name := range []string{torchtest.F3, torchtest.F4, torchtest.F1} {
		data := torchtest.ReadFixture(t, name)
		t.Run(name, func(t *testing.T) {
			for how, decode := range map[string]func() (*Doc, error){
				"slice":  func() (*Doc, error) { return DecodeDoc(data) },
				"stream": func() (*Doc, error) { return DecodeDocReader(bytes.NewReader(data)) },
			} {
				live, fp := measure(t, decode)
				// The runtime rounds each allocation up to a size class (at most an eighth more for large
				// ones) and holds the Doc struct besides; 64 KiB either way is the noise of the test
				// harness's own garbage.
				if live < fp-64<<10 || float64(live) > 1.15*float64(fp)+64<<10 {
					t.Errorf("%s: the runtime holds %d bytes for the Doc; Footprint says %d", how, live, fp)
				}
			}
		})
	}
}

// TestMaxMemory checks the ceiling: a decode fails with ErrMemory (and ErrLimit) exactly when what it holds
// at its peak, its own count, passes MaxMemory; what it holds when done is the Doc, by Footprint, and its
// working state, by capacity.
func TestMaxMemory(t *testing.T) {
	for _, name := range []string{torchtest.F3, torchtest.F4, torchtest.F7} {
		data := torchtest.ReadFixture(t, name)
		for how, dec := range map[string]func(Limits) *decoder{
			"slice": func(l Limits) *decoder {
				d, err := l.withDefaults().slice(data)
				if err != nil {
					t.Fatal(err)
				}
				return d
			},
			"stream": func(l Limits) *decoder {
				d, err := l.withDefaults().stream(bytes.NewReader(data))
				if err != nil {
					t.Fatal(err)
				}
				return d
			},
		} {
			t.Run(name+"/"+how, func(t *testing.T) {
				d := dec(Limits{})
				doc, err := d.decode()
				if err != nil {
					t.Fatal(err)
				}
				working := 8*int64(cap(d.stack)+cap(d.memo)+cap(d.marks)) + 2*int64(cap(d.meta)) + int64(len(d.sparse))*mapEntryBytes
				if d.r != nil {
					working += int64(cap(d.data))
				}
				if d.mem.held != doc.Footprint()+working {
					t.Errorf("held %d at the end; the Doc's footprint %d and the working state %d make %d",
						d.mem.held, doc.Footprint(), working, doc.Footprint()+working)
				}
				peak := d.mem.peak
				if _, err := dec(Limits{MaxMemory: peak}).decode(); err != nil {
					t.Errorf("MaxMemory %d, the peak: %v", peak, err)
				}
				_, err = dec(Limits{MaxMemory: peak - 1}).decode()
				if !errors.Is(err, ErrMemory) || !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "Limits.MaxMemory") {
					t.Errorf("MaxMemory %d, a byte under the peak: %v; want ErrMemory", peak-1, err)
				}
				t.Logf("peak %d bytes for %d of pickle (%.1f per byte); the Doc %d", peak, len(data), float64(peak)/float64(len(data)), doc.Footprint())
			})
		}
	}
}
