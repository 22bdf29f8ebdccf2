package torch

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/pickle"
	"github.com/oomdbg/oomdbg/snapshot"
)

// Limits bound what one import may take. A zero field takes its default.
type Limits struct {
	// MaxInput is the largest input in bytes (default 8 GiB). A decoded snapshot takes about 2 to 10 times
	// its file size in memory, so lower it for input from a network.
	MaxInput int64
	// MaxEvents caps the trace entries, segments, blocks and annotations, and so the events of the result
	// (default snapshot.DefaultLimits().Events, what snapshot.Read holds). Whatever it is, an input may not
	// hold more of them than it has bytes: a pickle that repeats one list through its memo cannot expand.
	MaxEvents int
	// MaxMemory is the most bytes an import may hold at once, counted before each allocation: the decoded
	// pickle and the decoder's buffer, the records read from it, the tables and the snapshot's events (for
	// JSON, the input and an estimate of encoding/json's values). Past it the import fails with ErrMemory.
	// The default, 0, sets no ceiling. The count is of what the import holds; the Go runtime needs room
	// for garbage besides, which debug.SetMemoryLimit set to the same figure keeps within it.
	MaxMemory int64
	// EventBytes is what each event of the result will cost the caller once imported (the analysis it runs
	// on them), counted against MaxMemory as well: an import whose trace would not fit at that rate fails
	// as soon as the trace's length is known, before any of it is read. 0 counts nothing.
	EventBytes int64
}

func (l Limits) withDefaults() Limits {
	if l.MaxInput <= 0 {
		l.MaxInput = 8 << 30
	}
	if l.MaxEvents <= 0 {
		l.MaxEvents = int(min(snapshot.DefaultLimits().Events, 1<<40))
	}
	return l
}

// Option configures an import.
type Option func(*config)

type config struct {
	lim     Limits
	keepAll bool
}

// WithLimits sets the limits of the import.
func WithLimits(l Limits) Option { return func(c *config) { c.lim = l } }

// WithAllFrames keeps every stack frame. By default the frames memory_viz hides (the unwinder, the
// interpreter loop, dispatcher plumbing) are dropped, as its frameFilter does.
func WithAllFrames() Option { return func(c *config) { c.keepAll = true } }

// Origin describes where an imported snapshot came from and how the import went. Import stores it as JSON in
// Meta.Workload; OriginOf reads it back.
type Origin struct {
	Format   string `json:"format"`                    // "pickle" or "json"
	Protocol int    `json:"pickle_protocol,omitempty"` // the pickle protocol, 2 to 5
	// Form is "snapshot" for _snapshot()/_dump_snapshot()'s dict, "segments" for memory_snapshot()'s bare
	// list of segments (no trace).
	Form string `json:"form"`
	// Generation is the schema generation the fields present point to, "G0" (≤2.0, legacy history blocks)
	// to "G5" (≈2.11+), as docs/pytorch-snapshots.md §10 defines them; "" for the segments-only form.
	Generation string `json:"generation,omitempty"`
	// SettingsKnown says whether the snapshot recorded allocator_settings (≈2.4+). Without them
	// Meta.AllocatorSettings is "" and PyTorch's defaults were assumed when sizing blocks.
	SettingsKnown bool `json:"allocator_settings_known"`
	// SettingsError is why the recorded PYTORCH_CUDA_ALLOC_CONF string does not parse as PyTorch parses it
	// (a key an older release took, a hand-edited file); only the effective values recorded beside it then
	// size blocks.
	SettingsError string `json:"allocator_settings_error,omitempty"`
	// TraceEntries counts the entries of device_traces, over all devices.
	TraceEntries int `json:"trace_entries"`
	// SkippedActions counts trace entries of actions this importer does not know, by action.
	SkippedActions map[string]int `json:"skipped_actions,omitempty"`
	// HostEntries counts pinned host memory entries (host_segments, host_traces), which are not imported:
	// oomdbg models device memory.
	HostEntries int `json:"host_entries_skipped,omitempty"`
	// PreExistingSegments and PreExistingBlocks count the segments and blocks that were alive before the
	// trace began (the ring buffer dropped their history), added as events labelled PreExistingLabel.
	PreExistingSegments int `json:"pre_existing_segments"`
	PreExistingBlocks   int `json:"pre_existing_blocks"`
	// BlockSizesExact counts allocations whose block size is certain: from the final state, the small pool's
	// exact rounding, or the allocator's split rule applied to a segment whose layout is known.
	// BlockSizesEstimated counts the others, which carry the rounded request, a lower bound.
	BlockSizesExact     int `json:"block_sizes_exact"`
	BlockSizesEstimated int `json:"block_sizes_estimated"`
	// Inconsistencies counts places where the trace and the final state contradict each other or the
	// allocator's rules (a free of a block freed before, an alloc over a live block, a block the trace says
	// is alive but the state does not hold, ...). Real snapshots have none.
	Inconsistencies int `json:"inconsistencies,omitempty"`
	Annotations     int `json:"annotations,omitempty"` // external_annotations entries
	// OptimizerSteps counts the Optimizer.step#... regions among the annotations: torch.optim records one
	// around every step (PyTorch 2.x).
	OptimizerSteps int `json:"optimizer_steps,omitempty"`
	// CategoriesRecorded says that trace entries carry the memory profiler's category (_profile_to_snapshot,
	// or oomdbg's export): those are kept, and Infer decides only the others.
	CategoriesRecorded bool `json:"categories_recorded,omitempty"`
	// Iterations says where the iteration boundaries come from (IterationSource.String).
	Iterations string `json:"iterations,omitempty"`
	// Recorded describes the tags oomdbg record added (the "oomdbg" key), when the file has them.
	Recorded *Recorded `json:"recorded,omitempty"`
}

// OriginOf returns the Origin of a snapshot made by Import, and false for any other snapshot.
func OriginOf(s *snapshot.Snapshot) (*Origin, bool) {
	if s == nil || s.Meta.Source != Source || len(s.Meta.Workload) == 0 {
		return nil, false
	}
	var o Origin
	if err := json.Unmarshal(s.Meta.Workload, &o); err != nil || o.Format == "" {
		return nil, false
	}
	return &o, true
}

// Source is Meta.Source of an imported snapshot.
const Source = "pytorch"

// PreExistingLabel is the Label of the events Import adds, at time 0, for segments and blocks that were
// alive before the trace began: a free with no alloc before it, an active block of the final state that
// the trace never allocated (PyTorch's trace is a ring buffer that keeps the newest entries), a segment
// freed but never allocated in the trace, a segment of the final state the trace never created. It is
// snapshot.PreExistingLabel, which analysis compares Event.Label with.
const PreExistingLabel = snapshot.PreExistingLabel

// ImportFile imports the PyTorch memory snapshot at path, reading it as ImportReader does.
func ImportFile(path string, opts ...Option) (*snapshot.Snapshot, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	s, err := ImportReader(f, opts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return s, nil
}

// ImportReader imports the PyTorch memory snapshot r streams: a file, a pipe, standard input. A pickle is
// decoded as it is read, never held whole: reading stops at its STOP opcode, or at the first bad opcode,
// so a file that is not a snapshot fails after a few KiB. JSON is read whole, as encoding/json needs.
// Errors are those of Import for the same bytes, or the reader's own error.
func ImportReader(r io.Reader, opts ...Option) (*snapshot.Snapshot, error) {
	c := newConfig(opts)
	head, rest, err := peek(r)
	if err != nil {
		return nil, err
	}
	if len(head) == 2 && head[0] == 0x80 {
		lim := pickle.Limits{MaxInput: c.lim.MaxInput, MaxMemory: c.lim.MaxMemory}
		doc, err := lim.DecodeDocReader(rest)
		if err != nil {
			return nil, decodeErr(err, c.lim.MaxMemory)
		}
		return importDoc(doc, Origin{Format: "pickle", Protocol: int(head[1])}, c, doc.InputSize())
	}
	data, err := readAll(rest, c.lim)
	if err != nil {
		return nil, err
	}
	return importData(data, c)
}

// peek returns the first two bytes of r (fewer if it has fewer) and a reader of all of r. A file, a
// bytes.Reader or a bufio.Reader is read without consuming them, and given back as it is, so that the
// decoder can see what it is (a file's length sizes the decoder).
func peek(r io.Reader) ([]byte, io.Reader, error) {
	var head [2]byte
	switch x := r.(type) {
	case *bufio.Reader:
		b, err := x.Peek(2)
		if err != nil && err != io.EOF {
			return nil, nil, &ImportError{Offset: int64(len(b)), Err: err}
		}
		return append(head[:0], b...), r, nil
	case interface {
		io.ReaderAt
		io.Seeker
	}:
		if at, err := x.Seek(0, io.SeekCurrent); err == nil { // not a pipe
			n, err := x.ReadAt(head[:], at)
			if err != nil && err != io.EOF {
				return nil, nil, &ImportError{Offset: int64(n), Err: err}
			}
			return head[:n], r, nil
		}
	}
	n, err := io.ReadFull(r, head[:])
	if err != nil && err != io.EOF && err != io.ErrUnexpectedEOF {
		return nil, nil, &ImportError{Offset: int64(n), Err: err}
	}
	return head[:n], io.MultiReader(bytes.NewReader(head[:n]), r), nil
}

// readAll reads all of r, up to lim.MaxInput bytes and one more to tell an input over the limit, counting
// the buffer against lim.MaxMemory.
func readAll(r io.Reader, lim Limits) ([]byte, error) {
	mem := budget{max: lim.MaxMemory}
	r = io.LimitReader(r, lim.MaxInput+1)
	var data []byte
	for {
		if len(data) == cap(data) {
			old, c := cap(data), max(2*cap(data), 64<<10)
			if err := mem.add(int64(c), "reading the input"); err != nil {
				return nil, err
			}
			data = append(make([]byte, 0, c), data...)
			mem.release(int64(old))
		}
		n, err := r.Read(data[len(data):cap(data)])
		data = data[:len(data)+n]
		if err == io.EOF {
			return data, nil
		}
		if err != nil {
			return nil, &ImportError{Offset: int64(len(data)), Err: err}
		}
	}
}

// Import turns a PyTorch memory snapshot (the pickle torch.cuda.memory._dump_snapshot writes, protocols 2 to 5,
// memory_snapshot()'s bare list of segments, or either as JSON, which memory_viz also reads) into a snapshot.
// Every error is an *ImportError; hostile input gives an error, never a panic, within Limits. The result is a
// pure function of the input: importing the same bytes twice gives equal snapshots.
func Import(data []byte, opts ...Option) (*snapshot.Snapshot, error) {
	return importData(data, newConfig(opts))
}

func newConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		o(&c)
	}
	c.lim = c.lim.withDefaults()
	return c
}

// importData imports an input held in memory.
func importData(data []byte, c config) (*snapshot.Snapshot, error) {
	if int64(len(data)) > c.lim.MaxInput {
		return nil, &ImportError{Offset: -1, Err: fmt.Errorf("%w: input of %d bytes > Limits.MaxInput (%d)", ErrLimit, len(data), c.lim.MaxInput)}
	}
	switch {
	case len(data) >= 2 && data[0] == 0x80:
		doc, err := pickle.Limits{MaxInput: c.lim.MaxInput, MaxMemory: c.lim.MaxMemory}.DecodeDoc(data)
		if err != nil {
			return nil, decodeErr(err, c.lim.MaxMemory)
		}
		return importDoc(doc, Origin{Format: "pickle", Protocol: int(data[1])}, c, doc.InputSize())
	case jsonStart(data) >= 0:
		mem := budget{max: c.lim.MaxMemory, held: int64(cap(data))}
		if err := mem.add(jsonBytesPerByte*int64(len(data)), "decoding the JSON"); err != nil {
			return nil, err
		}
		v, err := decodeJSON(data)
		if err != nil {
			return nil, err
		}
		doc, err := jsonDoc(v, mem.left())
		if err != nil {
			return nil, buildErr(err)
		}
		return importDoc(doc, Origin{Format: "json"}, c, int64(len(data)))
	}
	return nil, &ImportError{Offset: -1, Err: fmt.Errorf("%w: neither a pickle (no PROTO opcode) nor JSON", ErrNotSnapshot)}
}

// importDoc builds the snapshot of a decoded input of n bytes.
func importDoc(doc *pickle.Doc, origin Origin, c config, n int64) (*snapshot.Snapshot, error) {
	return newImporter(doc, origin, c, n).run()
}

func newImporter(doc *pickle.Doc, origin Origin, c config, n int64) *importer {
	return &importer{doc: doc, keys: resolveKeys(doc), origin: origin, lim: c.lim, keepAll: c.keepAll, rules: defaultRules(),
		inputLen: n, mem: budget{max: c.lim.MaxMemory, held: doc.Footprint()}}
}

// run reads the decoded input into records and builds the snapshot from them.
func (im *importer) run() (s *snapshot.Snapshot, err error) {
	defer func() {
		// The decoded input is acyclic and every access is checked, so nothing here should panic; if a bug
		// makes something do so anyway, the user gets an error naming it, not a crash.
		if !recoverPanics {
			return
		}
		if r := recover(); r != nil {
			s, err = nil, &ImportError{Offset: -1, Err: fmt.Errorf("%w: internal error: %v", ErrMalformed, r)}
		}
	}()
	doc := im.doc
	if im.tab, err = newTables(im.keepAll, doc.Containers(), &im.mem); err != nil {
		return nil, err
	}
	if err := im.read(doc.Root()); err != nil {
		return nil, err
	}
	// Everything the snapshot needs is in the records and tables now: let the decoded pickle go before the
	// events are built, so that they take its place rather than add to it.
	fp := doc.Footprint()
	im.mem.release(fp)
	doc, im.doc, im.keys = nil, nil, pickKeys{}
	im.tab.endParse()
	collect(fp)
	return im.build() // which lets the records go once they are events
}

// collect runs the garbage collector when what was just dropped is large, so that what is allocated next
// takes its place instead of adding to the heap: left to its pacing, the collector lets the heap grow to
// twice what was alive at the last collection, which for a large import was the decoded pickle, or the
// records the events were built from.
func collect(dropped int64) {
	if dropped > 64<<20 {
		debug.FreeOSMemory()
	}
}

// recoverPanics turns a panic of the importer into an error; tests turn it off to see the panic.
var recoverPanics = true

// jsonBytesPerByte bounds what decodeJSON allocates per byte of input: its copy of the input, the values it
// makes (2 to 5 bytes per byte on the test snapshots and a 23 MB export, TestJSONEstimate) and the garbage of
// growing them, 7.5 to 9 in all.
const jsonBytesPerByte = 10

// decodeJSON decodes JSON keeping integers exact (addresses and times exceed float64's 2^53 in principle).
func decodeJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	if err == nil {
		if _, e := dec.Token(); e != io.EOF {
			err = errors.New("data after the JSON value")
		}
	}
	if err != nil {
		kind := ErrMalformed
		if errors.Is(err, io.ErrUnexpectedEOF) || err == io.EOF {
			kind = ErrTruncated
		}
		off := dec.InputOffset()
		var se *json.SyntaxError
		if errors.As(err, &se) {
			off = se.Offset
		}
		return nil, &ImportError{Offset: off, Err: fmt.Errorf("%w: json: %w", kind, err)}
	}
	return v, nil
}

// importer holds the state of one import.
type importer struct {
	lim      Limits
	keepAll  bool // no frame filter
	mem      budget
	inputLen int64       // bytes of input
	records  int         // records admitted so far (see admit)
	doc      *pickle.Doc // the decoded snapshot
	keys     pickKeys    // the keys picked from each kind of dict, as Values of doc
	tab      *tables
	rules    rules
	origin   Origin

	settings    string             // Meta.AllocatorSettings
	segs        []snapshot.Segment // the final state, as the footer holds it
	segStacks   []snapshot.StackID // by segment: the stack that created it
	blockStacks []snapshot.StackID // by block, in the order of all segments' blocks
	haveState   bool               // the snapshot holds a final state (segments)
	traces      [][]entry          // by device ordinal
	timeKnown   bool               // every trace entry has time_us
	annots      []annotation
	rec         *recording // oomdbg record's tags (recorded.go)
	devices     []int      // every device seen, sorted

	seen struct { // fields whose presence tells the schema generation
		history, blockAddress, segmentFrames, timeUS, userMetadata, g4, g5 bool
	}
}

func (im *importer) seeDevice(d int) {
	if i, found := slices.BinarySearch(im.devices, d); !found {
		im.devices = slices.Insert(im.devices, i, d)
	}
}

// read walks the decoded value into the importer's records.
func (im *importer) read(root pickle.Value) error {
	if _, ok := im.list(root); ok {
		// memory_snapshot() returns the segments alone.
		im.origin.Form = "segments"
		im.haveState = true
		return im.parseSegments(root, "segments")
	}
	d := root
	if !isDict(root) {
		return &ImportError{Offset: -1, Err: fmt.Errorf("%w: the top level is a %s, not a dict or a list", ErrNotSnapshot, pyType(root))}
	}
	im.origin.Form = "snapshot"
	segs, hasSegs := im.get(d, "segments")
	traces, hasTraces := im.get(d, "device_traces")
	if !hasSegs && !hasTraces {
		return &ImportError{Offset: -1, Err: fmt.Errorf("%w: a dict without \"segments\" or \"device_traces\"", ErrNotSnapshot)}
	}
	if hasSegs {
		im.haveState = true
		if err := im.parseSegments(segs, "segments"); err != nil {
			return err
		}
	}
	if hasTraces {
		if err := im.parseTraces(traces); err != nil {
			return err
		}
	}
	if v, ok := im.get(d, "allocator_settings"); ok {
		if err := im.parseSettings(v); err != nil {
			return err
		}
	}
	if v, ok := im.get(d, "external_annotations"); ok {
		if err := im.parseAnnotations(v); err != nil {
			return err
		}
		im.origin.Annotations = len(im.annots)
		for _, a := range im.annots {
			im.seeDevice(int(a.device))
			if a.start && strings.HasPrefix(a.name, "Optimizer.step#") {
				im.origin.OptimizerSteps++
			}
		}
	}
	if v, ok := im.get(d, "oomdbg"); ok {
		if err := im.parseRecorded(v); err != nil {
			return err
		}
	}
	for _, k := range []string{"host_segments", "host_traces"} {
		if v, ok := im.get(d, k); ok {
			im.seen.g5 = true
			if l, ok := im.list(v); ok {
				im.origin.HostEntries += len(l)
			}
		}
	}
	im.origin.Generation = im.generation(d)
	return nil
}

// generation names the schema generation the fields present point to (docs/pytorch-snapshots.md §10).
func (im *importer) generation(d pickle.Value) string {
	switch {
	case im.seen.g5:
		return "G5"
	case im.seen.g4 || im.seen.userMetadata:
		return "G4"
	case im.has(d, "allocator_settings") || im.has(d, "external_annotations"):
		return "G3"
	case im.seen.timeUS:
		return "G2"
	case im.seen.history && !im.seen.blockAddress:
		return "G0"
	default:
		return "G1"
	}
}
