package triage_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// deviceMemory is CPython's own reading of a snapshot pickle's memory per device, as PyTorch's allocator
// counts it: after the trace, allocated is the size of every active block and reserved that of every
// segment; walking the trace back from there, an alloc added its block's size to allocated and a
// free_requested took it off, a segment_alloc (segment_map) added to reserved and a segment_free
// (segment_unmap) took off. A trace entry gives the block's size, or, in newer PyTorch, the size requested,
// which the block rounds up by round_size (a multiple of 512, at least 512; the fixtures' settings have no
// roundup_power2_divisions). The peaks are the highest values of the walk.
const deviceMemory = `
import json, pickle, sys
d = pickle.load(open(sys.argv[1], "rb"))
rnd = lambda n: max(512, (n + 511) // 512 * 512)
out = {}
for seg in d["segments"]:
    m = out.setdefault(str(seg["device"]), {"end_allocated": 0, "end_reserved": 0})
    m["end_reserved"] += seg["total_size"]
    m["end_allocated"] += sum(b["size"] for b in seg["blocks"] if b["state"] == "active_allocated")
for dev, trace in enumerate(d["device_traces"]):
    if not trace and str(dev) not in out:
        continue  # a device the program never used (f8 lists four traces, the fourth empty)
    m = out.setdefault(str(dev), {"end_allocated": 0, "end_reserved": 0})
    a, r = m["end_allocated"], m["end_reserved"]
    pa, pr = a, r
    for e in reversed(trace):
        act = e["action"]
        if act == "alloc": a -= rnd(e["size"])
        elif act == "free_requested": a += rnd(e["size"])
        elif act in ("segment_alloc", "segment_map"): r -= e["size"]
        elif act in ("segment_free", "segment_unmap"): r += e["size"]
        pa, pr = max(pa, a), max(pr, r)
    m["peak_allocated"], m["peak_reserved"] = pa, pr
print(json.dumps(out))
`

// TestDevicesAgainstCPython: on the real snapshots of several devices the report gives each device's own
// peak and its allocated and reserved memory after the last event, as CPython reads them from the pickle,
// and the text report says them. Memory on two devices is no one pool: the report's peak and gaps are one
// device's (the one that ran out of memory, else the highest peak), never their sum.
func TestDevicesAgainstCPython(t *testing.T) {
	py := torchtest.RequirePython(t)
	for _, name := range []string{torchtest.F4, torchtest.F7, torchtest.F8} {
		t.Run(name, func(t *testing.T) {
			path := torchtest.FixturePath(t, name)
			out, err := exec.Command(py, "-c", deviceMemory, path).Output()
			if err != nil {
				t.Fatal(err)
			}
			var want map[string]struct {
				PeakAllocated int64 `json:"peak_allocated"`
				PeakReserved  int64 `json:"peak_reserved"`
				EndAllocated  int64 `json:"end_allocated"`
				EndReserved   int64 `json:"end_reserved"`
			}
			if err := json.Unmarshal(out, &want); err != nil {
				t.Fatal(err)
			}
			s, err := load.File(path)
			if err != nil {
				t.Fatal(err)
			}
			r := triage.Analyze(t.Context(), timeline.New(s), triage.Options{})
			if len(r.Devices) != len(want) || len(want) < 2 {
				t.Fatalf("%d devices reported, CPython reads %d", len(r.Devices), len(want))
			}
			var text bytes.Buffer
			if err := r.WriteText(&text); err != nil {
				t.Fatal(err)
			}
			var sum int64
			for _, d := range r.Devices {
				w, ok := want[itoa(d.Index)]
				if !ok {
					t.Fatalf("device %d: CPython reads none", d.Index)
				}
				if d.PeakAllocated != w.PeakAllocated || d.PeakReserved != w.PeakReserved || d.EndAllocated != w.EndAllocated || d.EndReserved != w.EndReserved {
					t.Errorf("device %d: peak %d allocated, %d reserved; end %d, %d; CPython reads %+v", d.Index,
						d.PeakAllocated, d.PeakReserved, d.EndAllocated, d.EndReserved, w)
				}
				if d.PeakEvent < 0 || d.PeakEvent >= s.Events.Len() || int(s.Events.At(d.PeakEvent).Device) != d.Index && s.Events.At(d.PeakEvent).Action <= snapshot.ActionOOM {
					t.Errorf("device %d: peak at event %d, not one of its own", d.Index, d.PeakEvent)
				}
				sum += d.EndAllocated
				if !strings.Contains(text.String(), "peak "+formatSize(d.PeakAllocated)+" allocated at event "+itoa(d.PeakEvent)) {
					t.Errorf("the text report does not give device %d's peak:\n%s", d.Index, text.String())
				}
			}
			if end := timeline.New(s); end.Allocated(end.Len()-1) != sum {
				t.Errorf("the devices' allocated memory after the last event sums to %d, the snapshot's is %d", sum, end.Allocated(end.Len()-1))
			}
			focus, withMemory := -1, 0
			for dev, w := range want {
				if w.PeakReserved == 0 {
					continue
				}
				withMemory++
				if i, _ := strconv.Atoi(dev); focus < 0 || w.PeakAllocated > want[itoa(focus)].PeakAllocated {
					focus = i
				}
			}
			if r.OOM != nil {
				focus = r.OOM.Device // f8's OOM is on cuda:1, also its highest peak
			}
			w := want[itoa(focus)]
			if r.Peak.Device != focus || r.Peak.Devices != withMemory || r.Peak.Allocated != w.PeakAllocated || r.Gaps.Device != focus {
				t.Errorf("peak %d on device %d of %d, gaps of %d; CPython: device %d of %d peaks at %d", r.Peak.Allocated,
					r.Peak.Device, r.Peak.Devices, r.Gaps.Device, focus, withMemory, w.PeakAllocated)
			}
			if withMemory > 1 && !strings.Contains(text.String(), "PEAK ON "+strings.ToUpper(r.Devices[slices.IndexFunc(r.Devices,
				func(d triage.Device) bool { return d.Index == focus })].Name)) {
				t.Errorf("the text report does not say whose peak it gives:\n%s", text.String())
			}
		})
	}
}

// TestPeakLabelOfForwardOnlyTrace: f3 is one forward pass (no iteration): its peak is in forward, outside
// any iteration, and the report says so as Where names the phase span the timeline holds there (what the
// TUI shows), not "setup".
func TestPeakLabelOfForwardOnlyTrace(t *testing.T) {
	s, err := load.File(torchtest.FixturePath(t, torchtest.F3))
	if err != nil {
		t.Fatal(err)
	}
	tl := timeline.New(s)
	r := triage.Analyze(t.Context(), tl, triage.Options{})
	var span timeline.PhaseSpan
	for _, p := range tl.Phases() {
		if p.Start <= r.Peak.Event && r.Peak.Event < p.End {
			span = p
		}
	}
	label := triage.Where(span.Iteration, span.Phase)
	if label != "forward, outside any iteration" {
		t.Errorf("the timeline's span at the peak is %q, want forward, outside any iteration", label)
	}
	var text bytes.Buffer
	if err := r.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "at event "+itoa(r.Peak.Event)+" ("+label+")") {
		t.Errorf("the report's peak is not labelled %q:\n%s", label, strings.SplitN(text.String(), "\n", 6)[4])
	}
}

func itoa(n int) string { return strconv.Itoa(n) }

func formatSize(n int64) string { return units.FormatSize(n) }
