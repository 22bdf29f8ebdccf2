package whatif

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// InferredTags says which of the tags the transformations read (iterations, phases, categories, scopes) the
// trace's importer inferred rather than read: PyTorch records none of them, and a fix on a PyTorch trace is
// as good as that inference. It names where the iterations came from and the categories of the memory live
// at the recorded peak. "" for a trace whose tags were recorded (oomdbg's own, or oomdbg record's).
func InferredTags(s *snapshot.Snapshot) string {
	o, ok := torch.OriginOf(s)
	if !ok || o.Recorded != nil {
		return ""
	}
	var inferred []string
	if o.Iterations != "" && o.Iterations != torch.IterationsProfilerStep.String() {
		inferred = append(inferred, "iterations "+o.Iterations)
	}
	inferred = append(inferred, "phases from the stacks")
	if !o.CategoriesRecorded {
		inferred = append(inferred, "categories from the stacks and lifetimes (at the recorded peak: "+peakCategories(s)+")")
	}
	inferred = append(inferred, "scopes from the modules' frames")
	return "tags inferred by oomdbg's importer, as PyTorch records none: " + strings.Join(inferred, "; ")
}

// peakCategories lists the categories of the memory allocated at the peak of allocated bytes, largest
// first, as "activation 4.24 GiB, parameter 1.03 GiB".
func peakCategories(s *snapshot.Snapshot) string {
	type live struct {
		size int64
		cat  snapshot.Category
	}
	open := map[uint64]live{} // by device and address
	var cur, peak [snapshot.NumCategories]int64
	var total, peakTotal int64
	for _, e := range s.Events.All() {
		key := e.Addr ^ uint64(uint16(e.Device))<<48
		switch e.Action {
		case snapshot.ActionAlloc:
			open[key] = live{e.BlockSize, e.Category}
			cur[e.Category] += e.BlockSize
			total += e.BlockSize
			if total > peakTotal {
				peak, peakTotal = cur, total
			}
		case snapshot.ActionFreeRequested:
			if l, ok := open[key]; ok {
				cur[l.cat] -= l.size
				total -= l.size
				delete(open, key)
			}
		}
	}
	var cats []snapshot.Category
	for c, b := range peak {
		if b > 0 {
			cats = append(cats, snapshot.Category(c))
		}
	}
	slices.SortStableFunc(cats, func(a, b snapshot.Category) int { return cmp.Compare(peak[b], peak[a]) })
	var parts []string
	for _, c := range cats {
		parts = append(parts, fmt.Sprintf("%s %s", c, units.FormatSize(peak[c])))
	}
	if len(parts) == 0 {
		return "none"
	}
	return strings.Join(parts, ", ")
}
