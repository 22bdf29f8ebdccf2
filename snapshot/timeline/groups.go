package timeline

import (
	"cmp"
	"slices"
	"strconv"

	"github.com/oomdbg/oomdbg/snapshot"
)

// Breakdowns of a set of blocks by one of their tags, and how stacks are shown.

// Dimension is a tag blocks can be grouped by.
type Dimension uint8

// The dimensions.
const (
	ByCategory  Dimension = iota // Group.Key is the snapshot.Category
	ByPhase                      // the snapshot.Phase of the alloc
	ByIteration                  // the iteration of the alloc
	ByScope                      // the scope's snapshot.StringID
	ByStack                      // the snapshot.StackID
	ByLabel                      // the label's snapshot.StringID
	numDimensions
)

var dimensionNames = [...]string{"category", "phase", "iteration", "scope", "stack", "label"}

// String returns the dimension's name, e.g. "scope".
func (d Dimension) String() string {
	if int(d) < len(dimensionNames) {
		return dimensionNames[d]
	}
	return "dimension(" + strconv.Itoa(int(d)) + ")"
}

// Group is the blocks sharing one value of a Dimension.
type Group struct {
	Key       int64
	Bytes     int64 // block bytes
	Requested int64 // requested bytes
	Count     int
}

// key returns block b's value of dimension d.
func (d Dimension) key(b *Allocation) int64 {
	switch d {
	case ByCategory:
		return int64(b.Category)
	case ByPhase:
		return int64(b.Phase)
	case ByIteration:
		return int64(b.Iteration)
	case ByScope:
		return int64(b.Scope)
	case ByStack:
		return int64(b.Stack)
	case ByLabel:
		return int64(b.Label)
	}
	return 0
}

// GroupBlocks sums blocks by dimension d, largest first (ties by key).
func GroupBlocks(blocks []Allocation, d Dimension) []Group {
	index := make(map[int64]int)
	var groups []Group
	for i := range blocks {
		b := &blocks[i]
		k := d.key(b)
		j, ok := index[k]
		if !ok {
			j = len(groups)
			index[k] = j
			groups = append(groups, Group{Key: k})
		}
		g := &groups[j]
		g.Bytes += b.Size
		g.Requested += b.Requested
		g.Count++
	}
	slices.SortFunc(groups, func(a, b Group) int {
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return groups
}

// GroupName names a group's key for people: "activation", "backward", "iteration 3", a scope, the first
// frame of a stack that is not memory plumbing (see UserFrames), a label.
func GroupName(s *snapshot.Snapshot, d Dimension, key int64) string {
	switch d {
	case ByCategory:
		return snapshot.Category(key).String()
	case ByPhase:
		return snapshot.Phase(key).String()
	case ByIteration:
		if key < 0 {
			return "setup"
		}
		return "iteration " + strconv.FormatInt(key, 10)
	case ByScope:
		if name := s.String(snapshot.StringID(key)); name != "" {
			return name
		}
		return "(no scope)"
	case ByStack:
		if frames := s.UserFrames(snapshot.StackID(key), 1); len(frames) > 0 {
			return s.FrameString(frames[0])
		}
		return "(no stack)"
	case ByLabel:
		if name := s.String(snapshot.StringID(key)); name != "" {
			return name
		}
		return "(no label)"
	}
	return ""
}
