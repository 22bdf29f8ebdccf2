package transform

import (
	"fmt"
	"math"
	"strconv"

	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
)

// BatchScale multiplies the batch by f (0 < f <= 64): every batch-dependent allocation (inputs, activations,
// temporaries and activation gradients of data loading, forward, backward, recompute and evaluation) asks
// for f times its bytes, rounded up, and its block size is re-rounded by the allocator's rule. Parameters,
// gradients, optimizer state and autocast's weight copies keep their sizes, as does an allocation in
// backward the size of a parameter's gradient (a weight gradient on its way to .grad).
func BatchScale(f float64) Transform {
	name := "batch x" + strconv.FormatFloat(f, 'g', 4, 64)
	return Transform{Name: name, apply: func(t *trace) (*trace, string, error) {
		if err := CheckBatchScale(f); err != nil {
			return nil, "", err
		}
		if err := t.requireTags(name, true, true); err != nil {
			return nil, "", err
		}
		return scaleBatch(t, f, name)
	}}
}

// CheckBatchScale says whether the batch can be scaled by f: above 0 and at most 64.
func CheckBatchScale(f float64) error {
	if !(f > 0 && f <= 64) {
		return fmt.Errorf("batch x%s: the factor must be above 0 and at most 64", strconv.FormatFloat(f, 'g', 4, 64))
	}
	return nil
}

// batchPhases are the phases whose allocations may depend on the batch.
var batchPhases = [snapshot.NumPhases]bool{snapshot.PhaseData: true, snapshot.PhaseForward: true,
	snapshot.PhaseBackward: true, snapshot.PhaseRecompute: true, snapshot.PhaseEval: true}

// fixedCategories are the categories whose size does not depend on the batch: a block that is ever one of
// them keeps its size.
const fixedCategories = 1<<snapshot.CategoryParameter | 1<<snapshot.CategoryGradient |
	1<<snapshot.CategoryOptimizerState | 1<<snapshot.CategoryAMPCache

// batchRule decides which allocations of a trace scale with the batch.
type batchRule struct {
	gradSizes map[int64]bool // the requested sizes of parameters' gradients
}

func newBatchRule(t *trace, bs map[uint64]*block) batchRule {
	params := map[int64]bool{}
	for _, b := range bs {
		if b.has(snapshot.CategoryParameter) {
			params[b.size] = true
		}
	}
	r := batchRule{gradSizes: map[int64]bool{}}
	for _, b := range bs {
		// A parameter's gradient has the parameter's size. A gradient of no parameter's size is an input's
		// that requires grad (peft's enable_input_require_grads makes the embeddings' output one): it has
		// the batch's shape, and backward allocations of its size scale.
		if b.gradAt >= 0 && (len(params) == 0 || params[b.size]) {
			r.gradSizes[b.size] = true
		}
	}
	return r
}

// dependent reports whether the allocation e (of block b) scales with the batch; gradShaped says it was
// kept for being the size of a gradient.
func (r batchRule) dependent(e *snapshot.Event, b *block) (dep, gradShaped bool) {
	if b == nil || b.internal || !e.Phase.Valid() || !batchPhases[e.Phase] || b.cats&fixedCategories != 0 {
		return false, false
	}
	if (e.Phase == snapshot.PhaseBackward || e.Phase == snapshot.PhaseRecompute) && r.gradSizes[e.Size] {
		return false, true
	}
	return true, false
}

// scaled returns size times f, rounded up.
func scaled(size int64, f float64) int64 {
	if size <= 0 {
		return size
	}
	return max(int64(math.Ceil(float64(size)*f)), 1)
}

func scaleBatch(t *trace, f float64, name string) (*trace, string, error) {
	bs := t.index()
	rule := newBatchRule(t, bs)
	out := t.derive(len(t.events))
	out.events = append(out.events, t.events...)
	newSize := map[uint64][2]int64{}
	var gradShaped int
	var gradShapedBytes int64
	for i := range out.events {
		e := &out.events[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			dep, gs := rule.dependent(e, bs[e.Addr])
			if gs {
				gradShaped++
				gradShapedBytes += e.Size
			}
			if !dep {
				continue
			}
			e.Size = scaled(e.Size, f)
			e.BlockSize = int64(torchrules.RoundSize(uint64(e.Size), nil))
			newSize[e.Addr] = [2]int64{e.Size, e.BlockSize}
		case snapshot.ActionFreeRequested, snapshot.ActionFreeCompleted:
			if s, ok := newSize[e.Addr]; ok {
				e.Size, e.BlockSize = s[0], s[1]
			}
		case snapshot.ActionOOM:
			// The request that failed: it scales if the allocation it was for would have.
			if batchPhases[e.Phase] && 1<<e.Category&fixedCategories == 0 {
				e.Size = int64(torchrules.RoundSize(uint64(scaled(e.Size, f)), nil))
				e.BlockSize = int64(torchrules.AllocationSize(uint64(e.Size), torchrules.LargeBuffer))
			}
		}
	}
	dep, all, dev, devices := t.liveAtPeak(func(e *snapshot.Event, b *block) bool { d, _ := rule.dependent(e, b); return d }, bs)
	at := "the recorded peak"
	if devices > 1 { // memory on two devices is no one pool: the peak is one device's
		at = fmt.Sprintf("device %d's recorded peak", dev)
	}
	line := fmt.Sprintf("%s: %s of the %s live at %s scale with the batch (inputs, activations, "+
		"temporaries and activation gradients by category); parameters, gradients, optimizer state and %d "+
		"backward allocations the size of a gradient (%s in all) keep their sizes", name,
		units.FormatSize(dep), units.FormatSize(all), at, gradShaped, units.FormatSize(gradShapedBytes))
	return out, line, nil
}

// liveAtPeak returns, at the peak of allocated bytes of one device, the requested bytes of its live
// allocations that match and of all of them, the device, and how many devices the trace allocates on. The
// device is the first to run out of memory, else the one whose allocated bytes peak highest: memory on two
// devices is never summed into one peak.
func (t *trace) liveAtPeak(match func(*snapshot.Event, *block) bool, bs map[uint64]*block) (matched, all int64, device int16, devices int) {
	cur, peak, peakAt := map[int16]int64{}, map[int16]int64{}, map[int16]int{}
	oomDevice, ooms := int16(0), false
	for i := range t.events {
		e := &t.events[i]
		switch e.Action {
		case snapshot.ActionAlloc:
			d := e.Device
			if cur[d] += e.BlockSize; cur[d] > peak[d] || peakAt[d] == 0 && peak[d] == 0 {
				peak[d], peakAt[d] = cur[d], i+1 // +1: 0 means none
			}
		case snapshot.ActionFreeRequested:
			cur[e.Device] -= e.BlockSize
		case snapshot.ActionOOM:
			if !ooms {
				oomDevice, ooms = e.Device, true
			}
		}
	}
	if len(peakAt) == 0 {
		return 0, 0, 0, 0
	}
	device = -1
	for d, p := range peak {
		if device < 0 || p > peak[device] || p == peak[device] && d < device {
			device = d
		}
	}
	if _, ok := peakAt[oomDevice]; ooms && ok {
		device = oomDevice
	}
	type key struct {
		dev  int16
		addr uint64
	}
	live := map[key]*snapshot.Event{}
	for i := 0; i < peakAt[device]; i++ {
		e := &t.events[i]
		if e.Device != device {
			continue
		}
		switch e.Action {
		case snapshot.ActionAlloc:
			live[key{e.Device, e.Addr}] = e
		case snapshot.ActionFreeRequested:
			delete(live, key{e.Device, e.Addr})
		}
	}
	for k, e := range live {
		all += e.Size
		if match(e, bs[k.addr]) {
			matched += e.Size
		}
	}
	return matched, all, device, len(peakAt)
}
