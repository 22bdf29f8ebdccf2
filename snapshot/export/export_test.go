package export

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/oomdbg/oomdbg/snapshot"
)

func TestParseFormat(t *testing.T) {
	for _, f := range Formats {
		got, err := ParseFormat(string(f))
		if err != nil || got != f {
			t.Errorf("ParseFormat(%q) = %q, %v", f, got, err)
		}
		if g, ok := FormatForFile("out" + f.Extension()); f != FormatTorchJSON && (!ok || g != f) {
			t.Errorf("FormatForFile(%q) = %q, %v; want %q", "out"+f.Extension(), g, ok, f)
		}
	}
	for _, bad := range []string{"", "TORCH", "pickle", "html"} {
		if _, err := ParseFormat(bad); !errors.Is(err, ErrFormat) {
			t.Errorf("ParseFormat(%q) error %v, want ErrFormat", bad, err)
		}
	}
	for name, want := range map[string]Format{"a.PKL": FormatTorch, "b.pprof": FormatPprof, "c.perfetto.json": FormatPerfetto} {
		if got, ok := FormatForFile(name); !ok || got != want {
			t.Errorf("FormatForFile(%q) = %q, %v; want %q", name, got, ok, want)
		}
	}
	if f, ok := FormatForFile("x.json"); ok {
		t.Errorf("FormatForFile(x.json) guessed %q: torch-json and perfetto are both JSON", f)
	}
}

// TestWrite runs every format through Write and checks the line it returns.
func TestWrite(t *testing.T) {
	peak := At{Kind: AtPeak}
	tests := map[string]struct {
		format Format
		at     *At
		want   string // in the description
		err    string
	}{
		"torch":          {format: FormatTorch, want: "PyTorch memory snapshot: 21 trace entries and 1 segments"},
		"torch-json":     {format: FormatTorchJSON, want: "21 trace entries"},
		"pprof":          {format: FormatPprof, want: "live set at the peak (event 14): 8.01 MiB in 7 blocks"},
		"pprof at oom":   {format: FormatPprof, at: &At{Kind: AtOOM}, want: "live set at oom (event 36): 13.00 KiB in 6 blocks"},
		"perfetto":       {format: FormatPerfetto, want: "trace events over 39 snapshot events"},
		"svg":            {format: FormatSVG, want: "SVG timeline plot of 39 events"},
		"png":            {format: FormatPNG, at: &peak, want: "PNG timeline plot"},
		"torch at peak":  {format: FormatTorch, at: &peak, want: "PyTorch memory snapshot as it stood at peak (event 14): "},
		"unknown format": {format: "html", err: "unknown export format"},
		"missing event":  {format: FormatPprof, at: &At{Kind: AtEvent, N: 39}, err: "no event 39"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			what, err := Write(&buf, fixture(), tc.format, Options{At: tc.at})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !strings.Contains(what, tc.want) || buf.Len() == 0 {
				t.Errorf("Write said %q (%d bytes), want %q", what, buf.Len(), tc.want)
			}
		})
	}
}

// TestWriteEmpty exports a snapshot without events: a document without entries, or an error that says so.
func TestWriteEmpty(t *testing.T) {
	empty := &snapshot.Snapshot{Meta: fixtureMeta(), Strings: []string{""}, Frames: []snapshot.Frame{{}}, Stacks: [][]snapshot.FrameID{nil}}
	for _, f := range Formats {
		t.Run(string(f), func(t *testing.T) {
			var buf bytes.Buffer
			_, err := Write(&buf, empty, f, Options{})
			switch f {
			case FormatTorch, FormatTorchJSON, FormatPerfetto:
				if err != nil || buf.Len() == 0 {
					t.Errorf("%d bytes, %v", buf.Len(), err)
				}
			default:
				if err == nil || !strings.Contains(err.Error(), "no events") && !strings.Contains(err.Error(), "outside") {
					t.Errorf("error %v, want one saying there is nothing to export", err)
				}
			}
		})
	}
}

// TestDevice exports one device of a two-device snapshot: only its trace and segments, numbered as PyTorch
// numbers devices, with the markers of the run kept and event numbers of the whole snapshot.
func TestDevice(t *testing.T) {
	s := twoDevices()
	decode := func(device int) map[string]json.RawMessage {
		var buf bytes.Buffer
		var opts Options
		if device >= 0 {
			opts.Device = &device
		}
		if _, err := Write(&buf, s, FormatTorchJSON, opts); err != nil {
			t.Fatal(err)
		}
		var doc map[string]json.RawMessage
		if err := json.Unmarshal(buf.Bytes(), &doc); err != nil {
			t.Fatal(err)
		}
		return doc
	}
	tests := map[string]struct {
		device   int
		entries  []int // per device ordinal
		segments []int // their devices
	}{
		"all":      {-1, []int{21, 2}, []int{0, 1}},
		"device 0": {0, []int{21}, []int{0}},
		"device 1": {1, []int{0, 2}, []int{1}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			doc := decode(tc.device)
			var traces [][]json.RawMessage
			var segs []struct{ Device int }
			var notes []struct{ Device int }
			json.Unmarshal(doc["device_traces"], &traces)
			json.Unmarshal(doc["segments"], &segs)
			json.Unmarshal(doc["external_annotations"], &notes)
			var entries, devs []int
			for _, tr := range traces {
				entries = append(entries, len(tr))
			}
			for _, sg := range segs {
				devs = append(devs, sg.Device)
			}
			if !equalInts(entries, tc.entries) || !equalInts(devs, tc.segments) {
				t.Errorf("entries by device %v, segments on %v; want %v and %v", entries, devs, tc.entries, tc.segments)
			}
			if len(notes) != 22 {
				t.Errorf("%d annotations, want the run's 22 whatever the device", len(notes))
			}
			if tc.device == 1 && notes[0].Device != 1 {
				t.Errorf("annotations on device %d, want 1", notes[0].Device)
			}
		})
	}
	var buf bytes.Buffer
	at := At{Kind: AtEvent, N: 40} // the alloc of device 1
	zero, one, two := 0, 1, 2
	what, err := Write(&buf, s, FormatPprof, Options{Device: &one, At: &at})
	if err != nil || !strings.Contains(what, "(event 40): 12.00 MiB in 1 blocks") {
		t.Errorf("device 1 at event 40: %q, %v", what, err)
	}
	for _, f := range []Format{FormatPerfetto, FormatSVG} {
		buf.Reset()
		if _, err := Write(&buf, s, f, Options{Device: &one, At: &at}); err != nil || !strings.Contains(buf.String(), "event 40") {
			t.Errorf("%s of device 1 does not mark event 40 by its number in the snapshot: %v", f, err)
		}
	}
	peak := At{Kind: AtPeak}
	if what, err := Write(&buf, s, FormatPprof, Options{Device: &zero, At: &peak}); err != nil || !strings.Contains(what, "8.01 MiB") {
		t.Errorf("device 0 at its peak: %q, %v", what, err)
	}
	if _, err := Write(&buf, s, FormatTorch, Options{Device: &two}); err == nil || !strings.Contains(err.Error(), "no device 2 (it has 0, 1)") {
		t.Errorf("device 2: %v", err)
	}
}

func equalInts(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func TestTitle(t *testing.T) {
	tests := map[string]struct {
		meta snapshot.Meta
		want string
	}{
		"preset": {snapshot.Meta{Tool: "oomdbg", Workload: json.RawMessage(`{"model":"gpt","preset":"gpt2-medium","batch":16}`),
			Devices: []snapshot.DeviceInfo{{Name: "simulated GPU (meta)"}}}, "oomdbg gpt2-medium (gpt, batch 16) on simulated GPU (meta)"},
		"model only": {snapshot.Meta{Tool: "oomdbg", Workload: json.RawMessage(`{"model":"mlp","batch":64}`)}, "oomdbg mlp (batch 64)"},
		"pytorch": {snapshot.Meta{Tool: "pytorch", Source: "pytorch", Workload: json.RawMessage(`{"format":"pickle","generation":"G4"}`),
			Devices: []snapshot.DeviceInfo{{Name: "cuda:0"}, {Name: "cuda:1"}}}, "PyTorch snapshot (pickle, G4) on cuda:0, cuda:1"},
		"nothing": {snapshot.Meta{Created: time.Unix(0, 0)}, "oomdbg"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := Title(tc.meta); got != tc.want {
				t.Errorf("Title = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int]string{0: "0", 999: "999", 1000: "1,000", 1234567: "1,234,567", -45000: "-45,000"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
