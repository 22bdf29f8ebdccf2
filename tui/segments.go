package tui

import (
	"fmt"
	"strings"

	"charm.land/bubbles/v2/key"
	tea "charm.land/bubbletea/v2"
	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

// segmentsPane shows the caching allocator's state at the cursor: each segment (a cudaMalloc or a mapped
// range), how much of it is allocated, a map of its blocks, and the fragmentation: reserved bytes no block
// uses, which empty_cache cannot return while the segment is split.
type segmentsPane struct {
	segs   []snapshot.SegmentState
	offset int
}

// setData replays the allocator's segments at event at.
func (p *segmentsPane) setData(ix *index, at int) {
	p.segs = ix.tl.SegmentsAt(at)
	p.offset = min(p.offset, max(len(p.segs)-1, 0))
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
	var reserved, used int64
	for _, sg := range p.segs {
		reserved += sg.Size
		used += sg.Allocated()
	}
	head := fmt.Sprintf("%d segments, %s reserved, %s allocated, %s reserved but unallocated", len(p.segs),
		units.FormatSize(reserved), units.FormatSize(used), units.FormatSize(reserved-used))
	lines := []string{s.Muted.Render(ansi.Truncate(head, w, "…"))}
	mapW := max(w-36, 8)
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
		line := fmt.Sprintf("%#014x %10s %3.0f%% %s", sg.Addr, units.FormatSize(sg.Size),
			100*float64(sg.Allocated())/float64(max(sg.Size, 1)), s.Allocated.Render(string(cells)))
		lines = append(lines, ansi.Truncate(line, w, ""))
	}
	if len(p.segs) == 0 {
		lines = append(lines, s.Muted.Render("no segment is reserved here"))
	}
	return strings.Join(lines, "\n")
}
