package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// attack is one hostile input of the corpus: a file, or a path with something special behind it.
type attack struct {
	class  string // the kind of attack, for the table
	name   string
	path   string
	fifo   []byte // when set, path is a FIFO and this is written into it for each invocation
	stdin  string // when set, the file given on standard input, with path "-"
	budget string // --max-memory, when not suiteBudget
	// An invocation attack is a whole command line, not a file: args (run as given, or by sh -c with the
	// binary as $0 when shell is set), the exit code it must end with (0, 1 or 2 unless a signal's), and
	// what its output must say (check returns what is wrong, "" when nothing is).
	args  []string
	shell string
	code  int
	check func(o outcome) string
	// runs, when set, are the invocations to make (each given --max-memory), instead of every command's.
	runs [][]string
}

// TestHostileCorpus runs every command that reads a snapshot (report, check, diff, replay, export, view)
// on a corpus of crafted and damaged files, as a subprocess under a memory ceiling and a timeout: zero
// panics, zero hangs, zero exits other than 0, 1 and 2, and every exit 2 a one-line reason. It logs the
// attack table: each class, the cases and invocations tried, the failures, and the worst memory and time.
// OOMDBG_CORPUS_LOG=1 logs every invocation's exit code and first line of stderr; OOMDBG_CORPUS_CLASS=text
// runs only the classes whose name holds the text.
func TestHostileCorpus(t *testing.T) {
	bin := oomdbgBinary(t)
	dir := t.TempDir()
	ref := filepath.Join(dir, "reference.oomdbg")
	attacks := hostileCorpus(t, dir, ref)
	if only := os.Getenv("OOMDBG_CORPUS_CLASS"); only != "" {
		attacks = slices.DeleteFunc(attacks, func(a attack) bool { return !strings.Contains(a.class, only) })
	}

	type job struct {
		a    attack
		args []string
	}
	// What the binary holds on the smallest input in the least memory it may be given (its code, the Go
	// runtime, the reference file): --max-memory budgets what an input makes it hold on top of that, so an
	// invocation is held to 10% over the two together.
	floor := invoke(bin, nil, "report", ref, "--max-memory", "16MiB").peak
	var jobs []job
	for _, a := range invocationAttacks(t, dir, ref) {
		args := a.args
		if a.shell != "" {
			args = []string{a.shell}
		}
		jobs = append(jobs, job{a, args})
	}
	for _, a := range attacks {
		out := filepath.Join(dir, "out", strings.NewReplacer("/", "_", " ", "_").Replace(a.class+"-"+a.name)+".json")
		budget := []string{"--max-memory", cmp.Or(a.budget, suiteBudget)}
		runs := a.runs
		if runs == nil {
			runs = [][]string{
				{"report", a.path},
				{"check", a.path},
				{"diff", a.path, ref},
				{"replay", a.path},
				{"export", a.path, "--format", "torch-json", "-o", out},
				{"whatif", a.path, "--checkpoint", "all", "--batch-scale", "0.5"},
			}
		}
		for _, args := range runs {
			jobs = append(jobs, job{a, append(slices.Clone(args), budget...)})
		}
		if a.class == "special input" || a.class == "decompression bomb" {
			jobs = append(jobs, job{a, []string{"view", a.path}}) // no terminal: one line, exit 2
		}
	}
	if err := os.Mkdir(filepath.Join(dir, "out"), 0o755); err != nil {
		t.Fatal(err)
	}

	type row struct {
		cases       map[string]bool
		invocations int
		failures    []string
		peak        int64
		ratio       float64 // the highest peak memory over --max-memory
		slowest     time.Duration
		exits       [4]int // 0, 1, 2, and a signal's
	}
	var mu sync.Mutex
	table := map[string]*row{}
	work := make(chan job)
	var wg sync.WaitGroup
	for range max(2, runtime.NumCPU()) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for j := range work {
				var o outcome
				if j.a.shell != "" {
					o = invokeShell(bin, j.a.shell)
				} else {
					o = runAttack(bin, j.a, j.args)
				}
				mu.Lock()
				r := table[j.a.class]
				if r == nil {
					r = &row{cases: map[string]bool{}}
					table[j.a.class] = r
				}
				r.cases[j.a.name] = true
				r.invocations++
				r.peak = max(r.peak, o.peak)
				r.slowest = max(r.slowest, o.elapsed)
				if os.Getenv("OOMDBG_CORPUS_LOG") != "" {
					t.Logf("%s/%s: %v -> %d %q", j.a.class, j.a.name, j.args[0], o.code, firstLine(o.stderr))
				}
				f := cmp.Or(j.a.wrongEnd(o), j.a.misleads(j.args[0], o))
				if j.a.args == nil && j.a.shell == "" { // a file's attack, under --max-memory
					budget, _ := units.ParseSize(cmp.Or(j.a.budget, suiteBudget))
					held := (int64(budget) + floor) * 11 / 10
					r.ratio = max(r.ratio, float64(o.peak)/float64(budget))
					if f == "" && o.peak > held {
						f = fmt.Sprintf("peak memory %s, more than 10%% over --max-memory %s and the %s the binary holds on the smallest file",
							units.FormatSize(o.peak), units.FormatSize(int64(budget)), units.FormatSize(floor))
					}
				}
				if f != "" {
					r.failures = append(r.failures, fmt.Sprintf("%s: oomdbg %s: %s", j.a.name, strings.Join(j.args, " "), f))
				} else {
					r.exits[min(o.code, 3)]++
				}
				mu.Unlock()
			}
		}()
	}
	for _, j := range jobs {
		work <- j
	}
	close(work)
	wg.Wait()

	classes := make([]string, 0, len(table))
	for c := range table {
		classes = append(classes, c)
	}
	slices.Sort(classes)
	var b strings.Builder
	fmt.Fprintf(&b, "\n| class | cases | invocations | exit 0/1/2/signal | failures | peak memory | peak / --max-memory | slowest |\n|---|---|---|---|---|---|---|---|\n")
	total, cases := 0, 0
	for _, c := range classes {
		r := table[c]
		fmt.Fprintf(&b, "| %s | %d | %d | %d/%d/%d/%d | %d | %s | %.2f | %v |\n", c, len(r.cases), r.invocations, r.exits[0], r.exits[1], r.exits[2], r.exits[3],
			len(r.failures), units.FormatSize(r.peak), r.ratio, r.slowest.Round(time.Millisecond))
		cases += len(r.cases)
		for _, f := range r.failures {
			t.Error(f)
		}
		total += r.invocations
	}
	t.Logf("%d cases, %d invocations, each under a %s ceiling and a %v timeout, within 10%% of --max-memory "+
		"and the %s the binary holds on the smallest file:%s", cases, total, units.FormatSize(suiteCeiling), suiteTimeout,
		units.FormatSize(floor), b.String())
}

// wrongEnd says what is wrong with how an invocation ended: outcome.failure's rules, and for an invocation
// attack the exit code and the words it must end with.
func (a attack) wrongEnd(o outcome) string {
	if a.args == nil && a.shell == "" {
		return o.failure()
	}
	if o.code == a.code && a.code > 2 { // a signal's exit: failure() would refuse it
		o.code = 0
	}
	if f := o.failure(); f != "" {
		return f
	}
	if o.code != a.code && !(a.code > 2 && o.code == 0) {
		return fmt.Sprintf("exit %d, want %d: %s", o.code, a.code, firstLine(o.stderr))
	}
	if a.check != nil {
		return a.check(o)
	}
	return ""
}

// misleads says what is wrong with what a command said of an attack, beyond the rules every invocation
// keeps (outcome.failure): a recording cut short is said to be cut short, and never blamed on how PyTorch
// records its snapshots.
func (a attack) misleads(command string, o outcome) string {
	if a.class != "truncation" || o.code != exitUsage || command != "replay" && command != "whatif" {
		return ""
	}
	if strings.Contains(o.stderr, "PyTorch") || strings.Contains(o.stderr, "_record_memory_history") ||
		!strings.Contains(o.stderr, "cut short") && !strings.Contains(o.stderr, "truncated") && !strings.Contains(o.stderr, "is empty") {
		return "a recording cut short, blamed on something else: " + firstLine(o.stderr)
	}
	return ""
}

// fifoSeq numbers the FIFOs of the invocations.
var fifoSeq atomic.Int64

// runAttack runs one invocation of the binary on an attack.
func runAttack(bin string, a attack, args []string) outcome {
	switch {
	case a.fifo != nil:
		// A FIFO of its own for each invocation: two readers of one FIFO would share its writers.
		fifo := fmt.Sprintf("%s.%d", a.path, fifoSeq.Add(1))
		if err := syscall.Mkfifo(fifo, 0o644); err != nil {
			return outcome{code: -1, stderr: err.Error()}
		}
		defer os.Remove(fifo)
		args = slices.Clone(args)
		for i := range args {
			if args[i] == a.path {
				args[i] = fifo
			}
		}
		a.path = fifo
		wrote := make(chan struct{})
		go func() {
			defer close(wrote)
			f, err := os.OpenFile(a.path, os.O_WRONLY, 0)
			if err != nil {
				return
			}
			defer f.Close()
			f.Write(a.fifo)
		}()
		o := invoke(bin, nil, args...)
		// A command that never opened the FIFO (view without a terminal) leaves the writer waiting for a
		// reader: be that reader, so that it ends with this invocation.
		if r, err := os.OpenFile(a.path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
			<-wrote
			r.Close()
		}
		return o
	case a.stdin != "":
		f, err := os.Open(a.stdin)
		if err != nil {
			return outcome{code: -1, stderr: err.Error()}
		}
		defer f.Close()
		return invoke(bin, f, args...)
	}
	return invoke(bin, nil, args...)
}

// hostileCorpus writes the corpus into dir, and a valid reference snapshot at ref.
func hostileCorpus(t *testing.T, dir, ref string) []attack {
	t.Helper()
	small, _, err := leakstest.Encode(context.Background(), func() train.Config { c := train.DefaultMLP(); c.Steps = 3; return c }())
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ref, small, 0o644); err != nil {
		t.Fatal(err)
	}
	var attacks []attack
	n := 0
	add := func(class, name string, data []byte) {
		n++
		path := filepath.Join(dir, fmt.Sprintf("%03d.bin", n))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		attacks = append(attacks, attack{class: class, name: name, path: path})
	}
	header := snapshottest.FileHeader(1, []byte(`{"tool":"oomdbg","source":"oomdbg","time_unit":"ns"}`))
	chunks := small[headerLen(small):]

	// Decompression bombs: a few kilobytes that expand to millions of events or megabytes of footer.
	add("decompression bomb", "67M events in 17 KB", snapshottest.Bomb(64, 1<<20))
	add("decompression bomb", "10M events in 2.8 KB", snapshottest.Bomb(10, 1<<20))
	add("decompression bomb", "65M events in 2000 chunks", snapshottest.Bomb(2000, 1<<15))
	add("decompression bomb", "footer of 400k blocks", footerBomb(t))

	// Lengths and counts that claim far more than the file holds.
	huge := uint32(0xFFFF_FFF0)
	metaLen := bytes.Clone(header[:16])
	binary.LittleEndian.PutUint32(metaLen[12:], huge)
	add("huge claimed length", "metadata length", append(metaLen, make([]byte, 64)...))
	add("huge claimed length", "chunk stored length", append(bytes.Clone(header), snapshottest.ChunkHeader(1, 0, huge, huge, 0, nil)...))
	add("huge claimed length", "chunk decoded length", append(bytes.Clone(header), snapshottest.ChunkHeader(1, 1, 100, huge, 0, nil)...))
	add("huge claimed length", "chunk events", append(bytes.Clone(header), snapshottest.ChunkHeader(1, 0, 100, 100, huge, nil)...))
	add("huge claimed length", "chunk within limits, input short", append(bytes.Clone(header), snapshottest.ChunkHeader(1, 0, 60<<20, 60<<20, 0, nil)...))
	tables := func(section []byte) []byte {
		return slices.Concat(header, snapshottest.StoredChunk(1, 0, snapshottest.EventsPayload(section, nil, nil, nil)), snapshottest.EndChunk())
	}
	add("huge claimed length", "string count", tables(binary.AppendUvarint(nil, 1<<40)))
	add("huge claimed length", "string length", tables(binary.AppendUvarint([]byte{1}, 1<<40)))
	add("huge claimed length", "frame count", tables(binary.AppendUvarint([]byte{0}, 1<<40)))
	add("huge claimed length", "stack depth", tables(binary.AppendUvarint([]byte{0, 0, 1}, 1<<40)))
	// A zstd frame whose header asks for a 2 TiB window.
	window := []byte{0x28, 0xb5, 0x2f, 0xfd, 0x00, 0xf8, 0x01, 0x00, 0x00}
	add("huge claimed length", "zstd window", slices.Concat(header, snapshottest.ChunkHeader(1, 1, uint32(len(window)), 1000, 0, window), window))

	// Metadata and footers that lie.
	meta := func(name string, edit func(m map[string]any)) {
		var m map[string]any
		if err := json.Unmarshal(small[16:headerLen(small)-4], &m); err != nil {
			t.Fatal(err)
		}
		edit(m)
		b, err := json.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		add("lies in metadata", name, snapshottest.WithMeta(small, b))
	}
	workload := func(field string, v any) func(map[string]any) {
		return func(m map[string]any) { m["workload"].(map[string]any)[field] = v }
	}
	meta("accum 1e9", workload("accum", 1_000_000_000))
	meta("hidden 2^62", workload("hidden", 1<<62))
	meta("steps 2^40", workload("steps", 1<<40))
	meta("gpu memory 2^64", workload("gpu_memory", json.Number("18446744073709551615")))
	meta("workload not an object", func(m map[string]any) { m["workload"] = "rm -rf /" })
	meta("negative capacity", func(m map[string]any) { m["devices"].([]any)[0].(map[string]any)["capacity"] = -1 })
	meta("capacity past int64", func(m map[string]any) { m["devices"].([]any)[0].(map[string]any)["capacity"] = json.Number("1e30") })
	meta("20k devices", func(m map[string]any) {
		d := m["devices"].([]any)[0]
		m["devices"] = slices.Repeat([]any{d}, 20000)
	})
	meta("time unit", func(m map[string]any) { m["time_unit"] = "fortnights" })
	meta("pytorch source", func(m map[string]any) { m["source"] = "pytorch"; m["workload"] = map[string]any{"format": "pickle"} })
	meta("allocator settings", func(m map[string]any) { m["allocator_settings"] = "expandable_segments:Maybe,max_split_size_mb:-1" })
	meta("metadata an empty object", func(m map[string]any) { clear(m) })
	add("lies in metadata", "metadata not JSON", snapshottest.WithMeta(small, []byte("{\"tool\": ")))
	for name, f := range map[string]snapshot.Footer{
		"footer counts 2^63 events": {Summary: snapshot.Summary{Events: 1 << 63, PeakAllocated: -1, PeakAllocatedSeq: 1 << 62}},
		"footer segment of 2^63-1":  {Segments: []snapshot.Segment{{Addr: 1 << 63, Size: 1<<63 - 1, Blocks: []snapshot.Block{{Addr: 0, Size: -5, State: "weird"}}}}},
		"footer overlapping blocks": {Segments: []snapshot.Segment{{Addr: 4096, Size: 1024, Blocks: slices.Repeat([]snapshot.Block{{Addr: 4096, Size: 1 << 40, State: "active_allocated"}}, 1000)}}},
	} {
		add("lies in metadata", name, withFooter(t, f))
	}

	// Every truncation of a small recording at its framing, and a sample of the rest; byte flips.
	for _, cut := range cutPoints(small) {
		add("truncation", fmt.Sprintf("cut at %d of %d", cut, len(small)), small[:cut])
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 20 {
		flipped := bytes.Clone(small)
		off := rng.IntN(len(flipped))
		if i < 5 {
			off = rng.IntN(headerLen(small)) // the header, metadata and its checksum
		}
		flipped[off] ^= byte(1 + rng.IntN(255))
		add("byte flip", fmt.Sprintf("byte %d", off), flipped)
	}
	add("byte flip", "chunks without a header", chunks)

	// Mutated PyTorch snapshots: the importer's test snapshots and, where present, real ones.
	pickles, _ := filepath.Glob(filepath.Join("..", "..", "snapshot", "torch", "testdata", "snapshots", "*"))
	pickles = append(pickles, realPickles()...)
	if len(pickles) == 0 {
		t.Fatal("no PyTorch snapshots in snapshot/torch/testdata/snapshots")
	}
	for _, p := range pickles {
		data, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Base(p)
		add("mutated pytorch snapshot", name+" as is", data)
		if len(data) > 1<<20 { // a large snapshot takes a second per command: one mutation is enough
			add("mutated pytorch snapshot", name+" cut in half", data[:len(data)/2])
			continue
		}
		for _, k := range []int{1, 5} {
			add("mutated pytorch snapshot", fmt.Sprintf("%s cut at %d/8", name, k), data[:len(data)*k/8])
		}
		for range 3 {
			flipped := bytes.Clone(data)
			off := rng.IntN(len(flipped))
			flipped[off] ^= byte(1 + rng.IntN(255))
			add("mutated pytorch snapshot", fmt.Sprintf("%s byte %d flipped", name, off), flipped)
		}
		if data[0] == 0x80 {
			proto := bytes.Clone(data)
			proto[1] = 9
			add("mutated pytorch snapshot", name+" protocol 9", proto)
		}
	}
	add("crafted pickle", "LONG4 of 2 GiB", []byte("\x80\x04\x8b\xff\xff\xff\x7f."))
	add("crafted pickle", "BINUNICODE8 of 2^62", append([]byte("\x80\x04\x8d"), binary.LittleEndian.AppendUint64(nil, 1<<62)...))
	add("crafted pickle", "GLOBAL os.system", []byte("\x80\x02cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03."))
	add("crafted pickle", "memo read out of range", []byte("\x80\x04h\xff."))
	add("crafted pickle", "a million MARKs", append(append([]byte("\x80\x04"), bytes.Repeat([]byte("("), 1<<20)...), '.'))
	add("crafted pickle", "a million nested lists", append(append([]byte("\x80\x04"), bytes.Repeat([]byte("]"), 1<<20)...), '.'))
	// pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 0, "size": 2**64, "stream": 0}]]}, protocol=2)
	add("crafted pickle", "int past 64 bits as a size", []byte("\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\r\x00\x00\x00device_tracesq\x03]q\x04]q\x05}q\x06(X\x06\x00\x00\x00actionq\x07X\x05\x00\x00\x00allocq\x08X\x04\x00\x00\x00addrq\tK\x00X\x04\x00\x00\x00sizeq\n\x8a\t\x00\x00\x00\x00\x00\x00\x00\x00\x01X\x06\x00\x00\x00streamq\x0bK\x00uaau."))
	// Sizes no device holds: two live blocks of 2^62 bytes made every total wrap to -8 EiB.
	add("sizes that overflow", "two live blocks of 2^62 bytes (pickle)", snapshottest.Pickle(snapshottest.Dict{
		{Key: "segments", Value: []any{}}, {Key: "device_traces", Value: []any{[]snapshottest.Dict{
			{{Key: "action", Value: "alloc"}, {Key: "addr", Value: uint64(1 << 40)}, {Key: "size", Value: int64(1 << 62)}, {Key: "stream", Value: 0}},
			{{Key: "action", Value: "alloc"}, {Key: "addr", Value: uint64(1 << 41)}, {Key: "size", Value: int64(1 << 62)}, {Key: "stream", Value: 0}},
		}}}}))
	var past []snapshottest.Dict
	for i := range 40 {
		past = append(past, snapshottest.Dict{{Key: "action", Value: "alloc"}, {Key: "addr", Value: uint64(i+1) << 50},
			{Key: "size", Value: int64(1 << 50)}, {Key: "stream", Value: 0}})
	}
	add("sizes that overflow", "blocks of 1 PiB adding up past 32 PiB (pickle)", snapshottest.Pickle(snapshottest.Dict{
		{Key: "segments", Value: []any{}}, {Key: "device_traces", Value: []any{past}}}))
	add("sizes that overflow", "two live blocks of 2^62 bytes (oomdbg)", withEvents(t,
		snapshot.Event{Action: snapshot.ActionSegmentAlloc, Addr: 1 << 40, Size: 1 << 62},
		snapshot.Event{Action: snapshot.ActionAlloc, Addr: 1 << 40, Size: 1 << 62, BlockSize: 1 << 62},
		snapshot.Event{Action: snapshot.ActionSegmentAlloc, Addr: 1 << 41, Size: 1 << 62},
		snapshot.Event{Action: snapshot.ActionAlloc, Addr: 1 << 41, Size: 1 << 62, BlockSize: 1 << 62}))
	add("crafted json", "a million nested arrays", bytes.Repeat([]byte("["), 1<<20))
	add("crafted json", "numbers past float64", []byte(`{"segments": [{"device": 0, "address": 1e400, "total_size": 1e30, "blocks": []}]}`))
	add("crafted json", "negative sizes", []byte(`{"segments": [], "device_traces": [[{"action": "alloc", "addr": -1, "size": -5, "stream": 0}]]}`))

	// Special files and streams.
	add("special input", "empty", nil)
	add("special input", "one byte of the magic", []byte{0x89})
	add("special input", "the magic alone", []byte(snapshot.Magic))
	add("special input", "text", []byte("step,loss\n1,2.5\n"))
	attacks = append(attacks, attack{class: "special input", name: "directory", path: dir})
	attacks = append(attacks, attack{class: "special input", name: "/dev/null", path: "/dev/null"})
	attacks = append(attacks, attack{class: "special input", name: "missing", path: filepath.Join(dir, "missing")})
	attacks = append(attacks, attack{class: "special input", name: "FIFO", path: filepath.Join(dir, "fifo"), fifo: small})
	attacks = append(attacks, attack{class: "special input", name: "standard input", path: "-", stdin: ref})
	attacks = append(attacks, attack{class: "special input", name: "/dev/stdin", path: "/dev/stdin", stdin: ref})
	for name, prefix := range map[string][]byte{"sparse 2 GiB pickle": []byte("\x80\x04"), "sparse 2 GiB snapshot": header} {
		n++
		path := filepath.Join(dir, fmt.Sprintf("%03d.bin", n))
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		f.Write(prefix)
		err = f.Truncate(2 << 30)
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		attacks = append(attacks, attack{class: "special input", name: name, path: path})
	}

	// A real recording over the memory budget.
	big, _, err := leakstest.Encode(context.Background(), func() train.Config {
		c, _ := train.PresetConfig("gpt2-small")
		c.Steps, c.GPUMemory = 40, 80<<30
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	add("memory budget", "a recording of 130k events", big)
	add("memory budget", "a recording of 130k events in 16 MiB", big)
	attacks[len(attacks)-1].budget = "16MiB"
	return append(attacks, memoryAttacks(t, dir, &n, small)...)
}

// headerLen is the length of a snapshot's file header.
func headerLen(data []byte) int { return 16 + int(binary.LittleEndian.Uint32(data[12:])) + 4 }

// cutPoints are the truncations of data the corpus tries: through the file header at growing steps, inside
// the header and the payload of every other chunk, and every 251st byte. (snapshot's own tests cut a file
// at every byte in-process; these are the cuts worth a run of every command.)
func cutPoints(data []byte) []int {
	h := headerLen(data)
	set := map[int]bool{}
	for i := 0; i <= h+1; i += 1 + i/8 {
		set[i] = true
	}
	for off, n := h, 0; off+24 <= len(data); n++ {
		if n%2 == 0 {
			set[off+12], set[off+25] = true, true
		}
		off += 24 + int(binary.LittleEndian.Uint32(data[off+4:]))
	}
	for i := 0; i < len(data); i += 251 {
		set[i] = true
	}
	var cuts []int
	for c := range set {
		if c >= 0 && c < len(data) {
			cuts = append(cuts, c)
		}
	}
	slices.Sort(cuts)
	return cuts
}

// footerBomb is a snapshot whose footer, a few hundred kilobytes compressed, decodes to a segment of 400,000
// blocks.
func footerBomb(t *testing.T) []byte {
	blocks := make([]snapshot.Block, 400_000)
	for i := range blocks {
		blocks[i] = snapshot.Block{Addr: uint64(i) << 9, Size: 512, Requested: 512, State: "active_allocated"}
	}
	return withFooter(t, snapshot.Footer{Segments: []snapshot.Segment{{Addr: 0, Size: 400_000 << 9, Pool: "large", Blocks: blocks}}})
}

// withEvents is a snapshot of the given events, each in a chunk of its own, closed without a footer.
func withEvents(t *testing.T, events ...snapshot.Event) []byte {
	var buf bytes.Buffer
	w, err := snapshot.NewWriter(&buf, snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns"}, snapshot.WithChunkEvents(1))
	if err != nil {
		t.Fatal(err)
	}
	for i := range events {
		events[i].Time = int64(i + 1)
		if err := w.Write(&events[i]); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// withFooter is a snapshot of one allocation closed with footer f.
func withFooter(t *testing.T, f snapshot.Footer) []byte {
	var buf bytes.Buffer
	w, err := snapshot.NewWriter(&buf, snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns"})
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range []snapshot.Event{
		{Time: 1, Action: snapshot.ActionSegmentAlloc, Addr: 1 << 21, Size: 2 << 20},
		{Time: 2, Action: snapshot.ActionAlloc, Addr: 1 << 21, Size: 100, BlockSize: 512},
	} {
		if err := w.Write(&e); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Close(&f); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// realPickles returns the real PyTorch snapshots of shared/fixtures/pytorch-snapshots above the package, if
// there are any.
func realPickles() []string {
	dir, err := filepath.Abs(".")
	if err != nil {
		return nil
	}
	for ; filepath.Dir(dir) != dir; dir = filepath.Dir(dir) {
		fx := filepath.Join(dir, "shared", "fixtures", "pytorch-snapshots")
		var out []string
		for _, pat := range []string{"*.pickle", "*.pkl"} {
			m, _ := filepath.Glob(filepath.Join(fx, pat))
			out = append(out, m...)
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// invokeShell runs script with sh -c, the binary as $0, under invoke's ceiling and timeout.
func invokeShell(bin, script string) outcome {
	return invoke("/bin/sh", nil, "-c", script, bin)
}

// invocationAttacks are the command lines that attack the command line itself rather than a reader: a
// job's rank files cut short or of two jobs, an output that cannot be written (a full disk, a file-size
// limit), two recordings into one file, Ctrl-C in a search, a config.json of impossible sizes, a device
// that holds no memory. Each must end as the README says, with the words that say what happened.
func invocationAttacks(t *testing.T, dir, ref string) []attack {
	t.Helper()
	rec := func(args ...string) {
		if code, _, stderr := runCmd(args...); code > exitProblem {
			t.Fatalf("%v: exit %d: %s", args, code, stderr)
		}
	}
	job := filepath.Join(dir, "job")
	other := filepath.Join(dir, "other")
	for _, d := range []string{job, other} {
		if err := os.Mkdir(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	var ranks []string
	for _, r := range []string{"0", "1", "2"} {
		path := filepath.Join(job, "job.rank"+r+".oomdbg")
		rec("run", "--preset", "tiny", "--steps", "2", "--gpus", "3", "--dp", "zero2", "--rank", r, "--gpu-mem", "30MiB", "--context-reserve", "1MiB", "-o", path)
		ranks = append(ranks, path)
	}
	data, err := os.ReadFile(ranks[2])
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(ranks[2], data[:len(data)/2], 0o644); err != nil {
		t.Fatal(err)
	}
	rec("run", "--preset", "tiny", "--steps", "2", "--gpus", "2", "--dp", "zero2", "--ranks", "uneven", "-o", filepath.Join(other, "job.oomdbg"))
	huge := filepath.Join(dir, "huge.json")
	if err := os.WriteFile(huge, []byte(`{"architectures": ["LlamaForCausalLM"], "hidden_size": 131072, "intermediate_size": 131072,
		"num_hidden_layers": 1000, "num_attention_heads": 32, "vocab_size": 4194304}`), 0o644); err != nil {
		t.Fatal(err)
	}
	says := func(stream func(outcome) string, words ...string) func(outcome) string {
		return func(o outcome) string {
			for _, w := range words {
				if neg, ok := strings.CutPrefix(w, "!"); ok && strings.Contains(stream(o), neg) || !ok && !strings.Contains(stream(o), w) {
					return fmt.Sprintf("its output %q, want %q", firstLine(stream(o)), w)
				}
			}
			return ""
		}
	}
	stdout := func(o outcome) string { return o.stdout }
	stderr := func(o outcome) string { return o.stderr }
	full := says(stderr, "oomdbg: cannot write standard output: no space left on device")
	const class = "hostile invocation"
	attacks := []attack{
		{name: "a job's rank file cut short", args: []string{"report", ranks[0], ranks[1], ranks[2]}, code: exitProblem,
			check: func(o outcome) string {
				return cmp.Or(says(stdout, "cut short")(o), says(stderr, "2 of the 2 ranks read to the end ran out of memory")(o))
			}},
		{name: "the rank files of two jobs", args: []string{"report", ranks[0], ranks[1], filepath.Join(other, "job.rank1.oomdbg")}, code: exitProblem,
			check: says(stderr, "oomdbg: warning: the files are of 2 jobs: ")},
		{name: "fit into a full disk", shell: `exec "$0" fit --preset tiny > /dev/full`, code: exitUsage, check: full},
		{name: "fit --markdown into a full disk", shell: `exec "$0" fit --preset tiny --markdown > /dev/full`, code: exitUsage, check: full},
		{name: "fit --json into a full disk", shell: `exec "$0" fit --preset tiny --json > /dev/full`, code: exitUsage, check: full},
		{name: "fixes into a full disk", shell: `exec "$0" fixes --preset tiny > /dev/full`, code: exitUsage, check: full},
		{name: "fixes --markdown into a full disk", shell: `exec "$0" fixes --preset tiny --markdown > /dev/full`, code: exitUsage, check: full},
		{name: "bugs into a full disk", shell: `exec "$0" bugs --steps 4 > /dev/full`, code: exitUsage, check: full},
		{name: "bugs --markdown into a full disk", shell: `exec "$0" bugs --steps 4 --markdown > /dev/full`, code: exitUsage, check: full},
		{name: "a recording past a file-size limit", shell: `ulimit -f 64; exec "$0" run --steps 200000 -o ` + filepath.Join(dir, "limit.oomdbg"),
			code: exitUsage, check: func(o outcome) string {
				return cmp.Or(says(stderr, "file too large; the run stopped at step ")(o), says(stdout, " of 200000 (interrupted)")(o))
			}},
		{name: "two recordings into one file", shell: `f=` + filepath.Join(dir, "same.oomdbg") + `
			"$0" run --preset gpt2-small --steps 100000 --gpu-mem 80GiB -o "$f" > /dev/null 2>&1 & p=$!
			while [ ! -s "$f" ]; do sleep 0.05; done
			"$0" run --steps 3 -o "$f"; r=$?
			kill -TERM $p; wait $p; exit $r`,
			code: exitUsage, check: says(stderr, "another process is recording into it")},
		// A batch search of seconds (20 steps of varied lengths a trial), interrupted in its first trials.
		{name: "Ctrl-C in fit", shell: `"$0" fit --preset llama-2-70b --gpu-mem 16TiB --seq-dist uniform:512:2048 --steps 20 & p=$!; sleep 0.3; kill -INT $p; wait $p`,
			code: 130, check: says(stdout, "nterrupted", "!not even 1", "!Largest micro-batch")},
		{name: "a config.json of sizes past any model", args: []string{"run", "--hf-config", huge, "-o", filepath.Join(dir, "huge.oomdbg")},
			code: exitUsage, check: says(stderr, huge+": vocab_size 4194304: ", "!--vocab")},
		{name: "check of a file too short to tell, a verdict required", args: []string{"check", ref, "--warmup", "5", "--require-conclusive"},
			code: exitProblem, check: says(stdout, "FAIL: inconclusive: ")},
	}
	if pickles := realPickles(); len(pickles) > 0 {
		f4 := filepath.Join(filepath.Dir(pickles[0]), "f4_2024_time_us_no_settings_2dev.pickle")
		attacks = append(attacks, attack{name: "export of a device that holds no memory", code: exitUsage,
			args:  []string{"export", f4, "--format", "svg", "--device", "0", "-o", filepath.Join(dir, "none.svg")},
			check: says(stderr, "device 0 holds no memory in this snapshot; its memory is on device 1")})
	}
	for i := range attacks {
		attacks[i].class = class
	}
	return attacks
}
