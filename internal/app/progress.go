package app

import (
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// progressLine draws a run's progress on one terminal line, rewritten in place: a bar, the steps done, the
// loss where the device computes one, and the time so far. It redraws at most every interval, and on the
// last step; clear erases the line before the summary is printed.
type progressLine struct {
	w        io.Writer
	interval time.Duration
	loss     bool // the device computes a loss (cpu)
	start    time.Time
	drawn    time.Time
	wrote    bool
}

// progressBarWidth is the bar's width in cells: with the words beside it, a line fits 80 columns.
const progressBarWidth = 24

func newProgressLine(w io.Writer, interval time.Duration, loss bool) *progressLine {
	now := time.Now()
	return &progressLine{w: w, interval: interval, loss: loss, start: now, drawn: now}
}

// step is a train.RecordOptions.Progress.
func (p *progressLine) step(s train.Progress) {
	now := time.Now()
	if now.Sub(p.drawn) < p.interval && s.Done < s.Of {
		return
	}
	p.drawn, p.wrote = now, true
	filled := 0
	if s.Of > 0 {
		filled = progressBarWidth * s.Done / s.Of
	}
	line := fmt.Sprintf("run: [%s%s] step %d of %d", strings.Repeat("#", filled), strings.Repeat(".", progressBarWidth-filled), s.Done, s.Of)
	if p.loss {
		line += fmt.Sprintf(", loss %.4f", s.Loss)
	}
	line += fmt.Sprintf(", %s", now.Sub(p.start).Round(100*time.Millisecond))
	fmt.Fprintf(p.w, "\r\x1b[K%s", line)
}

// clear erases the line, if one was drawn.
func (p *progressLine) clear() {
	if p.wrote {
		fmt.Fprint(p.w, "\r\x1b[K")
	}
}
