package tui

import (
	"cmp"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
)

// groupBy is how the live set is grouped: by the code that allocated (site), the module (scope), the
// operation (op) or the category; groupNone lists the blocks one by one.
type groupBy int

const (
	groupNone groupBy = iota
	groupSite
	groupScope
	groupOp
	groupCategory
	numGroupBys
)

var groupNames = [numGroupBys]string{"none", "site", "scope", "op", "category"}

// liveGroup is the blocks of one group: their bytes, how many, and the largest of them.
type liveGroup struct {
	name    string
	bytes   int64
	count   int
	largest timeline.Allocation
}

// groupLive sums blocks by g, largest total first (then by name, so that equal groups keep an order).
// Blocks of different stacks with the same allocating frame are one site, as a person reads them.
func groupLive(s *snapshot.Snapshot, blocks []timeline.Allocation, g groupBy) []liveGroup {
	index := map[string]int{}
	var out []liveGroup
	for _, b := range blocks {
		name := groupName(s, b, g)
		i, ok := index[name]
		if !ok {
			i = len(out)
			index[name] = i
			out = append(out, liveGroup{name: name, largest: b})
		}
		grp := &out[i]
		grp.bytes += b.Size
		grp.count++
		if b.Size > grp.largest.Size {
			grp.largest = b
		}
	}
	slices.SortStableFunc(out, func(a, b liveGroup) int { return cmp.Or(cmp.Compare(b.bytes, a.bytes), cmp.Compare(a.name, b.name)) })
	return out
}

// groupName is the name of b's group under g.
func groupName(s *snapshot.Snapshot, b timeline.Allocation, g groupBy) string {
	switch g {
	case groupSite:
		if fs := s.UserFrames(b.Stack, 1); len(fs) > 0 {
			return s.FrameString(fs[0])
		}
		return "no stack recorded"
	case groupScope:
		return orDash(s.String(b.Scope))
	case groupOp:
		return opOf(s.String(b.Label))
	case groupCategory:
		return b.Category.String()
	}
	return ""
}

// opOf is the operation of a tensor label: "softmax.out" of "f32[16,4,64,64] softmax.out"; "-" without one.
func opOf(label string) string {
	if i := strings.LastIndexByte(label, ' '); i >= 0 {
		return label[i+1:]
	}
	if label == "" || strings.Contains(label, "[") {
		return "-"
	}
	return label
}
