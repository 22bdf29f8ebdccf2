package export

import (
	"bytes"
	"image/png"
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/charmbracelet/x/exp/golden"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

func plotBytes(t *testing.T, s *snapshot.Snapshot, f Format, opts PlotOptions) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := writePlot(&buf, timeline.New(s), f, opts); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// The SVG is deterministic (fonts by name, fixed sizes): the golden file pins the whole drawing.
func TestPlotSVGGolden(t *testing.T) {
	svg := plotBytes(t, fixture(), FormatSVG, PlotOptions{Mark: 13})
	if again := plotBytes(t, fixture(), FormatSVG, PlotOptions{Mark: 13}); !bytes.Equal(svg, again) {
		t.Fatal("two SVGs of the same snapshot differ")
	}
	golden.RequireEqual(t, svg)
}

// TestPlotSVGContent checks what every plot says, in its text.
func TestPlotSVGContent(t *testing.T) {
	tests := map[string]struct {
		snapshot string
		want     []string
		not      []string
	}{
		"fixture": {"fixture", []string{"oomdbg mlp (batch 16) on simulated GPU (meta)", "device memory (MiB)", "time (µs)",
			"allocated (peak 8.01 MiB)", "reserved (peak 22.00 MiB)", "capacity 64.00 MiB", "peak 8.01 MiB", "OOM (64.00 MiB)",
			"forward", "backward", "optimizer", "zero_grad"}, nil},
		"oom":                         {"oom", []string{"gpt2-medium", "device memory (GiB)", "OOM (1.00 GiB)", "capacity 24.00 GiB", "forward"}, []string{"backward"}},
		"tiny, far from the capacity": {"tiny", []string{"tiny", "device memory (MiB)", "backward"}, []string{"capacity", "OOM"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var s *snapshot.Snapshot
			if tc.snapshot == "fixture" {
				s = fixture()
			} else {
				s = recorded(t, tc.snapshot)
			}
			svg := string(plotBytes(t, s, FormatSVG, PlotOptions{Mark: -1}))
			for _, w := range tc.want {
				if !strings.Contains(svg, w) {
					t.Errorf("the plot does not say %q", w)
				}
			}
			for _, w := range tc.not {
				if strings.Contains(svg, w) {
					t.Errorf("the plot says %q", w)
				}
			}
		})
	}
}

func TestPlotPNG(t *testing.T) {
	img, err := png.Decode(bytes.NewReader(plotBytes(t, recorded(t, "oom"), FormatPNG, PlotOptions{Mark: -1})))
	if err != nil {
		t.Fatal(err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 576 {
		t.Errorf("PNG of %v, want 1280x576", b)
	}
}

// spiky is a long flat trace with one allocation of 1 GiB that lives for a single event: the shape that
// averaging would flatten.
func spiky() *snapshot.Snapshot {
	b := newBuilder(fixtureMeta())
	b.add(snapshot.Event{Action: snapshot.ActionSegmentAlloc, Addr: segB, Size: 2 << 30})
	for i := range 5000 {
		size := int64(512)
		if i == 3000 {
			size = 1 << 30
		}
		b.add(snapshot.Event{Action: snapshot.ActionAlloc, Addr: segB, Size: size, BlockSize: size})
		b.add(snapshot.Event{Action: snapshot.ActionFreeRequested, Addr: segB, Size: size, BlockSize: size})
	}
	return b.s
}

// TestPlotColumnsKeepPeaks checks the bucketing against the Timeline: every column is the maximum of its
// events, so the highest column is the peak, a one-event spike survives a thousand events a column, and no
// column is higher than the peak.
func TestPlotColumnsKeepPeaks(t *testing.T) {
	for name, s := range map[string]*snapshot.Snapshot{"spike": spiky(), "fixture": fixture(), "oom": recorded(t, "oom"), "tiny": recorded(t, "tiny")} {
		for _, cols := range []int{7, 100, 1280} {
			tl := timeline.New(s)
			su := sizeUnit(1 << 20)
			data := columns(tl, cols, timeUnit(1e6, false), su)
			if len(data.x) != cols {
				t.Fatalf("%s: %d columns, want %d", name, len(data.x), cols)
			}
			peak := float64(tl.Peak(timeline.Allocated).Bytes) / su.scale
			top, at := 0.0, 0
			for i, v := range data.allocated {
				if v > top {
					top, at = v, i
				}
			}
			if math.Abs(top-peak) > 1e-9 {
				t.Errorf("%s, %d columns: highest column %g, peak %g", name, cols, top, peak)
			}
			if name == "spike" && data.phase[at] != s.Events.At(tl.Peak(timeline.Allocated).Seq).Phase {
				t.Errorf("%s: the peak column has phase %s", name, data.phase[at])
			}
			reserved := float64(tl.Peak(timeline.Reserved).Bytes) / su.scale
			for i, v := range data.reserved {
				if v > reserved+1e-9 || data.allocated[i] > v+1e-9 {
					t.Fatalf("%s: column %d has allocated %g, reserved %g over the reserved peak %g", name, i, data.allocated[i], v, reserved)
				}
			}
		}
	}
}

func TestNiceTicks(t *testing.T) {
	tests := map[string]struct {
		lo, hi float64
		want   []string
	}{
		"GiB":      {0, 26, []string{"0", "5", "10", "15", "20", "25"}},
		"MiB":      {0, 15.1, []string{"0", "2", "4", "6", "8", "10", "12", "14"}},
		"fraction": {0, 0.9, []string{"0.0", "0.2", "0.4", "0.6", "0.8"}},
		"quarters": {0, 2, []string{"0.00", "0.25", "0.50", "0.75", "1.00", "1.25", "1.50", "1.75", "2.00"}},
		"empty":    {3, 3, []string{"3"}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var labels []string
			for _, tk := range (niceTicks{}).Ticks(tc.lo, tc.hi) {
				if tk.Label != "" {
					labels = append(labels, tk.Label)
				}
			}
			if strings.Join(labels, " ") != strings.Join(tc.want, " ") {
				t.Errorf("labels %q, want %q", labels, tc.want)
			}
		})
	}
}

// TestPlotLabelsWithinTheImage draws PNGs whose text crowds the edges: a title wider than the image, a peak
// at the right end of the run (its label has no room to its right) and a marked event beside it. Nothing
// may be cut by the image's edge: a border two pixels wide stays the background's white all round, where a
// title or a label running off the image would leave its glyphs.
func TestPlotLabelsWithinTheImage(t *testing.T) {
	s := fixture()
	long := *s
	long.Meta.Devices = slices.Clone(s.Meta.Devices)
	long.Meta.Devices[0].Name = "simulated GPU (meta), rank 0 of 8, zero3, with a device name longer than any plot is wide"
	last := s.Events.Len() - 1
	for name, tc := range map[string]struct {
		s    *snapshot.Snapshot
		opts PlotOptions
	}{
		"a title wider than the image": {&long, PlotOptions{Mark: -1}},
		"a mark at the last event":     {s, PlotOptions{Mark: last, MarkName: "end"}},
		"narrow":                       {&long, PlotOptions{Mark: last, MarkName: "end", Width: 4 * vg.Inch, Height: 3 * vg.Inch}},
	} {
		t.Run(name, func(t *testing.T) {
			img, err := png.Decode(bytes.NewReader(plotBytes(t, tc.s, FormatPNG, tc.opts)))
			if err != nil {
				t.Fatal(err)
			}
			b := img.Bounds()
			for y := b.Min.Y; y < b.Max.Y; y++ {
				for x := b.Min.X; x < b.Max.X; x++ {
					if x >= b.Min.X+2 && x < b.Max.X-2 && y >= b.Min.Y+2 && y < b.Max.Y-2 {
						continue
					}
					if r, g, bl, _ := img.At(x, y).RGBA(); r < 0xf000 || g < 0xf000 || bl < 0xf000 {
						t.Fatalf("pixel (%d, %d) of the %dx%d image's edge is drawn on: something runs off the image", x, y, b.Dx(), b.Dy())
					}
				}
			}
		})
	}
}

// TestPlaceLabels holds the placement of marks' labels: inside the plot's area and overlapping none placed
// before, when there is room, however the marks crowd: a point at the right edge, lines beside it and at the
// same height, a line at the left edge.
func TestPlaceLabels(t *testing.T) {
	sty := plot.New().X.Tick.Label
	sty.Font.Size = 8
	area := vg.Rectangle{Min: vg.Point{X: 40, Y: 30}, Max: vg.Point{X: 600, Y: 300}}
	labels := []label{
		{at: vg.Point{X: 598, Y: 290}, text: "peak 22.87 GiB", point: true},
		{at: vg.Point{X: 596}, text: "OOM (1.00 GiB)"},
		{at: vg.Point{X: 590}, text: "iteration-end:1 (event 40660)"},
		{at: vg.Point{X: 41}, text: "event 0"},
		{at: vg.Point{X: 300, Y: 250}, text: "a point in the middle", point: true},
		{at: vg.Point{X: 300}, text: "a line through it"},
	}
	got := placeLabels(area, sty, labels)
	if len(got) != len(labels) {
		t.Fatalf("%d labels placed, want %d", len(got), len(labels))
	}
	for i, p := range got {
		b := p.box
		if b.Min.X < area.Min.X || b.Max.X > area.Max.X || b.Min.Y < area.Min.Y || b.Max.Y > area.Max.Y {
			t.Errorf("%q at %v, outside the area %v", p.text, b, area)
		}
		if b.Size().X != sty.Width(p.text) {
			t.Errorf("%q is %v wide, the text %v", p.text, b.Size().X, sty.Width(p.text))
		}
		for _, o := range got[:i] {
			if b.Min.X < o.box.Max.X && o.box.Min.X < b.Max.X && b.Min.Y < o.box.Max.Y && o.box.Min.Y < b.Max.Y {
				t.Errorf("%q at %v overlaps %q at %v", p.text, b, o.text, o.box)
			}
		}
	}
}
