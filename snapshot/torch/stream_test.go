package torch

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// streamInputs returns the snapshots the stream tests import: the generation samples of testdata, pickle
// and JSON, and the real snapshots.
func streamInputs(t *testing.T) map[string][]byte {
	t.Helper()
	in := map[string][]byte{}
	files, err := filepath.Glob(filepath.Join("testdata", "snapshots", "*"))
	if err != nil || len(files) < 8 {
		t.Fatalf("testdata/snapshots: %d files (%v)", len(files), err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		in[filepath.Base(f)] = data
	}
	for _, name := range torchtest.Fixtures {
		in[name] = torchtest.ReadFixture(t, name)
	}
	return in
}

// pipeOf returns the read end of an OS pipe that a goroutine writes data into, at most 4 KiB a write.
func pipeOf(t *testing.T, data []byte) *os.File {
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
				return // the import stopped reading: it failed
			}
			data = data[n:]
		}
	}()
	return r
}

// TestImportReaderAgrees imports every sample and real snapshot from a pipe, one byte per read, and the
// readers whose size the decoder reads (a file, a bytes.Reader), and checks the snapshot is the one Import
// makes of the same bytes.
func TestImportReaderAgrees(t *testing.T) {
	for name, data := range streamInputs(t) {
		want, err := Import(data)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		for how, r := range map[string]func() io.Reader{
			"pipe":                func() io.Reader { return pipeOf(t, data) },
			"one byte per read":   func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) },
			"bufio over a pipe":   func() io.Reader { return bufio.NewReaderSize(pipeOf(t, data), 16) },
			"bytes.Reader, sized": func() io.Reader { return bytes.NewReader(data) },
			"file, sized": func() io.Reader {
				path := filepath.Join(t.TempDir(), "snapshot")
				if err := os.WriteFile(path, data, 0o600); err != nil {
					t.Fatal(err)
				}
				f, err := os.Open(path)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { f.Close() })
				return f
			},
		} {
			t.Run(name+"/"+how, func(t *testing.T) {
				got, err := ImportReader(r())
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatal("the stream's snapshot differs from Import's")
				}
			})
		}
	}
}

// TestImportReaderErrorsAgree cuts snapshots at every length and checks ImportReader fails as Import does.
func TestImportReaderErrorsAgree(t *testing.T) {
	for _, name := range []string{"g5.pickle", "g0.pickle", "g3.json"} {
		data, err := os.ReadFile(filepath.Join("testdata", "snapshots", name))
		if err != nil {
			t.Fatal(err)
		}
		t.Run(name, func(t *testing.T) {
			for n := range len(data) {
				_, want := Import(data[:n])
				_, got := ImportReader(iotest.HalfReader(bytes.NewReader(data[:n])))
				if (got == nil) != (want == nil) || got != nil && got.Error() != want.Error() {
					t.Fatalf("cut at %d: ImportReader: %v; Import: %v", n, got, want)
				}
			}
		})
	}
}

// TestSparseFile opens a 2 GiB file that starts like a pickle and is zeros after (a sparse file, as
// truncate(1) makes it): the import must fail at the first zero, having read a few KiB and allocated what
// a decoder starts with.
func TestSparseFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "sparse.pickle")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString("\x80\x04"); err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(2 << 30); err != nil {
		t.Skipf("cannot make a sparse file here: %v", err)
	}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, err = ImportFile(path)
	runtime.ReadMemStats(&after)
	var ie *ImportError
	if !errors.Is(err, ErrMalformed) || !errors.As(err, &ie) || ie.Offset != 2 || !strings.Contains(err.Error(), "unknown opcode") {
		t.Fatalf("got %v; want an unknown opcode at offset 2", err)
	}
	if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 2<<20 { // the decoder starts sized for 256 KiB
		t.Errorf("allocated %d bytes to reject a 2 GiB file at offset 2", alloc)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	r := &countingReader{r: f}
	if _, err := ImportReader(r); !errors.Is(err, ErrMalformed) {
		t.Fatal(err)
	}
	if r.n > 64<<10 {
		t.Errorf("read %d bytes to reject a file at offset 2", r.n)
	}
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// TestMaxMemory checks the ceiling on the part of an import after the decode (the pickle package checks the
// decode's): an import succeeds with MaxMemory at the most it counted holding, and fails with ErrMemory, which
// is also an ErrLimit, a byte below.
func TestMaxMemory(t *testing.T) {
	for name, data := range map[string][]byte{"f3": torchtest.ReadFixture(t, torchtest.F3), "f4": torchtest.ReadFixture(t, torchtest.F4), "f1": torchtest.ReadFixture(t, torchtest.F1)} {
		t.Run(name, func(t *testing.T) {
			peak := func(max int64) (int64, error) {
				doc, err := pickle.DecodeDoc(data)
				if err != nil {
					t.Fatal(err)
				}
				c := newConfig([]Option{WithLimits(Limits{MaxMemory: max})})
				im := newImporter(doc, Origin{Format: "pickle"}, c, doc.InputSize())
				_, err = im.run()
				return im.mem.peak, err
			}
			p, err := peak(0)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := peak(p); err != nil {
				t.Errorf("MaxMemory %d, the peak: %v", p, err)
			}
			_, err = peak(p - 1)
			var me *MemoryError
			if !errors.Is(err, ErrMemory) || !errors.Is(err, ErrLimit) || !strings.Contains(err.Error(), "Limits.MaxMemory") ||
				!errors.As(err, &me) || me.Held+me.More != p || me.Max != p-1 {
				t.Errorf("MaxMemory a byte under the peak %d: %v; want ErrMemory, needing the peak", p, err)
			}
			t.Logf("peak %d bytes for %d of pickle", p, len(data))
		})
	}
	// Through the public entry points: the decode's ceiling and the import's are one.
	data := torchtest.ReadFixture(t, torchtest.F3)
	for _, max := range []int64{1 << 10, 1 << 20, 4 << 20} {
		_, err := ImportReader(bytes.NewReader(data), WithLimits(Limits{MaxMemory: max}))
		var ie *ImportError
		var me *MemoryError
		if !errors.Is(err, ErrMemory) || !errors.As(err, &ie) || !errors.As(err, &me) || me.Held+me.More <= max || me.Max != max {
			t.Errorf("f3 (2.4 MB) within %d bytes: %v; want a *MemoryError over it", max, err)
		}
	}
	if _, err := ImportReader(bytes.NewReader(data), WithLimits(Limits{MaxMemory: 64 << 20})); err != nil {
		t.Errorf("f3 within 64 MiB: %v", err)
	}
}

// writeTrace writes a pickle of a snapshot with n trace entries, as pickle.dump writes PyTorch's: protocol
// 4, every dict and str memoized, each frame dict and traceback shared through the memo. Blocks cycle over
// a few hundred addresses of one segment, allocated and freed in turn.
func writeTrace(w io.Writer, n int) error {
	bw := bufio.NewWriter(w)
	memo := 0
	put := func() { bw.WriteByte(0x94); memo++ } // MEMOIZE
	get := func(i int) {
		bw.WriteByte('j') // LONG_BINGET
		bw.Write([]byte{byte(i), byte(i >> 8), byte(i >> 16), byte(i >> 24)})
	}
	str := func(s string) { bw.WriteByte(0x8c); bw.WriteByte(byte(len(s))); bw.WriteString(s); put() }
	long := func(v int64) {
		bw.WriteByte(0x8a) // LONG1 of 8 bytes
		bw.WriteByte(8)
		for i := range 8 {
			bw.WriteByte(byte(v >> (8 * i)))
		}
	}
	bw.WriteString("\x80\x04}")
	put()
	keys := map[string]int{}
	key := func(s string) {
		if i, ok := keys[s]; ok {
			get(i)
			return
		}
		keys[s] = memo
		str(s)
	}
	// The traceback every entry shares: three frames.
	bw.WriteString("(")
	key("device_traces")
	bw.WriteString("](]") // the list of devices, and device 0's entries
	put()
	bw.WriteString("]")
	put()
	frames := memo - 1
	bw.WriteString("(")
	for i := range 3 {
		bw.WriteString("}(")
		key("filename")
		str("/src/train.py")
		key("line")
		long(int64(10 * (i + 1)))
		key("name")
		str("step" + strconv.Itoa(i))
		bw.WriteString("u")
		put()
	}
	bw.WriteString("e0") // the frames are in the memo: off the stack
	for i := range n {
		if i%1000 == 0 {
			if i > 0 {
				bw.WriteString("e")
			}
			bw.WriteString("(")
		}
		act := []string{"alloc", "free_requested", "free_completed"}[i%3]
		bw.WriteString("}")
		put()
		bw.WriteString("(")
		key("action")
		key(act)
		key("addr")
		long(1<<32 + int64(i/3%256)*4096)
		key("size")
		long(4096)
		key("stream")
		long(0)
		key("time_us")
		long(1_700_000_000_000_000 + int64(i))
		key("frames")
		get(frames)
		bw.WriteString("u")
	}
	if n > 0 {
		bw.WriteString("e")
	}
	bw.WriteString("eu.")
	return bw.Flush()
}

// TestWriteTrace checks the generated pickle is a snapshot the importer reads as written.
func TestWriteTrace(t *testing.T) {
	var buf bytes.Buffer
	if err := writeTrace(&buf, 2500); err != nil {
		t.Fatal(err)
	}
	s, err := Import(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	o, _ := OriginOf(s)
	if o.TraceEntries != 2500 || s.Footer.Summary.ByAction["alloc"] != 834 || s.Footer.Summary.ByAction["free_completed"] != 833 {
		t.Fatalf("%d entries, %v", o.TraceEntries, s.Footer.Summary.ByAction)
	}
	if st := s.Stacks[s.Events.At(s.Events.Len()-1).Stack]; len(st) != 3 || s.Strings[s.Frames[st[0]].Function] != "step0" {
		t.Fatalf("stack %v", st)
	}
}

// TestMemoryCeilingHolds is the ceiling measured by the operating system: a child process imports a
// generated snapshot of 400,000 entries streamed through a pipe, with MaxMemory and the runtime's memory
// limit set to the same figure, and its peak resident memory is compared with it. Above the most the import
// counted holding it succeeds; below, it fails with ErrMemory (in the decode at half of it, where the peak
// falls just under it); either way it stays under the ceiling plus what any Go program holds besides
// (the runtime, the test binary).
func TestMemoryCeilingHolds(t *testing.T) {
	if n := os.Getenv("OOMDBG_TORCH_CEILING"); n != "" {
		max, _ := strconv.ParseInt(n, 10, 64)
		debug.SetMemoryLimit(max + ceilingSlack/2)
		r, w := io.Pipe()
		go func() { w.CloseWithError(writeTrace(w, ceilingEntries)) }()
		_, err := ImportReader(r, WithLimits(Limits{MaxMemory: max}))
		// The peak resident memory since exec; rusage would count the parent's too, inherited at the fork.
		status, _ := os.ReadFile("/proc/self/status")
		fmt.Printf("result: %v\n%s\n", err, regexp.MustCompile(`VmHWM:\s*\d+ kB`).Find(status))
		os.Exit(0)
	}
	if testing.Short() {
		t.Skip("imports 400,000 entries three times in child processes")
	}
	if raceEnabled {
		t.Skip("the race detector's shadow memory would be resident too")
	}
	// The most the import counts holding, from an import in this process.
	var buf bytes.Buffer
	if err := writeTrace(&buf, ceilingEntries); err != nil {
		t.Fatal(err)
	}
	doc, err := pickle.DecodeDoc(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	im := newImporter(doc, Origin{Format: "pickle"}, newConfig(nil), doc.InputSize())
	if _, err := im.run(); err != nil {
		t.Fatal(err)
	}
	peak := im.mem.peak
	t.Logf("a %d-byte pickle: the import counts %d bytes at its peak", buf.Len(), peak)
	buf = bytes.Buffer{}
	for _, tc := range []struct {
		max  int64
		want string
	}{{peak + peak/4, "result: <nil>"}, {peak - peak/16, "memory ceiling reached"}, {peak / 2, "memory ceiling reached"}} {
		cmd := exec.Command(os.Args[0], "-test.run=^TestMemoryCeilingHolds$")
		cmd.Env = append(os.Environ(), "OOMDBG_TORCH_CEILING="+strconv.FormatInt(tc.max, 10))
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("child: %v\n%s", err, out)
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("within %d bytes: %s; want %q", tc.max, out, tc.want)
		}
		m := regexp.MustCompile(`VmHWM:\s*(\d+) kB`).FindSubmatch(out)
		if m == nil {
			t.Skipf("no VmHWM in the child's /proc/self/status: %s", out)
		}
		kb, _ := strconv.ParseInt(string(m[1]), 10, 64)
		rss := kb << 10
		t.Logf("within %d bytes: peak resident %d bytes; %s", tc.max, rss, strings.Split(string(out), "\n")[0])
		if rss > tc.max+ceilingSlack {
			t.Errorf("within %d bytes: peak resident memory %d, more than the ceiling and %d of slack", tc.max, rss, int64(ceilingSlack))
		}
	}
}

const (
	ceilingEntries = 400_000
	ceilingSlack   = 48 << 20 // a Go test binary's own resident memory, and the runtime's outside its heap
)

// TestRepeatedEntryRefusedBeforeItIsRead: a pickle whose trace is one entry referenced 200,000 times through
// the memo takes 1 MB and decodes to a few megabytes, but imports to hundreds of bytes an entry. Under a
// ceiling it cannot fit, the import fails as soon as the trace's length is known, before any entry is read,
// saying what all of them would need; the same holds for what the caller's analysis would take at
// EventBytes an event. With the ceiling at what the refusal said it needs, the import succeeds and counts no
// more than that.
func TestRepeatedEntryRefusedBeforeItIsRead(t *testing.T) {
	const n = 200_000
	data := snapshottest.RepeatedEntry(n, 0)
	for name, lim := range map[string]Limits{
		"the import's own peak":         {MaxMemory: 32 << 20},
		"the analysis after the import": {MaxMemory: 256 << 20, EventBytes: 2000},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := Import(data, WithLimits(lim))
			var me *MemoryError
			if !errors.As(err, &me) || !strings.HasPrefix(me.What, fmt.Sprintf("importing %d trace entries", n+1)) {
				t.Fatalf("err = %v; want a *MemoryError from importing the %d entries, before any is read", err, n+1)
			}
			if me.Held+me.More <= lim.MaxMemory {
				t.Errorf("needs %d bytes, not more than the ceiling %d", me.Held+me.More, lim.MaxMemory)
			}
		})
	}
	_, err := Import(data, WithLimits(Limits{MaxMemory: 32 << 20}))
	var me *MemoryError
	errors.As(err, &me)
	need := me.Held + me.More
	doc, err := pickle.DecodeDoc(data)
	if err != nil {
		t.Fatal(err)
	}
	im := newImporter(doc, Origin{Format: "pickle"}, newConfig([]Option{WithLimits(Limits{MaxMemory: need})}), doc.InputSize())
	s, err := im.run()
	if err != nil || s.Events.Len() != n+1 {
		t.Fatalf("within the %d bytes the refusal named: %v", need, err)
	}
	if im.mem.peak > need {
		t.Errorf("counted %d bytes at the peak, more than the %d the refusal named", im.mem.peak, need)
	}
}
