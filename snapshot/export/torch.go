package export

import (
	"cmp"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// Torch writes the snapshot tl indexes as the pickle torch.cuda.memory._dump_snapshot() writes: protocol 4,
// plain data only, with PyTorch's schema (docs/pytorch-snapshots.md), so pytorch.org/memory_viz, PyTorch's
// _memory_viz.py and oomdbg itself open it. See the package documentation for how oomdbg's tags map.
func Torch(w io.Writer, tl *timeline.Timeline) error {
	e := newPickleEncoder(w)
	writeTorch(e, tl)
	return e.close()
}

// TorchJSON writes the same document as Torch in JSON, which memory_viz also opens.
func TorchJSON(w io.Writer, tl *timeline.Timeline) error {
	e := newJSONEncoder(w)
	writeTorch(e, tl)
	return e.close()
}

// blockKey names a block or segment by where it is.
type blockKey struct {
	device int16
	addr   uint64
}

// torchDoc writes one PyTorch snapshot document.
type torchDoc struct {
	enc docEncoder
	s   *snapshot.Snapshot
	tl  *timeline.Timeline
	n   int

	devices []int // devices with events or segments, sorted
	clock   clock
	// categories says whether trace entries carry "category": only when some block has one, since
	// memory_viz then colours by category instead of giving each block its own colour.
	categories bool
	segStacks  map[blockKey]snapshot.StackID // the stack that created each segment still held at the end
	optimizer  string                        // the optimizer's class name, for Optimizer.step#... annotations
	annots     []annotation                  // external_annotations, with their times
	moved      map[int]int64                 // the time_us of trace entries that placeTimes moved, by seq
}

// clock turns event times into PyTorch's time_us: microseconds since the Unix epoch.
type clock struct {
	known bool  // Event.Time counts time (not the event index)
	base  int64 // time_us of Event.Time 0
}

func newClock(m snapshot.Meta) clock {
	c := clock{known: m.TimeUnit != "index"}
	if !m.Created.IsZero() {
		c.base = m.Created.UnixMicro()
	}
	return c
}

// us returns the time_us of an event time.
func (c clock) us(t int64) int64 {
	if !c.known {
		return t // the event index: still ordered, which is all the annotations need
	}
	return c.base + t/1000
}

func writeTorch(enc docEncoder, tl *timeline.Timeline) {
	s := tl.Snapshot()
	d := &torchDoc{enc: enc, s: s, tl: tl, n: tl.Len(), clock: newClock(s.Meta),
		segStacks: make(map[blockKey]snapshot.StackID), optimizer: optimizerClass(s.Meta)}
	d.scan()
	d.annots = d.annotations()
	enc.beginDict()
	enc.key("segments")
	d.writeSegments()
	enc.key("device_traces")
	d.writeTraces()
	if settings, ok := allocatorSettings(s.Meta); ok {
		enc.key("allocator_settings")
		settings.write(enc)
	}
	enc.key("external_annotations")
	d.writeAnnotations()
	enc.endDict()
}

// scan finds the devices, the stacks that created segments, and whether categories are worth writing.
func (d *torchDoc) scan() {
	seen := make(map[int]bool)
	categorized, unknown := false, false
	id := 0
	for _, ev := range d.s.Events.Range(0, d.n) {
		e := &ev
		if !isAllocatorAction(e.Action) {
			continue
		}
		seen[int(e.Device)] = true
		switch e.Action {
		case snapshot.ActionAlloc:
			c := d.tl.Allocation(id, d.n-1).Category
			id++
			categorized = categorized || c != snapshot.CategoryUnknown
			unknown = unknown || c == snapshot.CategoryUnknown
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			d.segStacks[blockKey{e.Device, e.Addr}] = e.Stack
			unknown = true
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			unknown = true
		}
	}
	if f := d.s.Footer; f != nil {
		for _, sg := range f.Segments {
			seen[sg.Device] = true
		}
	}
	for dev := range seen {
		d.devices = append(d.devices, dev)
	}
	slices.Sort(d.devices)
	// memory_viz adds "unknown" to its category list itself, but a typo there (categores.push) throws when
	// it has to: so categories go out only when "unknown" is among them anyway, as segment entries carry it.
	d.categories = categorized && unknown
}

// isAllocatorAction reports whether a is one of the caching allocator's trace actions: only these go into
// device_traces.
func isAllocatorAction(a snapshot.Action) bool {
	switch a {
	case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted,
		snapshot.ActionSegmentAlloc, snapshot.ActionSegmentFree, snapshot.ActionSegmentMap,
		snapshot.ActionSegmentUnmap, snapshot.ActionOOM, snapshot.ActionSnapshot:
		return true
	}
	return false
}

// userMetadata is what memory_viz shows under "User Metadata" for a block: its module scope,
// "transformer.h.0.attn.c_attn". PyTorch's _set_memory_metadata is where a program puts the module it is
// running, and PyTorch's importers (oomdbg's too) read the string back as the scope: so it holds the scope
// alone, and a round trip through the file keeps every block's scope as it was. The tensor's label has no
// place of its own in PyTorch's schema, and is not written.
func (d *torchDoc) userMetadata(scope, _ snapshot.StringID) string {
	return d.s.String(scope)
}

// writeFrames writes a stack as PyTorch's list of frame dicts, innermost first. Each distinct frame and stack
// is written once and referenced after, as PyTorch's symbolizer shares them.
func (d *torchDoc) writeFrames(id snapshot.StackID) {
	enc := d.enc
	if enc.shared(refStack, uint32(id)) {
		return
	}
	enc.beginList()
	for _, fid := range d.s.Stack(id) {
		if enc.shared(refFrame, uint32(fid)) {
			continue
		}
		f := d.s.Frame(fid)
		enc.beginDict()
		enc.key("filename")
		enc.str(d.s.String(f.File))
		enc.key("line")
		enc.int(int64(f.Line))
		enc.key("name")
		enc.str(d.s.String(f.Function))
		enc.endDict()
	}
	enc.endList()
}

// writeTraces writes device_traces: for every device ordinal up to the highest, its allocator actions in
// order.
func (d *torchDoc) writeTraces() {
	enc := d.enc
	enc.beginList()
	if len(d.devices) > 0 {
		for dev := 0; dev <= d.devices[len(d.devices)-1]; dev++ {
			enc.beginList()
			if _, ok := slices.BinarySearch(d.devices, dev); ok {
				d.writeDeviceTrace(int16(dev))
			}
			enc.endList()
		}
	}
	enc.endList()
}

// liveBlock is what a free entry needs of the block it frees.
type liveBlock struct {
	stack    snapshot.StackID
	category snapshot.Category
}

func (d *torchDoc) writeDeviceTrace(dev int16) {
	enc := d.enc
	live := make(map[uint64]liveBlock)
	segs := make(map[uint64]snapshot.StackID) // the stack that created each segment, as of the entry
	id := 0                                   // allocation IDs count the alloc events of every device, as the Timeline does
	for i, ev := range d.s.Events.Range(0, d.n) {
		e := &ev
		if !isAllocatorAction(e.Action) {
			continue
		}
		if e.Device != dev {
			if e.Action == snapshot.ActionAlloc {
				id++
			}
			continue
		}
		enc.beginDict()
		enc.key("action")
		enc.str(e.Action.String())
		if e.Action == snapshot.ActionOOM {
			enc.key("device_free")
			enc.int(e.DeviceFree)
		} else {
			enc.key("addr")
			enc.uint(e.Addr)
		}
		enc.key("size")
		enc.int(e.Size)
		enc.key("stream")
		enc.int(e.Stream)
		if d.clock.known {
			enc.key("time_us")
			t, ok := d.moved[i]
			if !ok {
				t = d.clock.us(e.Time)
			}
			enc.int(t)
		}
		stack, cat, meta := e.Stack, e.Category, ""
		switch e.Action {
		case snapshot.ActionAlloc:
			a := d.tl.Allocation(id, d.n-1) // category and label as the block ended: an activation, not a temporary
			id++
			cat, meta = a.Category, d.userMetadata(a.Scope, a.Label)
			live[e.Addr] = liveBlock{stack: e.Stack, category: cat}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			// A free without a stack of its own shows the block's allocation stack, as PyTorch does unless it
			// records free stacks (context="all").
			b := live[e.Addr]
			if stack == 0 {
				stack = b.stack
			}
			cat = b.category
			if e.Action == snapshot.ActionFreeCompleted {
				delete(live, e.Addr)
			}
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			segs[e.Addr] = e.Stack
			cat = snapshot.CategoryUnknown
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			// Released without a caller's stack: PyTorch then records the segment's creating stack.
			if stack == 0 {
				stack = segs[e.Addr]
			}
			cat = snapshot.CategoryUnknown
		case snapshot.ActionOOM:
			meta = d.userMetadata(e.Scope, e.Label)
		default:
			cat = snapshot.CategoryUnknown
		}
		// PyTorch leaves "frames" out when it recorded none; snapshot entries never have any.
		if stack != 0 && e.Action != snapshot.ActionSnapshot {
			enc.key("frames")
			d.writeFrames(stack)
		}
		if d.categories && e.Action != snapshot.ActionSnapshot {
			enc.key("category")
			if !cat.Valid() {
				cat = snapshot.CategoryUnknown
			}
			enc.str(cat.String())
		}
		if meta != "" {
			enc.key("user_metadata")
			enc.str(meta)
		}
		enc.endDict()
	}
}

// writeSegments writes the allocator's final state: the footer's segments, or, for a snapshot cut short, the
// state the Timeline replays at its last event.
func (d *torchDoc) writeSegments() {
	enc := d.enc
	var segs []snapshot.Segment
	if f := d.s.Footer; f != nil {
		segs = slices.Clone(f.Segments)
	} else {
		segs = segmentsAt(d.tl, d.n-1)
	}
	slices.SortStableFunc(segs, func(a, b snapshot.Segment) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Addr, b.Addr))
	})
	blockStacks := make(map[blockKey]snapshot.StackID)
	for _, a := range d.tl.ActiveAt(d.n-1, nil) {
		blockStacks[blockKey{a.Device, a.Addr}] = a.Stack
	}
	enc.beginList()
	for _, sg := range segs {
		var allocated, active, requested int64
		for _, b := range sg.Blocks {
			switch b.State {
			case stateAllocated:
				allocated += b.Size
				fallthrough
			case statePendingFree:
				active += b.Size
				requested += b.Requested
			}
		}
		enc.beginDict()
		enc.key("device")
		enc.int(int64(sg.Device))
		enc.key("address")
		enc.uint(sg.Addr)
		enc.key("total_size")
		enc.int(sg.Size)
		enc.key("allocated_size")
		enc.int(allocated)
		enc.key("active_size")
		enc.int(active)
		enc.key("requested_size")
		enc.int(requested)
		enc.key("stream")
		enc.int(sg.Stream)
		enc.key("segment_type")
		enc.str(cmp.Or(sg.Pool, poolOf(sg.Size)))
		enc.key("segment_pool_id")
		enc.intPair(0, 0)
		enc.key("is_expandable")
		enc.bool(sg.Expandable)
		enc.key("frames")
		d.writeStackOrEmpty(d.segStacks[blockKey{int16(sg.Device), sg.Addr}])
		enc.key("blocks")
		enc.beginList()
		for _, b := range sg.Blocks {
			enc.beginDict()
			enc.key("address")
			enc.uint(b.Addr)
			enc.key("size")
			enc.int(b.Size)
			enc.key("requested_size")
			enc.int(b.Requested)
			enc.key("state")
			enc.str(b.State)
			enc.key("frames")
			var stack snapshot.StackID
			if b.State != stateInactive { // PyTorch clears an inactive block's stack
				stack = blockStacks[blockKey{int16(sg.Device), b.Addr}]
			}
			d.writeStackOrEmpty(stack)
			enc.endDict()
		}
		enc.endList()
		enc.endDict()
	}
	enc.endList()
}

func (d *torchDoc) writeStackOrEmpty(id snapshot.StackID) {
	if id == 0 {
		d.enc.beginList()
		d.enc.endList()
		return
	}
	d.writeFrames(id)
}

// Block states as PyTorch spells them.
const (
	stateAllocated   = "active_allocated"
	statePendingFree = "active_pending_free"
	stateInactive    = "inactive"
)

// poolOf names the pool of a segment: only the small pool's segments are as small as kSmallBuffer.
func poolOf(size int64) string {
	if size <= torchrules.SmallBuffer {
		return "small"
	}
	return "large"
}

// segmentsAt returns the allocator's segments after event seq as the footer would hold them: every segment
// tiled by its active blocks and its free gaps.
func segmentsAt(tl *timeline.Timeline, seq int) []snapshot.Segment {
	var out []snapshot.Segment
	for _, ss := range tl.SegmentsAt(seq) {
		sg := snapshot.Segment{Device: int(ss.Device), Stream: ss.Stream, Addr: ss.Addr, Size: ss.Size,
			Pool: poolOf(ss.Size), Expandable: ss.Expandable}
		for _, b := range ss.Blocks {
			state := stateAllocated
			if b.Free >= 0 && b.Free <= seq {
				state = statePendingFree
			}
			sg.Blocks = append(sg.Blocks, snapshot.Block{Addr: b.Addr, Size: b.Size, Requested: b.Requested, State: state})
		}
		for _, g := range ss.Gaps {
			sg.Blocks = append(sg.Blocks, snapshot.Block{Addr: g.Addr, Size: g.Size, State: stateInactive})
		}
		slices.SortFunc(sg.Blocks, func(a, b snapshot.Block) int { return cmp.Compare(a.Addr, b.Addr) })
		out = append(out, sg)
	}
	return out
}

// annotation is one external_annotations entry.
type annotation struct {
	start  bool
	name   string
	device int
	timeUS int64
}

// placedAnnotation is an annotation with its place in the event order: the event it stands before, and its
// rank among the annotations there (regions that end come before those that begin, outer ones last to end
// and first to begin).
type placedAnnotation struct {
	seq, rank int
	annotation
}

// The ranks of annotations at one event.
const (
	rankPhaseEnd = iota
	rankStepEnd
	rankStepStart
	rankPhaseStart
	rankNote
)

// annotations returns the record_function regions PyTorch would have recorded around oomdbg's iterations and
// phases, in order: ProfilerStep#N around each training step (what torch.profiler's schedule records), the
// phases inside it by name ("forward", "backward", ...) with the optimizer's as Optimizer.step#AdamW.step and
// Optimizer.zero_grad#AdamW.zero_grad (what PyTorch's optimizer hooks record), and each annotation event.
func (d *torchDoc) annotations() []annotation {
	if d.n == 0 {
		return nil
	}
	dev := 0
	if len(d.devices) > 0 {
		dev = d.devices[0]
	}
	var placed []placedAnnotation
	add := func(seq, rank int, start bool, name string) {
		placed = append(placed, placedAnnotation{seq, rank, annotation{start: start, name: name, device: dev}})
	}
	iters := d.tl.Iterations()
	for _, it := range iters {
		if it.Iteration >= 0 {
			step := "ProfilerStep#" + strconv.Itoa(int(it.Iteration))
			add(it.Start, rankStepStart, true, step)
			add(it.End, rankStepEnd, false, step)
		}
	}
	next := 0 // the first iteration span starting after the current phase span's start
	for _, p := range d.tl.Phases() {
		name := d.phaseName(p.Phase)
		if name == "" {
			continue
		}
		for next < len(iters) && iters[next].Start <= p.Start {
			next++
		}
		// The iteration marker still carries the old phase, so a phase span can reach one event into the next
		// iteration: its region ends where the next step begins.
		end := p.End
		if next < len(iters) {
			end = min(end, iters[next].Start)
		}
		add(p.Start, rankPhaseStart, true, name)
		add(end, rankPhaseEnd, false, name)
	}
	for _, seq := range d.tl.Annotations() {
		e := d.s.Events.At(seq)
		name, stage := d.s.String(e.Text), d.s.String(e.Label)
		switch stage {
		case "START", "END": // a record_function boundary imported from PyTorch
			add(seq, rankNote, stage == "START", name)
		default: // a point: a region that begins and ends at once
			add(seq, rankNote, true, name)
			add(seq, rankNote, false, name)
		}
	}
	slices.SortStableFunc(placed, func(a, b placedAnnotation) int {
		return cmp.Or(cmp.Compare(a.seq, b.seq), cmp.Compare(a.rank, b.rank))
	})
	return d.placeTimes(placed)
}

// placeTimes gives each annotation its time_us, and moves trace entries where it must, so that an importer
// merging the two lists by time (an annotation before the entries of its time, an END after them, as
// snapshot/torch does) reads back the order they were recorded in. A microsecond holds many events: an
// iteration that begins within the microsecond of the previous one's last entries would otherwise lose its
// first allocations to it. So a START goes a microsecond after the entries before it, and the entries after
// an END a microsecond after it. Times only move forward, by a microsecond for each region boundary that
// shares one with entries on both sides, and catch up with the clock as soon as the events thin out.
func (d *torchDoc) placeTimes(placed []placedAnnotation) []annotation {
	out := make([]annotation, len(placed))
	if !d.clock.known {
		for i, p := range placed {
			p.timeUS = d.clock.us(d.s.Events.Time(min(p.seq, d.n-1)))
			out[i] = p.annotation
		}
		return out
	}
	const none = math.MinInt64
	lastEntry, lastAnnot, minEntry := int64(none), int64(none), int64(none)
	j := 0
	for seq := 0; seq <= d.n; seq++ {
		for ; j < len(placed) && placed[j].seq <= seq; j++ {
			a := placed[j].annotation
			t := max(d.clock.us(d.s.Events.Time(min(placed[j].seq, d.n-1))), lastAnnot)
			if lastEntry != none {
				if a.start {
					t = max(t, lastEntry+1)
				} else {
					t = max(t, lastEntry)
				}
			}
			if a.start {
				minEntry = max(minEntry, t)
			} else {
				minEntry = max(minEntry, t+1)
			}
			a.timeUS, lastAnnot = t, t
			out[j] = a
		}
		if seq == d.n {
			break
		}
		if !isAllocatorAction(d.s.Events.Action(seq)) {
			continue
		}
		natural := d.clock.us(d.s.Events.Time(seq))
		t := max(natural, lastEntry, minEntry)
		if t != natural {
			if d.moved == nil {
				d.moved = make(map[int]int64)
			}
			d.moved[seq] = t
		}
		lastEntry = t
	}
	return out
}

// phaseName is the record_function name PyTorch code would give a phase; "" for no phase.
func (d *torchDoc) phaseName(p snapshot.Phase) string {
	switch p {
	case snapshot.PhaseNone:
		return ""
	case snapshot.PhaseOptimizer:
		return "Optimizer.step#" + d.optimizer + ".step"
	case snapshot.PhaseZeroGrad:
		return "Optimizer.zero_grad#" + d.optimizer + ".zero_grad"
	}
	return p.String()
}

func (d *torchDoc) writeAnnotations() {
	enc := d.enc
	enc.beginList()
	for _, a := range d.annots {
		enc.beginDict()
		enc.key("stage")
		if a.start {
			enc.str("START")
		} else {
			enc.str("END")
		}
		enc.key("name")
		enc.str(a.name)
		enc.key("device")
		enc.int(int64(a.device))
		enc.key("time_us")
		enc.int(a.timeUS)
		enc.endDict()
	}
	enc.endList()
}

// optimizerClass returns the class name PyTorch gives the workload's optimizer ("AdamW" for adamw), for the
// names of its record_function regions.
func optimizerClass(m snapshot.Meta) string {
	o, _ := knob.ParseOptimizer(strings.ToLower(workloadField(m, "optimizer")))
	switch o {
	case knob.SGD, knob.Momentum:
		return "SGD"
	case knob.Adam:
		return "Adam"
	case knob.AdamW:
		return "AdamW"
	}
	return "Optimizer"
}

// torchSettings is the allocator_settings dict: what can be said exactly from the settings string.
type torchSettings struct {
	conf       string
	maxSplit   int64 // -1: unlimited
	gcThresh   float64
	expandable bool
}

// allocatorSettings reads Meta.AllocatorSettings (PYTORCH_CUDA_ALLOC_CONF form) as PyTorch parses it. It
// reports false for an imported snapshot that recorded none, whose settings are unknown rather than the
// defaults, and for a string PyTorch's parser refuses, whose effective values cannot be said.
func allocatorSettings(m snapshot.Meta) (torchSettings, bool) {
	if m.Source == "pytorch" && workloadField(m, "allocator_settings_known") == "false" {
		return torchSettings{}, false
	}
	cfg, err := torchrules.ParseConfig(m.AllocatorSettings)
	if err != nil {
		return torchSettings{}, false
	}
	st := torchSettings{conf: m.AllocatorSettings, maxSplit: -1, gcThresh: cfg.GarbageCollectionThreshold,
		expandable: cfg.ExpandableSegments}
	if cfg.MaxSplitSize != 0 {
		st.maxSplit = int64(min(cfg.MaxSplit(), math.MaxInt64)) // the allocator never splits below a large segment
	}
	return st, true
}

func (st torchSettings) write(enc docEncoder) {
	enc.beginDict()
	enc.key("PYTORCH_CUDA_ALLOC_CONF")
	enc.str(st.conf)
	enc.key("max_split_size")
	enc.int(st.maxSplit)
	enc.key("garbage_collection_threshold")
	enc.float(st.gcThresh)
	enc.key("expandable_segments")
	enc.bool(st.expandable)
	enc.endDict()
}
