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
)

// segmentsPane shows the caching allocator's state at the cursor: each segment (a cudaMalloc or a mapped
// range), how much of it is allocated, a map of its blocks, and the fragmentation: reserved bytes no block
// uses, which empty_cache cannot return while the segment is split.
type segmentsPane struct {
	segs   []segmentState
	offset int
}

type segmentState struct {
	addr, size int64
	base       uint64
	blocks     [][2]int64 // allocated blocks: offset, size
	used       int64
}

func (p *segmentsPane) setData(ix *index, at int) {
	type seg = segmentState
	segs := map[uint64]*seg{}
	evs := ix.snap.Events[:at+1]
	live := map[uint64]int64{}
	for i := range evs {
		e := &evs[i]
		switch e.Action {
		case snapshot.ActionSegmentAlloc, snapshot.ActionSegmentMap:
			segs[e.Addr] = &seg{base: e.Addr, size: e.Size}
		case snapshot.ActionSegmentFree, snapshot.ActionSegmentUnmap:
			delete(segs, e.Addr)
		case snapshot.ActionAlloc:
			live[e.Addr] = e.BlockSize
		case snapshot.ActionFreeRequested:
			delete(live, e.Addr)
		}
	}
	p.segs = p.segs[:0]
	for _, sg := range segs {
		p.segs = append(p.segs, *sg)
	}
	slices.SortFunc(p.segs, func(a, b segmentState) int { return cmp.Compare(a.base, b.base) })
	for i := range p.segs {
		sg := &p.segs[i]
		for addr, size := range live {
			if addr >= sg.base && addr < sg.base+uint64(sg.size) {
				sg.blocks = append(sg.blocks, [2]int64{int64(addr - sg.base), size})
				sg.used += size
			}
		}
	}
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
		reserved += sg.size
		used += sg.used
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
		for _, b := range sg.blocks {
			from := int(b[0] * int64(mapW) / sg.size)
			to := int((b[0] + b[1]) * int64(mapW) / sg.size)
			for j := from; j < max(to, from+1) && j < mapW; j++ {
				cells[j] = '█'
			}
		}
		line := fmt.Sprintf("%#014x %10s %3.0f%% %s", sg.base, units.FormatSize(sg.size),
			100*float64(sg.used)/float64(max(sg.size, 1)), s.Allocated.Render(string(cells)))
		lines = append(lines, ansi.Truncate(line, w, ""))
	}
	if len(p.segs) == 0 {
		lines = append(lines, s.Muted.Render("no segment is reserved here"))
	}
	return strings.Join(lines, "\n")
}
