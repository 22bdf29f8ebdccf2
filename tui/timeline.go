package tui

import (
	"math"
	"math/bits"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// timelinePane draws allocated and reserved memory over the events, the device's capacity, reserved minus
// allocated memory on a row of its own (fragmentation and cache, which the plot's scale flattens), the phase
// bands and iteration ticks, and the cursor. A re-run of the workload with fixes is drawn over it for
// comparison.
type timelinePane struct {
	ix    *index
	after *index // the re-run with fixes, if any
	axis  axis
	drawn struct { // the last plot drawn, and what it was drawn from: keys that change nothing here redraw nothing
		key plotKey
		out string
	}
}

// plotKey is what the plot is drawn from.
type plotKey struct {
	ix, after           *index
	tl                  *timeline.Timeline // a paged run's window
	n, afterN           int
	w, h, from, to, cur int
	byTime              bool
	styles              *Styles
}

// axisWidth is the width of the labels left of the plot: the memory axis ("24.00 GiB"), the cache row's scale
// ("cache 1.1G") and the band's name ("iteration").
const axisWidth = 11

var eighths = []rune(" ▁▂▃▄▅▆▇█")

// view renders the plot in w x h cells (h includes the unallocated row, when there is room, and the phase
// band), for events [from, to) with the cursor.
func (p *timelinePane) view(s *Styles, w, h, from, to, cursor int) string {
	if p.ix == nil || p.ix.len() == 0 || w <= axisWidth+2 || h < 2 {
		return strings.Repeat("\n", max(h-1, 0))
	}
	k := plotKey{ix: p.ix, tl: p.ix.tl, n: p.ix.len(), w: w, h: h, from: from, to: to, cur: cursor, byTime: p.axis.byTime, styles: s}
	if p.after != nil {
		k.after, k.afterN = p.after, p.after.len()
	}
	if p.drawn.key != k {
		p.drawn.key, p.drawn.out = k, p.draw(s, w, h, from, to, cursor)
	}
	return p.drawn.out
}

// draw draws the plot (view).
func (p *timelinePane) draw(s *Styles, w, h, from, to, cursor int) string {
	plotW, plotH := w-axisWidth, h-1
	strip := plotH >= 4 // room for the unallocated row under a plot of 3 rows at least
	if strip {
		plotH--
	}
	if p.ix.ov == nil {
		p.axis.update(p.ix.snap, p.ix.len())
	} else { // a paged run: the events themselves are the columns, drawn from the overview outside the window
		p.axis.run, p.axis.indexed, p.axis.snap = p.axis.run[:0], 0, nil
	}
	cols := p.axis.columns(from, to, plotW)
	alloc, res := p.ix.extents(timeline.Allocated, cols), p.ix.extents(timeline.Reserved, cols)
	// Scale to the run; the device's capacity joins the scale when the run comes near it (a run that uses a
	// sliver of the card would otherwise be a flat line).
	top := max(maxOf(res), maxOf(alloc), 1)
	if c := p.ix.capacity; c > 0 && c <= top*3/2 {
		top = max(top, c)
	}
	top = sum(top, top/20) // headroom so the capacity line and the peak stay visible
	var after []int64
	if p.after != nil && p.after.len() > 0 {
		after = p.alignedAfter(cols)
	}
	curCol := -1
	if cursor >= from && cursor < to {
		curCol = columnOf(cols, cursor)
	}
	capRow := -1
	if c := p.ix.capacity; c > 0 && c < top {
		capRow = plotH - 1 - share(c, top, plotH)
	}

	var b strings.Builder
	for row := range plotH {
		// The value range of this row, bottom to top: [lo, hi).
		hi := part(top, plotH-row, plotH)
		lo := part(top, plotH-row-1, plotH)
		switch {
		case row == capRow: // the device's capacity, labelled with its size
			b.WriteString(s.Capacity.Render(padLeft(units.FormatSize(p.ix.capacity), axisWidth-1)) + " ")
		case row == 0:
			b.WriteString(s.Muted.Render(padLeft(units.FormatSize(top), axisWidth-1) + " "))
		case row == plotH-1:
			b.WriteString(s.Muted.Render(padLeft("0", axisWidth-1) + " "))
		default:
			b.WriteString(strings.Repeat(" ", axisWidth))
		}
		var line runs
		for c := range plotW {
			ch, id := cell(alloc[c], res[c], lo, hi, row == capRow)
			if after != nil && after[c] >= lo && after[c] < hi {
				ch, id = '•', styleAfter
			}
			line.add(ch, id, c == curCol)
		}
		line.render(&b, s.byID)
		b.WriteByte('\n')
	}
	if strip {
		b.WriteString(p.unallocatedRow(s, cols, curCol))
		b.WriteByte('\n')
	}
	label, band := p.band(s, cols, curCol)
	b.WriteString(s.Muted.Render(padLeft(label, axisWidth-1) + " "))
	b.WriteString(band)
	return b.String()
}

// unallocatedRow draws the allocator's cache, reserved minus allocated bytes, the highest of each column, in
// eighths of a cell on a scale of its own, which its label names: "cache 1.1G" is the highest in view. A size
// alone there read as the memory axis going on below zero.
func (p *timelinePane) unallocatedRow(s *Styles, cols []column, curCol int) string {
	vals := make([]int64, len(cols))
	for c, col := range cols {
		vals[c] = -1
		if col.from < col.to {
			vals[c] = p.ix.unallocatedMax(col.from, col.to)
		}
	}
	top := max(maxOf(vals), 1)
	var b strings.Builder
	b.WriteString(s.Muted.Render(padLeft("cache "+units.FormatSizeShort(top), axisWidth-1) + " "))
	var line runs
	for c, v := range vals {
		ch := ' '
		if v > 0 {
			ch = eighths[max(1, share(v, top, 8))]
		}
		line.add(ch, styleReserved, c == curCol)
	}
	line.render(&b, s.byID)
	return b.String()
}

// cell returns the character and style for a column's values in a row's range [lo, hi).
func cell(alloc, res, lo, hi int64, capacityRow bool) (rune, styleID) {
	switch {
	case alloc < 0: // no events in this column
		return ' ', stylePlain
	case alloc >= hi:
		return '█', styleAllocated
	case alloc > lo:
		return eighths[share(alloc-lo, max(hi-lo, 1), 8)], styleAllocated
	case res > lo:
		return '░', styleReserved
	case capacityRow:
		return '─', styleCapacity
	}
	return ' ', stylePlain
}

// alignedAfter returns, per column, the re-run's highest allocated bytes over the same part of the run: each
// event maps to the same phase of the same iteration in the re-run, at the same fraction of the phase. Columns
// the re-run has no counterpart for are -1.
func (p *timelinePane) alignedAfter(cols []column) []int64 {
	first := map[[2]int32]span{}
	for _, p := range p.after.spans() {
		k := [2]int32{p.Iteration, int32(p.Phase)}
		if _, ok := first[k]; !ok {
			first[k] = toSpan(p)
		}
	}
	at := func(i int) int {
		sp := p.ix.spanAt(i)
		q, ok := first[[2]int32{sp.iteration, int32(sp.phase)}]
		if !ok {
			return -1
		}
		return q.from + (i-sp.from)*(q.to-q.from)/max(sp.to-sp.from, 1)
	}
	out := make([]int64, len(cols))
	for c, col := range cols {
		a, b := col.from, col.to-1
		if a > b {
			out[c] = -1
			continue
		}
		x, y := at(a), at(max(a, b))
		if x < 0 || y < 0 {
			out[c] = -1
			continue
		}
		out[c] = p.after.tl.Range(timeline.Allocated, min(x, y), max(x, y)+1).Max
	}
	return out
}

func maxOf(v []int64) int64 {
	var m int64
	for _, x := range v {
		m = max(m, x)
	}
	return m
}

// padLeft right-aligns s in w cells, cutting it to w cells; widths are measured in cells, not bytes.
func padLeft(s string, w int) string {
	if n := ansi.StringWidth(s); n < w {
		return strings.Repeat(" ", w-n) + s
	}
	return ansi.Truncate(s, w, "")
}

// Sizes come from files, and a hostile file's blocks may claim exabytes each: scaling them to cells or rows
// must neither overflow nor wrap. A size that does not fit is held at the most a cell or a sum can say.

// share is how many of n cells v fills of top: n*v/top rounded down, in [0, n], exact for any sizes.
func share(v, top int64, n int) int {
	switch {
	case v <= 0 || top <= 0 || n <= 0:
		return 0
	case v >= top:
		return n
	}
	hi, lo := bits.Mul64(uint64(v), uint64(n))
	q, _ := bits.Div64(hi, lo, uint64(top)) // hi < top: v*n < top*n <= top*2^64
	return int(q)
}

// part is top*k/n for 0 <= k <= n, exact for any top >= 0.
func part(top int64, k, n int) int64 {
	if top <= 0 || n <= 0 || k <= 0 {
		return 0
	}
	hi, lo := bits.Mul64(uint64(top), uint64(k))
	q, _ := bits.Div64(hi, lo, uint64(n)) // hi < n: k <= n
	return int64(q)
}

// sum adds sizes, holding at the largest int64 instead of wrapping to a negative one.
func sum(a, b int64) int64 {
	if b > 0 && a > math.MaxInt64-b {
		return math.MaxInt64
	}
	if b < 0 && a < math.MinInt64-b {
		return math.MinInt64
	}
	return a + b
}
