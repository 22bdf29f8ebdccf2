package tui

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
)

// segmentsPane shows the caching allocator's state at the cursor: each segment (a cudaMalloc or a mapped
// range), how much of it is allocated, a map of its blocks, and the fragmentation: its free blocks, which
// empty_cache cannot return while the segment holds a block in use, and which serve only requests that fit
// in one of them. The figures are the Timeline's (snapshot.FragmentationOf), as the report's are.
type segmentsPane struct {
	segs   []snapshot.SegmentState
	offset int
	oom    string // at an OOM event: what its request met, as the report says it
}

// setData replays the allocator's segments at event at.
func (p *segmentsPane) setData(ix *index, at int) {
	p.segs = ix.tl.SegmentsAt(at)
	p.offset = min(p.offset, max(len(p.segs)-1, 0))
	_, p.oom = triage.DiagnoseOOM(ix.tl, at)
}

func (p *segmentsPane) onKey(msg tea.KeyPressMsg, k KeyMap) {
	switch {
	case key.Matches(msg, k.Up):
		p.offset = max(p.offset-1, 0)
	case key.Matches(msg, k.Down):
		p.offset = min(p.offset+1, max(len(p.segs)-1, 0))
	}
}

func (p *segmentsPane) view(s Styles, w, h int) string {
	f := snapshot.FragmentationOf(p.segs, nil)
	head := fmt.Sprintf("%d segments of %s: %s allocated, %s (%.0f%%) unallocated", len(p.segs),
		units.FormatSize(f.Reserved), units.FormatSize(f.Allocated), units.FormatSize(f.Reserved-f.Allocated), 100*f.Ratio())
	frag := fmt.Sprintf("%d free blocks, largest %s; %s in segments empty_cache keeps",
		f.FreeBlocks, units.FormatSize(f.Largest), units.FormatSize(f.Split))
	var lines []string
	if p.oom != "" {
		for _, l := range strings.Split(ansi.Wordwrap(sentence(p.oom)+".", w, " "), "\n") {
			lines = append(lines, s.Error.Render(l))
		}
	}
	lines = append(lines, s.Muted.Render(ansi.Truncate(head, w, "…")), s.Muted.Render(ansi.Truncate(frag, w, "…")))
	// Each segment: address, size, share allocated, a map of its blocks (█ in use, · free) and its free
	// blocks, largest first.
	mapW := max(min(w-36-24, 48), 8)
	for i := p.offset; i < len(p.segs) && len(lines) < h; i++ {
		sg := p.segs[i]
		cells := make([]rune, mapW)
		for j := range cells {
			cells[j] = '·'
		}
		for _, b := range sg.Blocks {
			off := int64(b.Addr - sg.Addr)
			from := int(off * int64(mapW) / sg.Size)
			to := int((off + b.Size) * int64(mapW) / sg.Size)
			for j := from; j < max(to, from+1) && j < mapW; j++ {
				cells[j] = '█'
			}
		}
		line := fmt.Sprintf("%#014x %10s %3.0f%% %s %s", sg.Addr, units.FormatSize(sg.Size),
			100*float64(sg.Allocated())/float64(max(sg.Size, 1)), s.Allocated.Render(string(cells)), freeList(sg.Gaps))
		lines = append(lines, ansi.Truncate(line, w, "…"))
	}
	if len(p.segs) == 0 {
		lines = append(lines, s.Muted.Render("no segment is reserved here"))
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

// freeList names a segment's free blocks, largest first: "free 1.20 GiB, 20.00 MiB".
func freeList(gaps []snapshot.Gap) string {
	if len(gaps) == 0 {
		return "no free block"
	}
	sizes := make([]int64, len(gaps))
	for i, g := range gaps {
		sizes[i] = g.Size
	}
	slices.SortFunc(sizes, func(a, b int64) int { return cmp.Compare(b, a) })
	parts := make([]string, len(sizes))
	for i, n := range sizes {
		parts[i] = units.FormatSize(n)
	}
	return "free " + strings.Join(parts, ", ")
}
