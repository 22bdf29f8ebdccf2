package export

import (
	"fmt"
	"image/color"
	"io"
	"math"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/text"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
	"gonum.org/v1/plot/vg/vgsvg"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// PlotOptions size a timeline plot. Zero fields take the defaults.
type PlotOptions struct {
	Width, Height vg.Length // default 10 by 4.5 inches
	// DPI is the PNG's resolution (default 128: 1280 by 576 pixels); the SVG is resolution-free.
	DPI int
	// Columns is how many columns the events are bucketed into, each drawn at its maximum (default: one per
	// pixel of the PNG's width).
	Columns int
	// Mark is an event to mark with a labelled line (what --at names), or -1; MarkName how --at named it
	// ("peak", "iteration-end:2"), for its label. Write sets them.
	Mark     int
	MarkName string
	// seq numbers events in labels: a device view's events by their seq in the whole snapshot (nil: as
	// the Timeline numbers them).
	seq []int
}

func (o PlotOptions) withDefaults() PlotOptions {
	if o.Width <= 0 {
		o.Width = 10 * vg.Inch
	}
	if o.Height <= 0 {
		o.Height = 4.5 * vg.Inch
	}
	if o.DPI <= 0 {
		o.DPI = 128
	}
	if o.Columns <= 0 {
		o.Columns = int(float64(o.Width/vg.Inch) * float64(o.DPI))
	}
	return o
}

// SVG writes the timeline plot of tl as SVG: allocated and reserved bytes over time, bucketed by their
// maximum per column (never averaged: that would hide the peak), the phases shaded under the allocated
// curve, the device's capacity as a line when memory comes near it, the peak and each OOM marked, sizes in
// binary units, and a title naming the workload and the device. Text uses the Liberation fonts, by name.
func SVG(w io.Writer, tl *timeline.Timeline, opts PlotOptions) error {
	return writePlot(w, tl, FormatSVG, opts)
}

// PNG writes the plot SVG draws as a PNG image.
func PNG(w io.Writer, tl *timeline.Timeline, opts PlotOptions) error {
	return writePlot(w, tl, FormatPNG, opts)
}

func writePlot(w io.Writer, tl *timeline.Timeline, f Format, opts PlotOptions) error {
	opts = opts.withDefaults()
	p, legend, err := newPlot(tl, opts)
	if err != nil {
		return err
	}
	var c vg.CanvasWriterTo
	if f == FormatPNG {
		c = vgimg.PngCanvas{Canvas: vgimg.NewWith(vgimg.UseWH(opts.Width, opts.Height), vgimg.UseDPI(opts.DPI))}
	} else {
		c = vgsvg.New(opts.Width, opts.Height)
	}
	dc := draw.New(c)
	// The legend gets a strip of its own on the right, where it hides none of the curves, with a margin on
	// both sides of it; the plot half a margin all round, and its title as many lines as it takes to fit.
	margin := vg.Points(8)
	strip := legend.Rectangle(dc).Size().X + 3*margin
	p.Title.Text = wrapText(p.Title.Text, p.Title.TextStyle, opts.Width-strip-2*margin)
	p.Draw(draw.Crop(dc, margin/2, -strip, margin/2, -margin/2))
	legend.Draw(draw.Crop(dc, opts.Width-strip+margin, -2*margin, margin, -3*margin))
	_, err = c.WriteTo(w)
	return err
}

// The plot's colours: the phases in the Tableau 10 palette memory_viz also uses, lightened to sit under
// the curves.
var (
	allocatedColor = color.RGBA{0x1f, 0x1f, 0x1f, 0xff}
	reservedColor  = color.RGBA{0xe1, 0x57, 0x59, 0xff}
	capacityColor  = color.RGBA{0x8b, 0x00, 0x00, 0xff}
	oomColor       = color.RGBA{0xd6, 0x00, 0x00, 0xff}
	markColor      = color.RGBA{0x55, 0x55, 0x55, 0xff}
	phaseColors    = [snapshot.NumPhases]color.RGBA{
		snapshot.PhaseNone:      {0xd0, 0xd0, 0xd0, 0xff},
		snapshot.PhaseSetup:     {0xba, 0xb0, 0xab, 0xff},
		snapshot.PhaseData:      {0xc4, 0xa8, 0x96, 0xff},
		snapshot.PhaseForward:   {0x9d, 0xb8, 0xd6, 0xff},
		snapshot.PhaseBackward:  {0xf7, 0xbf, 0x8b, 0xff},
		snapshot.PhaseRecompute: {0xf5, 0xe2, 0x9a, 0xff},
		snapshot.PhaseOptimizer: {0xa3, 0xd0, 0x9b, 0xff},
		snapshot.PhaseZeroGrad:  {0xb2, 0xd9, 0xd5, 0xff},
		snapshot.PhaseEval:      {0xd4, 0xb8, 0xcf, 0xff},
		snapshot.PhaseLoad:      {0x9c, 0x8a, 0x7e, 0xff},
	}
)

// plotData is the plot's data: events bucketed into columns by time, each holding the maximum of the
// series over its events (and the value carried into it), never an average, which would hide the peak.
type plotData struct {
	x         []float64 // column centres, in the axis unit
	allocated []float64 // in the size unit
	reserved  []float64
	phase     []snapshot.Phase // of the event with the column's highest allocated bytes
	left      []float64        // column edges
	right     []float64
}

// axisUnit is a time or size unit: a name and how many base units (ns, bytes, events) it holds.
type axisUnit struct {
	name  string
	scale float64
}

func timeUnit(span int64, index bool) axisUnit {
	switch {
	case index:
		return axisUnit{"event", 1}
	case span >= 2e9:
		return axisUnit{"s", 1e9}
	case span >= 2e6:
		return axisUnit{"ms", 1e6}
	}
	return axisUnit{"µs", 1e3}
}

// sizeUnit picks GiB for a gibibyte or more, else MiB or KiB: binary units throughout.
func sizeUnit(top int64) axisUnit {
	switch {
	case top >= 1<<30:
		return axisUnit{"GiB", 1 << 30}
	case top >= 1<<20:
		return axisUnit{"MiB", 1 << 20}
	}
	return axisUnit{"KiB", 1 << 10}
}

// eventTime is an event's position on the time axis: its time, or its index for snapshots without times.
func eventTime(s *snapshot.Snapshot, seq int) int64 {
	if s.Meta.TimeUnit == "index" {
		return int64(seq)
	}
	return s.Events.Time(seq)
}

func phaseOf(s *snapshot.Snapshot, seq int) snapshot.Phase {
	p, _ := s.Events.Phase(seq)
	return p
}

// columns buckets the events of tl into cols columns of equal time.
func columns(tl *timeline.Timeline, cols int, tu, su axisUnit) plotData {
	s := tl.Snapshot()
	n := tl.Len()
	t0, t1 := eventTime(s, 0), eventTime(s, n-1)
	span := max(t1-t0, 1)
	alloc := tl.Allocations()
	var resSeq []int // where reserved bytes change, and to what
	var resVal []int64
	for seq, v := range tl.Steps(timeline.Reserved, 0, n) {
		resSeq, resVal = append(resSeq, seq), append(resVal, v)
	}
	r := 0 // the reserved step in effect
	var tlc plotData
	var carryA, carryR int64
	carryP := snapshot.PhaseNone
	seq := 0
	for c := range cols {
		lo := t0 + int64(float64(span)*float64(c)/float64(cols))
		hi := t0 + int64(float64(span)*float64(c+1)/float64(cols))
		ma, mr, ph := carryA, carryR, carryP
		for ; seq < n && (eventTime(s, seq) < hi || c == cols-1); seq++ {
			if alloc[seq] > ma || seq == 0 {
				ma, ph = alloc[seq], phaseOf(s, seq)
			}
			for r+1 < len(resSeq) && resSeq[r+1] <= seq {
				r++
			}
			mr = max(mr, resVal[r])
			carryA, carryR, carryP = alloc[seq], resVal[r], phaseOf(s, seq)
		}
		tlc.left = append(tlc.left, float64(lo-t0)/tu.scale)
		tlc.right = append(tlc.right, float64(hi-t0)/tu.scale)
		tlc.x = append(tlc.x, (float64(lo-t0)+float64(hi-lo)/2)/tu.scale)
		tlc.allocated = append(tlc.allocated, float64(ma)/su.scale)
		tlc.reserved = append(tlc.reserved, float64(mr)/su.scale)
		tlc.phase = append(tlc.phase, ph)
	}
	return tlc
}

// newPlot returns the timeline plot of tl and its legend, which the caller draws beside it: allocated and
// reserved bytes over time, bucketed by their maximum per column, the area under the allocated curve shaded
// by phase, the device's capacity as a line (when the memory comes within a tenth of it, or ran out), the
// peak and each OOM marked, sizes in binary units (GiB for a gibibyte or more), and a title naming the
// workload and the device.
func newPlot(tl *timeline.Timeline, opts PlotOptions) (*plot.Plot, plot.Legend, error) {
	s := tl.Snapshot()
	n := tl.Len()
	legend := plot.NewLegend()
	if n == 0 {
		return nil, legend, fmt.Errorf("the snapshot has no events to plot")
	}
	peak := tl.Peak(timeline.Allocated)
	peakReserved := tl.Peak(timeline.Reserved)
	var capacity int64
	if len(s.Meta.Devices) == 1 {
		capacity = s.Meta.Devices[0].Capacity
	}
	ooms := tl.OOMs()
	showCapacity := capacity > 0 && (len(ooms) > 0 || peakReserved.Bytes*10 >= capacity)
	top := max(peakReserved.Bytes, peak.Bytes, 1<<20) // a scale even for a snapshot that allocates nothing
	if showCapacity {
		top = max(top, capacity)
	}
	t0 := eventTime(s, 0)
	tu := timeUnit(eventTime(s, n-1)-t0, s.Meta.TimeUnit == "index")
	su := sizeUnit(top)
	data := columns(tl, opts.Columns, tu, su)

	p := plot.New()
	p.Title.Text = Title(s.Meta)
	p.X.Label.Text = "time (" + tu.name + ")"
	if tu.name == "event" {
		p.X.Label.Text = "event"
	}
	p.Y.Label.Text = "device memory (" + su.name + ")"
	p.X.Min, p.X.Max = 0, data.right[len(data.right)-1]
	p.Y.Min, p.Y.Max = 0, float64(top)/su.scale*1.08
	p.X.Tick.Marker = niceTicks{}
	p.Y.Tick.Marker = niceTicks{}
	legend.Top, legend.Left = true, true
	legend.TextStyle.Font.Size = 9
	legend.Padding = vg.Points(3)
	legend.ThumbnailWidth = vg.Points(16)
	p.Add(plotter.NewGrid())

	bands := &phaseBands{data: data}
	p.Add(bands)
	reserved := &curve{xys: xys(data.x, data.reserved), style: draw.LineStyle{Color: reservedColor, Width: vg.Points(1)}}
	allocated := &curve{xys: xys(data.x, data.allocated), style: draw.LineStyle{Color: allocatedColor, Width: vg.Points(1)}}
	p.Add(reserved, allocated)
	legend.Add("allocated (peak "+units.FormatSize(peak.Bytes)+")", allocated)
	legend.Add("reserved (peak "+units.FormatSize(peakReserved.Bytes)+")", reserved)

	marks := &markers{}
	x := func(seq int) float64 { return float64(eventTime(s, seq)-t0) / tu.scale }
	if showCapacity {
		capLine, err := plotter.NewLine(plotter.XYs{{X: p.X.Min, Y: float64(capacity) / su.scale}, {X: p.X.Max, Y: float64(capacity) / su.scale}})
		if err != nil {
			return nil, legend, err
		}
		capLine.LineStyle = draw.LineStyle{Color: capacityColor, Width: vg.Points(1), Dashes: []vg.Length{vg.Points(4), vg.Points(3)}}
		p.Add(capLine)
		legend.Add("capacity "+units.FormatSize(capacity), capLine)
	}
	if peak.Seq >= 0 {
		marks.points = append(marks.points, mark{x: x(peak.Seq), y: float64(peak.Bytes) / su.scale,
			text: "peak " + units.FormatSize(peak.Bytes), color: allocatedColor})
	}
	for _, seq := range ooms {
		e := s.Events.At(seq)
		marks.lines = append(marks.lines, mark{x: x(seq), text: "OOM (" + units.FormatSize(e.BlockSize) + ")", color: oomColor})
	}
	if opts.Mark >= 0 && opts.Mark < n {
		label := fmt.Sprintf("event %d", origSeq(opts.seq, opts.Mark))
		if opts.MarkName != "" && opts.MarkName != strconv.Itoa(origSeq(opts.seq, opts.Mark)) {
			label = fmt.Sprintf("%s (%s)", opts.MarkName, label)
		}
		marks.lines = append(marks.lines, mark{x: x(opts.Mark), text: label, color: markColor, dashed: true})
	}
	p.Add(marks)
	for ph, used := range bands.used() {
		if used {
			legend.Add(snapshot.Phase(ph).String(), swatch{phaseColors[ph]})
		}
	}
	return p, legend, nil
}

func xys(x, y []float64) plotter.XYs {
	pts := make(plotter.XYs, len(x))
	for i := range x {
		pts[i] = plotter.XY{X: x[i], Y: y[i]}
	}
	return pts
}

// phaseBands shades the area under the allocated curve, column by column, in the colour of the phase that
// reached the column's maximum.
type phaseBands struct{ data plotData }

func (b *phaseBands) used() [snapshot.NumPhases]bool {
	var u [snapshot.NumPhases]bool
	for i, ph := range b.data.phase {
		if b.data.allocated[i] > 0 && ph.Valid() {
			u[ph] = true
		}
	}
	return u
}

// Plot draws each run of columns of one phase as one polygon. Small polygons, rather than one path per
// phase, keep a raster canvas fast: its cost grows with the edges a path has on each pixel row.
func (b *phaseBands) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	d := b.data
	y0 := trY(0)
	for i := 0; i < len(d.x); {
		j := i
		for j < len(d.x) && d.phase[j] == d.phase[i] && j-i < maxPathPoints/2 {
			j++
		}
		ph := d.phase[i]
		if !ph.Valid() {
			ph = snapshot.PhaseNone
		}
		pts := []vg.Point{{X: trX(d.left[i]), Y: y0}}
		for k := i; k < j; k++ {
			y := trY(d.allocated[k])
			pts = append(pts, vg.Point{X: trX(d.left[k]), Y: y}, vg.Point{X: trX(d.right[k]), Y: y})
		}
		// Reach under the next polygon, which covers the overlap: edge to edge, anti-aliasing would leave a
		// faint seam between them.
		if j < len(d.x) {
			pts[len(pts)-1].X += vg.Points(0.75)
		}
		pts = append(pts, vg.Point{X: pts[len(pts)-1].X, Y: y0})
		c.FillPolygon(phaseColors[ph], c.ClipPolygonXY(pts))
		i = j
	}
}

// maxPathPoints caps the points of one stroked or filled path (see curve).
const maxPathPoints = 64

// curve is a line through the column maxima, stroked in pieces of maxPathPoints: a raster canvas spends time
// on every edge of a path that crosses a pixel row, and a curve that swings up and down a thousand times
// would cross every row a thousand times in one path.
type curve struct {
	xys   plotter.XYs
	style draw.LineStyle
}

// Plot strokes the curve.
func (l *curve) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	pts := make([]vg.Point, 0, maxPathPoints)
	for i := 0; i < len(l.xys); i += maxPathPoints - 1 {
		pts = pts[:0]
		for _, xy := range l.xys[i:min(i+maxPathPoints, len(l.xys))] {
			pts = append(pts, vg.Point{X: trX(xy.X), Y: trY(xy.Y)})
		}
		c.StrokeLines(l.style, c.ClipLinesXY(pts)...)
	}
}

// Thumbnail draws the curve's legend entry: a short line.
func (l *curve) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	c.StrokeLine2(l.style, c.Min.X, y, c.Max.X, y)
}

// swatch is a legend thumbnail: a box of colour.
type swatch struct{ color color.Color }

// Thumbnail fills the legend entry's box.
func (s swatch) Thumbnail(c *draw.Canvas) {
	r := c.Rectangle
	c.FillPolygon(s.color, []vg.Point{r.Min, {X: r.Min.X, Y: r.Max.Y}, r.Max, {X: r.Max.X, Y: r.Min.Y}})
}

// mark is a labelled point or vertical line.
type mark struct {
	x, y   float64
	text   string
	color  color.Color
	dashed bool
}

// markers draws the peak (a point) and the OOMs and the marked event (vertical lines), each with its label.
type markers struct {
	points []mark
	lines  []mark
}

// Plot draws the marks, and their labels where placeLabels puts them.
func (m *markers) Plot(c draw.Canvas, plt *plot.Plot) {
	trX, trY := plt.Transforms(&c)
	sty := plt.X.Tick.Label
	sty.Font.Size = 8
	var labels []label
	for _, p := range m.points {
		pt := vg.Point{X: trX(p.x), Y: trY(p.y)}
		c.DrawGlyph(draw.GlyphStyle{Color: p.color, Radius: vg.Points(2.5), Shape: draw.CircleGlyph{}}, pt)
		labels = append(labels, label{at: pt, text: p.text, color: p.color, point: true})
	}
	for _, l := range m.lines {
		x := trX(l.x)
		ls := draw.LineStyle{Color: l.color, Width: vg.Points(1)}
		if l.dashed {
			ls.Dashes = []vg.Length{vg.Points(2), vg.Points(2)}
		}
		c.StrokeLine2(ls, x, c.Min.Y, x, c.Max.Y)
		labels = append(labels, label{at: vg.Point{X: x}, text: l.text, color: l.color})
	}
	for _, pl := range placeLabels(c.Rectangle, sty, labels) {
		sty.Color, sty.XAlign, sty.YAlign = pl.color, pl.xAlign, draw.YBottom
		c.FillText(sty, pl.at, pl.text)
	}
}

// label is a mark's text to place: beside a point (at), or beside a vertical line at at.X.
type label struct {
	at    vg.Point
	text  string
	color color.Color
	point bool
}

// placed is a label placed: drawn from at, aligned by xAlign, its text bottom at at.Y, within box.
type placed struct {
	label
	xAlign draw.XAlignment
	box    vg.Rectangle
}

// placeLabels places labels inside area, each overlapping none placed before it, points first. A point's
// label goes to its upper right, or its upper left where that has no room; a line's beside the line (on
// the left in the plot's right three quarters, where the curves have run), at the first of several heights
// from near the top down that is free. A label that finds no free place takes its first, inside area all
// the same: a label may overlap another, but is never cut by the image's edge.
func placeLabels(area vg.Rectangle, sty text.Style, labels []label) []placed {
	var out []placed
	gap := vg.Points(3)
	fits := func(b vg.Rectangle) bool {
		if b.Min.X < area.Min.X || b.Max.X > area.Max.X || b.Min.Y < area.Min.Y || b.Max.Y > area.Max.Y {
			return false
		}
		for _, o := range out {
			if b.Min.X < o.box.Max.X && o.box.Min.X < b.Max.X && b.Min.Y < o.box.Max.Y && o.box.Min.Y < b.Max.Y {
				return false
			}
		}
		return true
	}
	w, h := sty.Width, sty.Height
	for _, l := range labels {
		var tries []placed
		at := func(x, y vg.Length, align draw.XAlignment) placed {
			minX := x
			if align == draw.XRight {
				minX = x - w(l.text)
			}
			// Kept inside the area: a label wider than the room beside its mark moves in from the edge.
			minX = max(area.Min.X, min(minX, area.Max.X-w(l.text)))
			y = max(area.Min.Y, min(y, area.Max.Y-h(l.text)))
			pl := placed{label: l, xAlign: draw.XLeft,
				box: vg.Rectangle{Min: vg.Point{X: minX, Y: y}, Max: vg.Point{X: minX + w(l.text), Y: y + h(l.text)}}}
			pl.at = vg.Point{X: minX, Y: y}
			return pl
		}
		if l.point {
			tries = append(tries, at(l.at.X+gap, l.at.Y+gap, draw.XLeft), at(l.at.X-gap, l.at.Y+gap, draw.XRight),
				at(l.at.X+gap, l.at.Y-gap-h(l.text), draw.XLeft), at(l.at.X-gap, l.at.Y-gap-h(l.text), draw.XRight))
		} else {
			first, second := draw.XRight, draw.XLeft
			x1, x2 := l.at.X-gap, l.at.X+gap
			if l.at.X-area.Min.X <= (area.Max.X-area.Min.X)/4 {
				first, second, x1, x2 = second, first, x2, x1
			}
			for k := range 10 {
				y := area.Min.Y + (area.Max.Y-area.Min.Y)*vg.Length(0.82-0.07*float64(k))
				tries = append(tries, at(x1, y, first), at(x2, y, second))
			}
		}
		chosen := tries[0]
		for _, t := range tries {
			if fits(t.box) {
				chosen = t
				break
			}
		}
		out = append(out, chosen)
	}
	return out
}

// wrapText breaks s into lines no wider than width in sty, at its ", " and " on " where it can, else at
// spaces: a title that does not fit is wrapped, never cut by the image's edge.
func wrapText(s string, sty text.Style, width vg.Length) string {
	if sty.Width(s) <= width {
		return s
	}
	var parts []string
	for _, p := range strings.SplitAfter(strings.ReplaceAll(s, " on ", " \x00on "), ", ") {
		parts = append(parts, strings.Split(p, "\x00")...)
	}
	var lines []string
	line := ""
	for _, p := range parts {
		switch {
		case line == "":
			line = p
		case sty.Width(strings.TrimRight(line+p, " ")) <= width:
			line += p
		default:
			lines = append(lines, strings.TrimRight(line, " "))
			line = p
		}
	}
	lines = append(lines, strings.TrimRight(line, " "))
	// A part still too wide breaks at its spaces.
	var out []string
	for _, l := range lines {
		for sty.Width(l) > width {
			cut := strings.LastIndex(l, " ")
			for cut > 0 && sty.Width(l[:cut]) > width {
				cut = strings.LastIndex(l[:cut], " ")
			}
			if cut <= 0 {
				break
			}
			out = append(out, l[:cut])
			l = l[cut+1:]
		}
		out = append(out, l)
	}
	return strings.Join(out, "\n")
}

// niceTicks puts at most about eight labelled ticks at round values (1, 2, 2.5 or 5 times a power of ten) and an
// unlabelled one between each two.
type niceTicks struct{}

// Ticks returns the ticks for [lo, hi].
func (niceTicks) Ticks(lo, hi float64) []plot.Tick {
	if !(hi > lo) {
		return []plot.Tick{{Value: lo, Label: strconv.FormatFloat(lo, 'g', 4, 64)}}
	}
	raw := (hi - lo) / 8
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, f := range []float64{1, 2, 2.5, 5, 10} {
		if f*mag >= raw {
			step = f * mag
			break
		}
	}
	decimals := max(0, -int(math.Floor(math.Log10(step)+1e-9)))
	if math.Abs(step/math.Pow(10, -float64(decimals))-math.Round(step/math.Pow(10, -float64(decimals)))) > 1e-9 {
		decimals++ // 2.5 x 10^k needs one more digit
	}
	var ticks []plot.Tick
	for k := math.Ceil(lo/step - 1e-9); k*step <= hi+step*1e-9; k++ {
		v := k * step
		if v == 0 {
			v = 0 // not -0
		}
		ticks = append(ticks, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'f', decimals, 64)})
		if mid := v + step/2; mid <= hi {
			ticks = append(ticks, plot.Tick{Value: mid})
		}
	}
	return ticks
}
