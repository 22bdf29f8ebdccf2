package tui

import (
	"slices"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// The band under the plot says where in the run each column is. Zoomed in enough that an iteration spans a
// few columns, it is the phases, a letter each (the phase that holds most of the column's events, so that a
// short phase does not flicker in and out as the columns fall), with a tick where an iteration begins, drawn
// once however many columns repeat that event (time columns do, over a pause). Zoomed out past that, phases
// cannot be told apart and a tick in every column would say nothing: the band is an axis of iteration
// numbers instead, ticked at round ones.

// minColumnsPerIteration is the fewest columns an iteration takes for the band to show phases.
const minColumnsPerIteration = 3

// band returns the band's label and its row of cells.
func (p *timelinePane) band(s *Styles, cols []column, curCol int) (label, row string) {
	var line runs
	from, to := bandRange(cols)
	its := p.iterationsIn(from, to)
	var b strings.Builder
	if len(its) > 0 && len(cols) < minColumnsPerIteration*len(its) {
		p.iterationAxis(&line, cols, curCol, its)
		line.render(&b, s.byID)
		return "iteration", b.String()
	}
	spans := p.ix.spans()
	j := 0 // the next iteration start to tick
	for c, col := range cols {
		if col.from >= col.to {
			line.add(' ', stylePlain, false)
			continue
		}
		ph := p.majorPhase(spans, col)
		ch := rune(phaseLetter[min(int(ph), snapshot.NumPhases-1)])
		if p.ix.isRebuilt(col.from) {
			ch = '~'
		}
		for j < len(its) && its[j].start < col.from {
			j++
		}
		if j < len(its) && its[j].start < col.to {
			ch = '│'
			for j < len(its) && its[j].start < col.to { // one tick for the iterations the column holds
				j++
			}
		}
		line.add(ch, stylePhase+styleID(ph), c == curCol)
	}
	line.render(&b, s.byID)
	return "phase", b.String()
}

// bandRange is the events the columns draw.
func bandRange(cols []column) (from, to int) {
	from, to = -1, -1
	for _, c := range cols {
		if c.from < c.to {
			if from < 0 {
				from = c.from
			}
			to = max(to, c.to)
		}
	}
	return from, to
}

// iterationStart is where an iteration begins.
type iterationStart struct {
	iteration int32
	start     int
}

// iterationsIn returns the iterations that begin in events [from, to), setup left out.
func (p *timelinePane) iterationsIn(from, to int) []iterationStart {
	var out []iterationStart
	spans := p.ix.iterations()
	i, _ := slices.BinarySearchFunc(spans, from, func(sp timeline.IterationSpan, seq int) int { return sp.Start - seq })
	for ; i < len(spans) && spans[i].Start < to; i++ {
		if spans[i].Iteration >= 0 {
			out = append(out, iterationStart{spans[i].Iteration, spans[i].Start})
		}
	}
	return out
}

// majorPhase returns the phase that holds most of a column's events.
func (p *timelinePane) majorPhase(spans []timeline.PhaseSpan, col column) snapshot.Phase {
	i, _ := slices.BinarySearchFunc(spans, col.from, func(sp timeline.PhaseSpan, seq int) int {
		switch {
		case seq < sp.Start:
			return 1
		case seq >= sp.End:
			return -1
		}
		return 0
	})
	best, most := p.ix.spanAt(col.from).phase, 0
	for ; i < len(spans) && spans[i].Start < col.to; i++ {
		if n := min(spans[i].End, col.to) - max(spans[i].Start, col.from); n > most {
			best, most = spans[i].Phase, n
		}
	}
	return best
}

// iterationAxis draws the iterations as an axis: a tick at each round iteration number (every 1, 2, 5, 10,
// 20, 50, ... so that ticks are columns apart), the number after it where it fits.
func (p *timelinePane) iterationAxis(line *runs, cols []column, curCol int, its []iterationStart) {
	// The smallest round step that puts ticks 8 columns apart or more.
	span := int(its[len(its)-1].iteration-its[0].iteration) + 1
	step := int32(1)
	for mult := int32(1); mult < 1<<28 && span/int(step)*8 > len(cols); mult *= 10 {
		for _, k := range []int32{1, 2, 5} {
			if step = k * mult; span/int(step)*8 <= len(cols) {
				break
			}
		}
	}
	cells := make([]rune, len(cols))
	for c := range cells {
		cells[c] = ' '
	}
	j := 0
	for c, col := range cols {
		if col.from >= col.to {
			continue
		}
		for j < len(its) && its[j].start < col.from {
			j++
		}
		tick := int32(-1)
		for ; j < len(its) && its[j].start < col.to; j++ {
			if its[j].iteration%step == 0 && tick < 0 {
				tick = its[j].iteration
			}
		}
		if tick < 0 || cells[c] != ' ' {
			continue
		}
		cells[c] = '│'
		num := []rune(strconv.Itoa(int(tick)))
		for k, r := range num { // the number, where it fits before the next tick could come
			if c+1+k >= len(cells) {
				break
			}
			cells[c+1+k] = r
		}
	}
	for c, r := range cells {
		line.add(r, styleMuted, c == curCol)
	}
}
