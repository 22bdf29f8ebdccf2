package export

import (
	"bytes"
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/charmbracelet/x/exp/golden"
	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// snapshots returns the snapshots the export tests run on: the hand-made fixture and recordings of oomdbg's
// workloads (a normal run, one that runs out of memory, one with expandable segments, a leak, an MLP).
func snapshots(t *testing.T) map[string]*snapshot.Snapshot {
	t.Helper()
	out := map[string]*snapshot.Snapshot{"fixture": fixture(), "two-devices": twoDevices()}
	for name := range recordingConfigs() {
		out[name] = recorded(t, name)
	}
	return out
}

func exportBytes(t *testing.T, write func(*bytes.Buffer, *timeline.Timeline) error, s *snapshot.Snapshot) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := write(&buf, timeline.New(s)); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func torchPickle(b *bytes.Buffer, tl *timeline.Timeline) error { return Torch(b, tl) }
func torchJSON(b *bytes.Buffer, tl *timeline.Timeline) error   { return TorchJSON(b, tl) }

// The golden file pins the whole document for the fixture: every key, value and annotation.
func TestTorchJSONGolden(t *testing.T) {
	golden.RequireEqual(t, exportBytes(t, torchJSON, fixture()))
}

// pickleOpcodes are the opcodes of PyTorch's own snapshot pickles that memory_viz's unpickler reads; an
// export must use no others.
var pickleOpcodes = []string{"APPENDS", "BINFLOAT", "BINGET", "BININT", "BININT1", "BININT2", "BINUNICODE",
	"EMPTY_DICT", "EMPTY_LIST", "FRAME", "LONG1", "LONG_BINGET", "MARK", "MEMOIZE", "NEWFALSE", "NEWTRUE", "NONE",
	"PROTO", "SETITEMS", "SHORT_BINUNICODE", "STOP", "TUPLE2"}

// TestTorchLoadsInPython loads every export with Python's pickle module (refusing globals) and json module,
// and checks what they read against the snapshot: the keys, the entries of every device by action, the
// segments and blocks, the annotations, that pickle and JSON hold the same document, and that the pickle
// shares each stack's frame list as PyTorch's does.
func TestTorchLoadsInPython(t *testing.T) {
	for name, s := range snapshots(t) {
		t.Run(name, func(t *testing.T) {
			tl := timeline.New(s)
			pk := writeTemp(t, "snapshot.pickle", exportBytes(t, torchPickle, s))
			js := writeTemp(t, "snapshot.json", exportBytes(t, torchJSON, s))
			var got struct {
				Keys        []string
				Protocol    int
				Opcodes     []string
				Traces      []map[string]int
				Segments    int
				Blocks      int
				Annotations int
				Settings    map[string]any
				SameAsJSON  bool `json:"same_as_json"`
				FrameLists  int  `json:"frame_lists"`
				Bad         []string
			}
			python(t, loadScript, &got, pk, js)

			if want := []string{"allocator_settings", "device_traces", "external_annotations", "segments"}; !slices.Equal(got.Keys, want) {
				t.Errorf("keys %v, want %v", got.Keys, want)
			}
			if got.Protocol != 4 {
				t.Errorf("protocol %d, want 4", got.Protocol)
			}
			for _, op := range got.Opcodes {
				if !slices.Contains(pickleOpcodes, op) {
					t.Errorf("opcode %s is not one of PyTorch's snapshot pickles", op)
				}
			}
			// The entries, counted from the events independently of the export.
			var want []map[string]int
			stacks := make(map[snapshot.StackID]bool)
			allocStack := make(map[blockKey]snapshot.StackID)
			for _, e := range s.Events.All() {
				switch e.Action {
				case snapshot.ActionAlloc, snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted, snapshot.ActionSegmentAlloc,
					snapshot.ActionSegmentFree, snapshot.ActionSegmentMap, snapshot.ActionSegmentUnmap, snapshot.ActionOOM:
				default:
					continue
				}
				for len(want) <= int(e.Device) {
					want = append(want, map[string]int{})
				}
				want[e.Device][e.Action.String()]++
				st := e.Stack
				if e.Action == snapshot.ActionAlloc {
					allocStack[blockKey{e.Device, e.Addr}] = e.Stack
				} else if st == 0 && (e.Action == snapshot.ActionFreeRequested || e.Action == snapshot.ActionFreeCompleted) {
					st = allocStack[blockKey{e.Device, e.Addr}]
				}
				if st != 0 {
					stacks[st] = true
				}
			}
			if !slices.EqualFunc(got.Traces, want, maps.Equal) {
				t.Errorf("trace entries by device and action %v, want %v", got.Traces, want)
			}
			blocks := 0
			for _, sg := range s.Footer.Segments {
				blocks += len(sg.Blocks)
			}
			if got.Segments != len(s.Footer.Segments) || got.Blocks != blocks {
				t.Errorf("%d segments with %d blocks, want %d with %d", got.Segments, got.Blocks, len(s.Footer.Segments), blocks)
			}
			wantNotes := 2 * len(tl.Annotations())
			for _, p := range tl.Phases() {
				if p.Phase != snapshot.PhaseNone {
					wantNotes += 2
				}
			}
			for _, it := range tl.Iterations() {
				if it.Iteration >= 0 {
					wantNotes += 2
				}
			}
			if got.Annotations != wantNotes {
				t.Errorf("%d external annotations, want %d", got.Annotations, wantNotes)
			}
			if !got.SameAsJSON {
				t.Error("the pickle and the JSON export hold different documents")
			}
			// Segments and blocks may add stacks the trace does not use, never fewer.
			if got.FrameLists < len(stacks) {
				t.Errorf("%d distinct frame lists, want at least the %d stacks of the trace", got.FrameLists, len(stacks))
			}
			if got.FrameLists > len(s.Stacks) {
				t.Errorf("%d distinct frame lists for %d stacks: shared stacks were written more than once", got.FrameLists, len(s.Stacks))
			}
			if len(got.Bad) > 0 {
				t.Errorf("entries or segments off PyTorch's schema: %v", got.Bad)
			}
		})
	}
}

// TestTorchRoundTrip exports each snapshot, imports the export with oomdbg's PyTorch importer, and checks
// that both tell the same story: the allocated and reserved bytes after every allocator action, the peaks,
// the blocks alive at the peak (place, sizes, stack, category and module scope), and the iterations.
func TestTorchRoundTrip(t *testing.T) {
	writers := map[string]func(*bytes.Buffer, *timeline.Timeline) error{"pickle": torchPickle, "json": torchJSON}
	for name, s := range snapshots(t) {
		for form, write := range writers {
			t.Run(name+"/"+form, func(t *testing.T) {
				im, err := torch.Import(exportBytes(t, write, s))
				if err != nil {
					t.Fatal(err)
				}
				origin, _ := torch.OriginOf(im)
				if origin.Inconsistencies != 0 || origin.BlockSizesEstimated != 0 || origin.PreExistingBlocks+origin.PreExistingSegments != 0 {
					t.Errorf("the importer found the export inconsistent: %+v", origin)
				}
				checkSameTimeline(t, timeline.New(s), timeline.New(im))
			})
		}
	}
}

// allocatorSeqs returns the seqs of the allocator's actions: the events both sides of a round trip have.
func allocatorSeqs(s *snapshot.Snapshot) []int {
	var seqs []int
	for i := range s.Events.Len() {
		if isAllocatorAction(s.Events.At(i).Action) {
			seqs = append(seqs, i)
		}
	}
	return seqs
}

// roundTripBlock is what a round trip keeps of a live block.
type roundTripBlock struct {
	Device              int16
	Addr                uint64
	Size, Requested     int64
	Category            snapshot.Category
	Scope               string
	Frames              []string
	IterationAtCreation int32
}

func blocksAt(tl *timeline.Timeline, seq int, withIteration bool) []roundTripBlock {
	s := tl.Snapshot()
	var out []roundTripBlock
	for _, a := range tl.LiveAt(seq, nil) {
		b := roundTripBlock{Device: a.Device, Addr: a.Addr, Size: a.Size, Requested: a.Requested,
			Category: tl.Allocation(a.ID, tl.Len()-1).Category, Scope: s.String(a.Scope)}
		for _, f := range s.Stack(a.Stack) {
			fr := s.Frame(f)
			b.Frames = append(b.Frames, fmt.Sprintf("%s %s:%d", s.String(fr.Function), s.String(fr.File), fr.Line))
		}
		if withIteration {
			b.IterationAtCreation = a.Iteration
		}
		out = append(out, b)
	}
	slices.SortFunc(out, func(a, b roundTripBlock) int {
		return cmp.Or(cmp.Compare(a.Device, b.Device), cmp.Compare(a.Addr, b.Addr))
	})
	return out
}

// checkSameTimeline compares two Timelines of the same memory history, device by device: PyTorch's format
// orders the actions of each device, and those of different devices only by time_us.
func checkSameTimeline(t *testing.T, want, got *timeline.Timeline) {
	t.Helper()
	devices := map[int16]bool{}
	for _, s := range []*snapshot.Snapshot{want.Snapshot(), got.Snapshot()} {
		for i := range s.Events.Len() {
			if isAllocatorAction(s.Events.At(i).Action) {
				devices[s.Events.At(i).Device] = true
			}
		}
	}
	if len(devices) <= 1 {
		checkSameDevice(t, want, got)
		return
	}
	for d := range devices {
		dev := int(d)
		wv, _, err := want.Snapshot().DeviceView(dev)
		if err != nil {
			t.Fatal(err)
		}
		gv, _, err := got.Snapshot().DeviceView(dev)
		if err != nil {
			t.Fatal(err)
		}
		checkSameDevice(t, timeline.New(wv), timeline.New(gv))
	}
}

func checkSameDevice(t *testing.T, want, got *timeline.Timeline) {
	t.Helper()
	ws, gs := allocatorSeqs(want.Snapshot()), allocatorSeqs(got.Snapshot())
	if len(ws) != len(gs) {
		t.Fatalf("%d allocator events after the round trip, want %d", len(gs), len(ws))
	}
	for k := range ws {
		for _, series := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
			if w, g := want.Value(series, ws[k]), got.Value(series, gs[k]); w != g {
				t.Fatalf("%s after allocator event %d (%s): %d, want %d", series, k, want.Snapshot().Events.At(ws[k]).Action, g, w)
			}
		}
	}
	for _, series := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
		wp, gp := want.Peak(series), got.Peak(series)
		wk, _ := slices.BinarySearch(ws, wp.Seq)
		gk, _ := slices.BinarySearch(gs, gp.Seq)
		if wp.Bytes != gp.Bytes || wk != gk {
			t.Errorf("%s peak %d at allocator event %d, want %d at %d", series, gp.Bytes, gk, wp.Bytes, wk)
		}
	}
	wp, gp := want.Peak(timeline.Allocated), got.Peak(timeline.Allocated)
	wb, gb := blocksAt(want, wp.Seq, true), blocksAt(got, gp.Seq, true)
	if len(wb) != len(gb) {
		t.Errorf("live set at the peak: %d blocks, want %d", len(gb), len(wb))
	}
	for i := range min(len(wb), len(gb)) {
		if !sameBlock(wb[i], gb[i]) {
			t.Errorf("live set at the peak differs at block %d of %d:\n got %+v\nwant %+v", i, len(wb), gb[i], wb[i])
			break
		}
	}
	iters := func(tl *timeline.Timeline) []int32 {
		var out []int32
		for _, it := range tl.Iterations() {
			if it.Iteration >= 0 && !slices.Contains(out, it.Iteration) {
				out = append(out, it.Iteration)
			}
		}
		return out
	}
	if w, g := iters(want), iters(got); !slices.Equal(w, g) {
		t.Errorf("iterations %v after the round trip, want %v", g, w)
	}
}

func first[T any](s []T, n int) []T { return s[:min(n, len(s))] }

func sameBlock(a, b roundTripBlock) bool {
	return a.Device == b.Device && a.Addr == b.Addr && a.Size == b.Size && a.Requested == b.Requested &&
		a.Category == b.Category && slices.Equal(a.Frames, b.Frames) && a.IterationAtCreation == b.IterationAtCreation &&
		// A scope comes back as it went; a block without one, of which PyTorch's schema cannot say so, gets
		// what the importer infers for any PyTorch snapshot.
		(a.Scope == "" || a.Scope == b.Scope)
}

// TestTorchFixtureContent pins what PyTorch's tools read from the fixture's export, decoded by Go's own JSON
// decoder: the fields memory_viz uses on each kind of entry, and the mapping of oomdbg's tags.
func TestTorchFixtureContent(t *testing.T) {
	var doc struct {
		Segments []struct {
			Device                                        int
			Address                                       uint64
			TotalSize, AllocatedSize, ActiveSize, ReqSize int64 `json:"-"`
			Blocks                                        []map[string]any
			SegmentType                                   string `json:"segment_type"`
			SegmentPoolID                                 []int  `json:"segment_pool_id"`
			Frames                                        []map[string]any
			Allocated                                     int64 `json:"allocated_size"`
			Active                                        int64 `json:"active_size"`
			Requested                                     int64 `json:"requested_size"`
			Total                                         int64 `json:"total_size"`
		}
		DeviceTraces        [][]map[string]any `json:"device_traces"`
		ExternalAnnotations []map[string]any   `json:"external_annotations"`
		AllocatorSettings   map[string]any     `json:"allocator_settings"`
	}
	dec := json.NewDecoder(bytes.NewReader(exportBytes(t, torchJSON, fixture())))
	dec.UseNumber()
	if err := dec.Decode(&doc); err != nil {
		t.Fatal(err)
	}
	entries := doc.DeviceTraces[0]
	find := func(action string, addr uint64) map[string]any {
		for _, e := range entries {
			if e["action"] == action && (action == "oom" || e["addr"] == json.Number(fmt.Sprint(addr))) {
				return e
			}
		}
		t.Fatalf("no %s entry at %#x", action, addr)
		return nil
	}
	tests := map[string]struct {
		entry map[string]any
		key   string
		want  any
	}{
		"alloc size is the request":        {find("alloc", segA+4096), "size", json.Number("128")},
		"category as the block ended":      {find("alloc", segB), "category", "activation"},
		"the scope as user metadata":       {find("alloc", segB), "user_metadata", "fc"},
		"no user metadata without a scope": {find("alloc", segA+4608), "user_metadata", nil},
		"time_us from Created":             {find("alloc", segA), "time_us", json.Number("1735689600000002")},
		"free keeps the request":           {find("free_completed", segA+6656), "size", json.Number("1000")},
		"segment size":                     {find("segment_alloc", segB), "size", json.Number(fmt.Sprint(20 * mib))},
		"segments are unknown":             {find("segment_free", segB), "category", "unknown"},
		"oom has the rounded request":      {find("oom", 0), "size", json.Number(fmt.Sprint(64 * mib))},
		"oom has device_free":              {find("oom", 0), "device_free", json.Number(fmt.Sprint(40 * mib))},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.entry[tc.key]; got != tc.want {
				t.Errorf("%s = %v, want %v (entry %v)", tc.key, got, tc.want, tc.entry)
			}
		})
	}
	if _, ok := find("oom", 0)["addr"]; ok {
		t.Error("an oom entry has addr; PyTorch writes device_free in its place")
	}
	// A free carries its block's allocation stack.
	freeFrames, _ := json.Marshal(find("free_requested", segB)["frames"])
	allocFrames, _ := json.Marshal(find("alloc", segB)["frames"])
	if !bytes.Equal(freeFrames, allocFrames) || len(allocFrames) < 10 {
		t.Errorf("free frames %s, want the allocation's %s", freeFrames, allocFrames)
	}
	sg := doc.Segments[0]
	if sg.Allocated != 4096+512+2048+4096+512+2048 || sg.Active != sg.Allocated+4096 || sg.Requested != 4096+128+2048+4096+4096+128+2048 || sg.Total != 2*mib {
		t.Errorf("segment sizes allocated %d active %d requested %d total %d", sg.Allocated, sg.Active, sg.Requested, sg.Total)
	}
	if sg.SegmentType != "small" || !slices.Equal(sg.SegmentPoolID, []int{0, 0}) || len(sg.Frames) != 3 {
		t.Errorf("segment type %q pool %v frames %d", sg.SegmentType, sg.SegmentPoolID, len(sg.Frames))
	}
	var names []string
	for _, a := range doc.ExternalAnnotations {
		names = append(names, fmt.Sprint(a["stage"], " ", a["name"]))
	}
	wantNames := []string{"START setup", "END setup", "START ProfilerStep#0", "START data", "END data", "START forward",
		"END forward", "START backward", "END backward", "START Optimizer.step#AdamW.step", "END Optimizer.step#AdamW.step",
		"START Optimizer.zero_grad#AdamW.zero_grad", `START checkpoint "best" → saved`, `END checkpoint "best" → saved`,
		"END Optimizer.zero_grad#AdamW.zero_grad", "END ProfilerStep#0", "START ProfilerStep#1", "START data", "END data",
		"START forward", "END forward", "END ProfilerStep#1"}
	if !slices.Equal(names, wantNames) {
		t.Errorf("annotations\n got %q\nwant %q", names, wantNames)
	}
}

// TestAllocatorSettings checks the settings dict against what PyTorch reports for the same configuration,
// and that a string PyTorch refuses gives no dict at all rather than guessed values.
func TestAllocatorSettings(t *testing.T) {
	tests := map[string]struct {
		conf, source, workload string
		want                   torchSettings
		ok                     bool
	}{
		"defaults":           {conf: "", want: torchSettings{maxSplit: -1}, ok: true},
		"expandable":         {conf: "expandable_segments:True", want: torchSettings{conf: "expandable_segments:True", maxSplit: -1, expandable: true}, ok: true},
		"max split in MiB":   {conf: "max_split_size_mb:128", want: torchSettings{conf: "max_split_size_mb:128", maxSplit: 128 << 20}, ok: true},
		"max split floor":    {conf: "large_segment_size_mb:40,max_split_size_mb:40", want: torchSettings{conf: "large_segment_size_mb:40,max_split_size_mb:40", maxSplit: 40 << 20}, ok: true},
		"refused, too small": {conf: "max_split_size_mb:4", ok: false},
		"refused, true":      {conf: "expandable_segments:true", ok: false},
		"gc threshold":       {conf: "garbage_collection_threshold:0.6, roundup_power2_divisions:[256:1,>:4]", want: torchSettings{conf: "garbage_collection_threshold:0.6, roundup_power2_divisions:[256:1,>:4]", maxSplit: -1, gcThresh: 0.6}, ok: true},
		"imported, unknown":  {source: "pytorch", workload: `{"allocator_settings_known":false}`, ok: false},
		"imported, recorded": {conf: "expandable_segments:True", source: "pytorch", workload: `{"allocator_settings_known":true}`, want: torchSettings{conf: "expandable_segments:True", maxSplit: -1, expandable: true}, ok: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			m := snapshot.Meta{AllocatorSettings: tc.conf, Source: tc.source}
			if tc.workload != "" {
				m.Workload = json.RawMessage(tc.workload)
			}
			got, ok := allocatorSettings(m)
			if ok != tc.ok || ok && got != tc.want {
				t.Errorf("allocatorSettings = %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

// memoryVizScript runs PyTorch's own _memory_viz on an export. Since 2.1 it has segsum (which asserts that
// every segment's blocks add up) and trace (a replay of every device's entries). Before (Debian's 1.13) it
// has stats, which asserts the same and sums the bytes of each block state, and segments, whose folded
// stacks ("stream_S;seg_ADDR;state size", one line per block) are what its flame graph draws; the formatter
// is replaced by the identity so that flamegraph.pl is not fetched.
const memoryVizScript = `
import json, pickle, sys
from torch.cuda import _memory_viz
class DataOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("global refused")
snap = DataOnly(open(sys.argv[1], "rb")).load()
if hasattr(_memory_viz, "segsum"):
    print(json.dumps({"Segsum": _memory_viz.segsum(snap), "Trace": _memory_viz.trace(snap), "HasTrace": True}))
else:
    st = _memory_viz.stats(snap["segments"])
    folded = _memory_viz.segments(snap["segments"], format_flamegraph=lambda s: s)
    print(json.dumps({"Stats": {k: getattr(v, "value", v) for k, v in st.items()}, "Folded": folded, "HasTrace": False}))
`

// TestTorchMemoryVizHelpers has PyTorch's _memory_viz read the exports. With PyTorch 2.1 or later, segsum
// and trace: every segment adds up, and the replay counts every entry and shows the OOM. Before, stats and
// segments: every segment adds up (stats asserts it), stats counts the segments, the reserved bytes and the
// allocated bytes the export ends with, and the flame graph's input gives each segment its total size.
func TestTorchMemoryVizHelpers(t *testing.T) {
	version := torchtest.Require(t)
	for _, name := range []string{"fixture", "oom", "expandable"} {
		t.Run(name, func(t *testing.T) {
			s := fixture()
			if name != "fixture" {
				s = recorded(t, name)
			}
			var got struct {
				Segsum, Trace, Folded string
				Stats                 map[string]int64
				HasTrace              bool
			}
			torchtest.Run(t, memoryVizScript, &got, writeTemp(t, "snapshot.pickle", exportBytes(t, torchPickle, s)))
			tl := timeline.New(s)
			segs := segmentsAt(tl, tl.Len()-1)
			if len(segs) == 0 {
				t.Fatal("the recording ends with no segment: nothing to compare")
			}
			var reserved int64
			bySeg := map[string]int64{}
			for _, sg := range segs {
				reserved += sg.Size
				bySeg[fmt.Sprintf("seg_%d", sg.Addr)] = sg.Size
			}
			if !got.HasTrace {
				t.Logf("PyTorch %s: stats and segments checked (no segsum or trace before 2.1)", version)
				allocated := tl.Allocated(tl.Len() - 1)
				if got.Stats["segments"] != int64(len(segs)) || got.Stats["total_size"] != reserved || got.Stats["active_allocated"] != allocated {
					t.Errorf("stats %v; want %d segments, total_size %d, active_allocated %d", got.Stats, len(segs), reserved, allocated)
				}
				drawn := map[string]int64{}
				for line := range strings.Lines(got.Folded) {
					stack, size, ok := strings.Cut(strings.TrimSpace(line), " ")
					n, err := strconv.ParseInt(size, 10, 64)
					parts := strings.Split(stack, ";")
					if !ok || err != nil || len(parts) < 3 {
						t.Fatalf("segments printed %q", line)
					}
					drawn[parts[1]] += n
				}
				if !maps.Equal(drawn, bySeg) {
					t.Errorf("the flame graph draws %v by segment, the export's segments are %v", drawn, bySeg)
				}
				return
			}
			for _, want := range []string{fmt.Sprintf("segments: %d\n", len(segs)), "total_reserved: "} {
				if !strings.Contains(got.Segsum, want) {
					t.Errorf("segsum does not say %q:\n%s", want, got.Segsum)
				}
			}
			entries := len(allocatorSeqs(s))
			if !strings.Contains(got.Trace, fmt.Sprintf("%d entries\n", entries)) {
				t.Errorf("trace does not count %d entries:\n%.2000s", entries, got.Trace)
			}
			if oom := tl.OOMs(); len(oom) > 0 && !strings.Contains(got.Trace, "raise OutOfMemoryError()") {
				t.Errorf("trace does not show the OOM:\n%.2000s", got.Trace)
			}
		})
	}
}

// TestTorchRoundTripPyTorch imports every real PyTorch snapshot (pickle and .pkl alike), exports it and
// imports the export: PyTorch's own history survives the trip through oomdbg, pre-existing blocks and all.
func TestTorchRoundTripPyTorch(t *testing.T) {
	for _, name := range torchtest.Fixtures {
		t.Run(name, func(t *testing.T) {
			orig, err := torch.ImportFile(torchtest.FixturePath(t, name))
			if err != nil {
				t.Fatal(err)
			}
			for form, write := range map[string]func(*bytes.Buffer, *timeline.Timeline) error{"pickle": torchPickle, "json": torchJSON} {
				im, err := torch.Import(exportBytes(t, write, orig))
				if err != nil {
					t.Fatalf("%s: %v", form, err)
				}
				checkSameTimeline(t, timeline.New(orig), timeline.New(im))
			}
		})
	}
}

// TestTorchSameMicrosecond checks that iterations survive a round trip when their boundaries fall inside the
// microsecond of PyTorch's time_us: the allocations of each iteration come back in it, and no time moves by
// more than the microsecond placeTimes allows.
func TestTorchSameMicrosecond(t *testing.T) {
	b := newBuilder(fixtureMeta())
	type ev = snapshot.Event
	st := b.stack(frame{"main.main", "/src/main.go", 1})
	add := b.addAt
	add(ev{Action: snapshot.ActionSegmentAlloc, Addr: segA, Size: 2 * mib, Stack: st, Iteration: -1}, 100)
	for i, it := range []int32{0, 1, 2} {
		base := int64(i) * 450 // iterations 0 and 1 in microsecond 0, iteration 2 across 0 and 1
		addr := segA + uint64(i)*512
		add(ev{Action: snapshot.ActionIteration, Iteration: it}, base+200)
		add(ev{Action: snapshot.ActionAlloc, Addr: addr, Size: 512, BlockSize: 512, Stack: st, Iteration: it}, base+300)
		add(ev{Action: snapshot.ActionFreeRequested, Addr: addr, Size: 512, BlockSize: 512, Iteration: it}, base+400)
		add(ev{Action: snapshot.ActionFreeCompleted, Addr: addr, Size: 512, BlockSize: 512, Iteration: it}, base+500)
	}
	b.s.Footer = &snapshot.Footer{Segments: []snapshot.Segment{{Device: 0, Addr: segA, Size: 2 * mib, Pool: "small",
		Blocks: []snapshot.Block{{Addr: segA, Size: 2 * mib, State: stateInactive}}}}}
	want := timeline.New(b.s)

	for form, write := range map[string]func(*bytes.Buffer, *timeline.Timeline) error{"pickle": torchPickle, "json": torchJSON} {
		t.Run(form, func(t *testing.T) {
			im, err := torch.Import(exportBytes(t, write, b.s))
			if err != nil {
				t.Fatal(err)
			}
			got := timeline.New(im)
			var wantIters, gotIters []int32
			for id := range want.NumAllocations() {
				wantIters = append(wantIters, want.Allocation(id, want.Len()-1).Iteration)
			}
			for id := range got.NumAllocations() {
				gotIters = append(gotIters, got.Allocation(id, got.Len()-1).Iteration)
			}
			if !slices.Equal(gotIters, wantIters) || len(wantIters) != 3 {
				t.Errorf("allocations in iterations %v after the round trip, want %v", gotIters, wantIters)
			}
			// Three boundaries share microseconds 0 and 1: each may take a microsecond of its own.
			for i, e := range im.Events.All() {
				if e.Action == snapshot.ActionAlloc || e.Action == snapshot.ActionFreeCompleted {
					if us := e.Time / 1000; us > 4 {
						t.Errorf("event %d (%s) at %d us; the events span 1.5 us, and 3 boundaries move them by 3 at most", i, e.Action, us)
					}
				}
			}
		})
	}
}

// TestTorchAtAnEvent exports each one-device snapshot as it stood at its peak and at the end of its first
// iteration, imports the export, and holds it to the recording up to that event: the same allocator actions,
// the same allocated and reserved bytes after each, and the allocator's state then (the segments PyTorch's
// dump would have listed: the bytes reserved at the event, in as many segments as were mapped).
func TestTorchAtAnEvent(t *testing.T) {
	for name, s := range snapshots(t) {
		tl := timeline.New(s)
		if len(s.DevicesWithMemory()) != 1 {
			continue
		}
		for _, at := range []At{{Kind: AtPeak}, {Kind: AtIterationEnd, N: 0}} {
			seq, err := at.resolve(tl, nil, s.Events.Len())
			if err != nil {
				continue // no such iteration
			}
			t.Run(name+"/"+at.String(), func(t *testing.T) {
				var buf bytes.Buffer
				what, err := Write(&buf, s, FormatTorch, Options{At: &at})
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(what, fmt.Sprintf(" as it stood at %s (event %d): ", at, seq)) {
					t.Errorf("it says it wrote %q", what)
				}
				im, err := torch.Import(buf.Bytes())
				if err != nil {
					t.Fatal(err)
				}
				got := timeline.New(im)
				var want []int
				for _, i := range allocatorSeqs(s) {
					if i <= seq {
						want = append(want, i)
					}
				}
				gs := allocatorSeqs(im)
				if len(gs) != len(want) {
					t.Fatalf("%d allocator actions, want the %d up to event %d", len(gs), len(want), seq)
				}
				for k := range want {
					for _, series := range []timeline.Series{timeline.Allocated, timeline.Reserved} {
						if w, g := tl.Value(series, want[k]), got.Value(series, gs[k]); w != g {
							t.Fatalf("%s after allocator action %d: %d, want %d", series, k, g, w)
						}
					}
				}
				var reserved int64
				for _, sg := range im.Footer.Segments {
					reserved += sg.Size
				}
				if w := tl.Value(timeline.Reserved, seq); reserved != w || len(im.Footer.Segments) != len(tl.SegmentsAt(seq)) {
					t.Errorf("the state written: %d segments of %d bytes, want %d segments of %d bytes as at event %d",
						len(im.Footer.Segments), reserved, len(tl.SegmentsAt(seq)), w, seq)
				}
			})
		}
	}
}
