package whatif

import (
	"errors"
	"math"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/whatif/transform"
)

// Fix is what a what-if changes: the trace's requests, transformed, and the allocator settings the trace
// is replayed under after.
type Fix struct {
	// Name is how the fix reads in a list, e.g. "checkpoint every:2".
	Name       string
	Transforms []transform.Transform
	// AllocConf is the settings to replay under after; nil keeps the recorded ones.
	AllocConf *allocator.Config
	// Keeps says what the fix keeps of the run (the batch, the speed, the training), and Cost ranks how much
	// it gives up: smaller keeps more. Both order the fixes that fit.
	Keeps string
	Cost  int
}

// Request is the fixes one what-if asks for, as typed values; a nil or zero field asks for nothing.
type Request struct {
	Checkpoint    *knob.Checkpoint
	BatchScale    *float64 // 1 asks for nothing
	Accum         *int
	ZeroGrad      *knob.ZeroGrad
	OptimizerImpl *knob.OptimizerImpl
	Optimizer     *knob.Optimizer
	AllocConf     *allocator.Config
}

// ErrNoFix says a request asks for nothing.
var ErrNoFix = errors.New("no fix given")

// Fix returns the request's fix, its transformations in the order they compose: checkpointing first (it
// works on the recorded passes), then the batch and accumulation, zero_grad, the optimizer's implementation,
// the optimizer. What a trace cannot take is refused here, before any trace is read.
func (r Request) Fix() (Fix, error) {
	var f Fix
	var names []string
	add := func(t transform.Transform) {
		f.Transforms = append(f.Transforms, t)
		names = append(names, t.Name)
	}
	if r.Checkpoint != nil {
		if err := transform.CheckCheckpoint(*r.Checkpoint); err != nil {
			return Fix{}, err
		}
		add(transform.Checkpoint(*r.Checkpoint))
	}
	if r.BatchScale != nil {
		if err := transform.CheckBatchScale(*r.BatchScale); err != nil {
			return Fix{}, err
		}
		if *r.BatchScale != 1 {
			add(transform.BatchScale(*r.BatchScale))
		}
	}
	if r.Accum != nil {
		if err := transform.CheckAccumulate(*r.Accum); err != nil {
			return Fix{}, err
		}
		add(transform.Accumulate(*r.Accum))
	}
	if r.ZeroGrad != nil {
		add(transform.ZeroGrad(*r.ZeroGrad))
	}
	if r.OptimizerImpl != nil {
		add(transform.OptimizerImpl(*r.OptimizerImpl))
	}
	if r.Optimizer != nil {
		if err := transform.CheckOptimizer(*r.Optimizer); err != nil {
			return Fix{}, err
		}
		add(transform.SwitchOptimizer(*r.Optimizer))
	}
	if r.AllocConf != nil {
		if err := allocator.CheckConfig(*r.AllocConf); err != nil {
			return Fix{}, err
		}
		c := *r.AllocConf
		f.AllocConf = &c
		names = append(names, "alloc-conf "+c.String())
	}
	if len(names) == 0 {
		return Fix{}, ErrNoFix
	}
	f.Name = joinNames(names)
	return f, nil
}

func joinNames(names []string) string {
	out := names[0]
	for _, n := range names[1:] {
		out += ", " + n
	}
	return out
}

// Trace returns s with the fix's transformations applied, releases the trace does not record placed as
// early as it allows: the trace drawn over the timeline.
func (f Fix) Trace(s *snapshot.Snapshot) (*snapshot.Snapshot, error) {
	changed, _, err := transform.Apply(s, f.Transforms...)
	return changed, err
}

// EventCost is what an event of the trace costs a what-if of f in memory at its peak: the trace as loaded
// and in working form (twice EventBytes), and, at each end the transformation is applied at (two where it
// places releases the trace does not record: checkpointing), every event of the transformed trace held twice
// while a stage copies it, with the stage's index of its blocks and the replay after: transformedEventBytes.
// The transformed trace has as many events as the recording times the micro-batches accumulation repeats
// (Repeats), and up to half as many again where checkpointing recomputes the forward passes. Measured (the
// live heap at its highest, GODEBUG=gctrace=1) on a 156,120-event GPT-2 recording, in bytes an event and with
// the model's figure: batch x0.5 235 (464), checkpoint all 430 (944), accumulate 8 927 (2,144), accumulate 20
// 2,351 (5,024), accumulate 8 with checkpoint all 2,546 (5,984), and with zero_grad zero 3,640 (5,984),
// accumulate 20 with both 8,946 (14,624); TestEventCostBoundsTheLiveHeap measures it on every run. A run refused at this figure would not have fit; one admitted keeps
// its live heap within --max-memory, and the collector, told the same limit, its resident memory near it.
func (f Fix) EventCost() int64 {
	ends, size := 1.0, 1.0 // the ends applied, and the transformed trace's events per recorded event
	for _, t := range f.Transforms {
		if t.HasEnds() {
			ends, size = 2, size*1.5
		}
		size *= float64(t.Repeats())
	}
	return 2*snapshot.EventBytes + int64(math.Ceil(ends*size*transformedEventBytes))
}

// transformedEventBytes is what one event of a transformed trace costs at the peak of a stage: its Event in
// the stage's input and in its output, its share of the index of blocks the stage builds, and of the replay's
// state.
const transformedEventBytes = 240

// names lists the fix's parts, as a report lists them.
func (f Fix) names() []string {
	var out []string
	for _, t := range f.Transforms {
		out = append(out, t.Name)
	}
	if f.AllocConf != nil {
		out = append(out, "alloc-conf "+f.AllocConf.String())
	}
	return out
}

// Catalogue is the fixes the TUI offers on a trace, each with what it keeps of the run.
func Catalogue() []Fix {
	one := func(name, keeps string, cost int, t transform.Transform) Fix {
		return Fix{Name: name, Transforms: []transform.Transform{t}, Keeps: keeps, Cost: cost}
	}
	expandable, _ := allocator.ParseConfig("expandable_segments:True")
	return []Fix{
		{Name: "expandable segments", AllocConf: &expandable, Keeps: "keeps everything", Cost: 0},
		one("zero_grad set_to_none", "keeps everything", 0, transform.ZeroGrad(knob.ZeroGradNone)),
		one("adam for-loop", "keeps the training, a slower step", 1, transform.OptimizerImpl(knob.ForLoop)),
		one(string(knob.AdamW8bit), "keeps the batch, 8-bit optimizer state", 1, transform.SwitchOptimizer(knob.AdamW8bit)),
		one("checkpoint "+knob.CheckpointEvery(2).String(), "keeps the batch, recomputes half the blocks", 1, transform.Checkpoint(knob.CheckpointEvery(2))),
		one("checkpoint "+knob.CheckpointAll.String(), "keeps the batch, about a third more compute", 2, transform.Checkpoint(knob.CheckpointAll)),
		one("accumulate 2", "keeps the effective batch, 2 micro-steps", 3, transform.Accumulate(2)),
		one("accumulate 4", "keeps the effective batch, 4 micro-steps", 4, transform.Accumulate(4)),
		one(string(knob.Momentum), "keeps the batch, changes the optimizer", 5, transform.SwitchOptimizer(knob.Momentum)),
		one(string(knob.SGD), "keeps the batch, changes the optimizer", 6, transform.SwitchOptimizer(knob.SGD)),
		one("batch x0.5", "halves the batch", 7, transform.BatchScale(0.5)),
	}
}
