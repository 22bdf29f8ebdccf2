package tui

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// segmentsPane shows the caching allocator's state at the cursor, as memory_viz's allocator state does: each
// segment (a cudaMalloc or a mapped range) drawn to scale with its blocks in use, pending free and free
// (inactive split blocks), and the fragmentation: free blocks, which empty_cache cannot return while their
// segment holds a block in use, and which serve only requests that fit in one of them. enter lists the
// selected segment's blocks. Allocated and unallocated bytes are the timeline's, as the report counts them.
type segmentsPane struct {
	snap      *snapshot.Snapshot
	at        int
	segs      []timeline.SegmentState
	selected  int
	open      bool  // listing the selected segment's blocks
	offset    int   // the first line of that list shown
	allocated int64 // the timeline's allocated and reserved bytes at the cursor, as the report counts them
	reserved  int64
	oom       string // at an OOM event: what its request met, as the report says it
}

// setData replays the allocator's segments at event at.
func (p *segmentsPane) setData(ix *index, at int) {
	p.snap, p.at = ix.snap, at
	p.segs = ix.segmentsAt(at)
	p.selected = min(p.selected, max(len(p.segs)-1, 0))
	p.allocated, p.reserved = ix.allocated(at), ix.reserved(at)
	_, p.oom = ix.diagnoseOOM(at)
}

// onKey answers a key in a pane h lines high.
func (p *segmentsPane) onKey(msg tea.KeyPressMsg, k KeyMap, h int) {
	switch {
	case p.open && key.Matches(msg, k.Back, k.Detail):
		p.open = false
	case p.open && key.Matches(msg, k.Up):
		p.offset = max(p.offset-1, 0)
	case p.open && key.Matches(msg, k.Down):
		p.offset++
	case p.open && key.Matches(msg, k.PageUp):
		p.offset = max(p.offset-(h-3), 0)
	case p.open && key.Matches(msg, k.PageDown):
		p.offset += h - 3
	case key.Matches(msg, k.Up, k.Down, k.PageUp, k.PageDown):
		p.selected, _ = listMove(msg, k, p.selected, len(p.segs), h-3)
	case key.Matches(msg, k.Detail):
		p.open, p.offset = len(p.segs) > 0, 0
	}
}

// Cells of a segment's map: memory_viz's allocator state in characters.
const (
	cellAllocated = '█' // a block in use
	cellPending   = '▒' // freed by the program, not yet back in the cache (its stream has not caught up)
	cellFree      = '·' // an inactive split block: cached, free
)

func (p *segmentsPane) view(s Styles, w, h int) string {
	if p.open && p.selected < len(p.segs) {
		return p.blocksView(s, w, h)
	}
	f := timeline.FragmentationOf(p.segs, nil)
	pending := f.Allocated - p.allocated // blocks in segments whose free was requested but not completed
	unalloc := p.reserved - p.allocated
	head := fmt.Sprintf("%d segments, %s: %s allocated, %s (%.0f%%) unallocated", len(p.segs),
		units.FormatSize(p.reserved), units.FormatSize(p.allocated), units.FormatSize(unalloc), 100*float64(unalloc)/float64(max(p.reserved, 1)))
	if pending > 0 {
		head += fmt.Sprintf(", of which %s freed and awaiting its stream", units.FormatSize(pending))
	}
	frag := fmt.Sprintf("%d free blocks, largest %s; %s in segments empty_cache keeps · %c in use %c pending free %c free · enter: blocks",
		f.FreeBlocks, units.FormatSize(f.Largest), units.FormatSize(f.Split), cellAllocated, cellPending, cellFree)
	var lines []string
	if p.oom != "" {
		for _, l := range strings.Split(ansi.Wordwrap(sentence(p.oom)+".", w, " "), "\n") {
			lines = append(lines, s.Error.Render(l))
		}
	}
	lines = append(lines, s.Muted.Render(ansi.Truncate(head, w, "…")), s.Muted.Render(ansi.Truncate(frag, w, "…")))
	// With several streams, each segment's stream, and what each stream holds: a stream's cached blocks
	// serve only its own requests.
	streams := segmentStreams(p.segs)
	if len(streams) > 1 {
		lines = append(lines, s.Muted.Render(ansi.Truncate(streamsLine(p.segs, streams), w, "…")))
	}
	// Each segment: address, size, share allocated, and a map of its blocks drawn to scale: the largest
	// segment takes the whole width, the others their share of it (a cell at least).
	mapW := max(w-37, 8)
	if len(streams) > 1 {
		mapW = max(mapW-4, 8)
	}
	var largest int64 = 1
	for _, sg := range p.segs {
		largest = max(largest, sg.Size)
	}
	rows := h - len(lines)
	from := min(max(p.selected-rows+1, 0), max(len(p.segs)-rows, 0))
	for i := from; i < len(p.segs) && len(lines) < h; i++ {
		sg := p.segs[i]
		cells := segmentCells(sg, p.at, max(share(sg.Size, largest, mapW), 1))
		mark := " "
		if i == p.selected {
			mark = "▸"
		}
		line := fmt.Sprintf("%s%s %10s %3.0f%% ", mark, formatAddr(sg.Addr), units.FormatSize(sg.Size), 100*float64(sg.Allocated())/float64(max(sg.Size, 1)))
		if len(streams) > 1 {
			line += fmt.Sprintf("s%-2d ", sg.Stream)
		}
		if i == p.selected {
			line = s.Selected.Render(line)
		}
		lines = append(lines, ansi.Truncate(line+s.Allocated.Render(string(cells)), w, "…"))
	}
	if len(p.segs) == 0 {
		lines = append(lines, s.Muted.Render("no segment is reserved here"))
	}
	return strings.Join(lines, "\n")
}

// segmentStreams returns the streams segs belong to, in ascending order.
func segmentStreams(segs []timeline.SegmentState) []int64 {
	var out []int64
	for _, sg := range segs {
		if !slices.Contains(out, sg.Stream) {
			out = append(out, sg.Stream)
		}
	}
	slices.Sort(out)
	return out
}

// streamsLine says what each stream holds: its segments, reserved bytes and free bytes.
func streamsLine(segs []timeline.SegmentState, streams []int64) string {
	var parts []string
	for _, st := range streams {
		f := timeline.FragmentationOf(segs, func(sg *timeline.SegmentState) bool { return sg.Stream == st })
		parts = append(parts, fmt.Sprintf("s%d: %d %s, %s, %s free", st, f.Segments, pluralWord(f.Segments, "segment"),
			units.FormatSize(f.Reserved), units.FormatSize(f.Free)))
	}
	return "streams (a stream's free blocks serve only its own requests) · " + strings.Join(parts, " · ")
}

func pluralWord(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// segmentCells maps a segment's blocks onto width cells: a cell shows a block in use if any part of one
// falls in it, else a pending free, else free memory.
func segmentCells(sg timeline.SegmentState, at, width int) []rune {
	cells := make([]rune, width)
	for j := range cells {
		cells[j] = cellFree
	}
	rank := map[rune]int{cellFree: 0, cellPending: 1, cellAllocated: 2}
	for _, b := range sg.Blocks {
		c := cellAllocated
		if !b.AllocatedAt(at) {
			c = cellPending
		}
		// A block claiming to lie outside its segment, or to be larger than it, is drawn at its edge.
		off := int64(min(b.Addr-min(b.Addr, sg.Addr), math.MaxInt64))
		from := min(share(off, sg.Size, width), width-1)
		to := share(sum(off, b.Size), sg.Size, width)
		for j := from; j < max(to, from+1) && j < width; j++ {
			if rank[c] > rank[cells[j]] {
				cells[j] = c
			}
		}
	}
	return cells
}

// blocksView lists the selected segment's blocks and free ranges in address order.
func (p *segmentsPane) blocksView(s Styles, w, h int) string {
	sg := p.segs[p.selected]
	type piece struct {
		addr uint64
		line string
	}
	var pieces []piece
	for _, b := range sg.Blocks {
		state := "in use"
		if !b.AllocatedAt(p.at) {
			state = "pending free"
		}
		what := orDash(p.snap.String(b.Label))
		if what == "-" {
			what = orDash(p.snap.String(b.Scope))
		}
		pieces = append(pieces, piece{b.Addr, fmt.Sprintf("  +%-12s %10s  %-12s %-15s %s", units.FormatSize(int64(b.Addr-sg.Addr)), units.FormatSize(b.Size), state, b.Category, what)})
	}
	for _, g := range sg.Gaps {
		pieces = append(pieces, piece{g.Addr, fmt.Sprintf("  +%-12s %10s  %-12s", units.FormatSize(int64(g.Addr-sg.Addr)), units.FormatSize(g.Size), "free")})
	}
	slices.SortFunc(pieces, func(a, b piece) int { return cmp.Compare(a.addr, b.addr) })
	lines := []string{
		s.Bold.Render(ansi.Truncate(fmt.Sprintf("segment %#x on stream %d: %s, %d blocks in use or pending, %d free · esc back", sg.Addr, sg.Stream, units.FormatSize(sg.Size), len(sg.Blocks), len(sg.Gaps)), w, "…")),
		s.Allocated.Render(string(segmentCells(sg, p.at, max(w-2, 8)))),
		s.Header.Render(ansi.Truncate(fmt.Sprintf("  %-13s %10s  %-12s %-15s %s", "offset", "size", "state", "category", "tensor"), w, "")),
	}
	rows := h - len(lines)
	p.offset = min(p.offset, max(len(pieces)-rows, 0))
	for i := p.offset; i < len(pieces) && len(lines) < h; i++ {
		lines = append(lines, ansi.Truncate(pieces[i].line, w, "…"))
	}
	return strings.Join(lines, "\n")
}

// sentence starts s with a capital letter.
func sentence(s string) string {
	if s == "" {
		return s
	}
	return strings.ToUpper(s[:1]) + s[1:]
}

// formatAddr is a segment's address as the pane writes it.
func formatAddr(addr uint64) string { return fmt.Sprintf("%#014x", addr) }
