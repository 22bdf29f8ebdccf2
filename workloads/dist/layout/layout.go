package layout

import (
	"fmt"
	"strconv"
	"strings"
)

// ScheduleKind is how a pipeline orders its micro-batches' forward and backward passes.
type ScheduleKind int

const (
	// OneFOneB is PipeDream-flush's one-forward-one-backward (Megatron's
	// forward_backward_pipelining_without_interleaving), the default.
	OneFOneB ScheduleKind = iota
	// GPipe runs every micro-batch's forward before any backward (Huang et al. 2019).
	GPipe
	// Interleaved gives each stage Virtual model chunks (Narayanan et al. 2021, §2.2;
	// forward_backward_pipelining_with_interleaving).
	Interleaved
)

// Schedule is a pipeline schedule; Virtual counts the model chunks per stage under Interleaved.
type Schedule struct {
	Kind    ScheduleKind
	Virtual int
}

// ParseSchedule reads gpipe, 1f1b or interleaved:V (V >= 2 model chunks per stage).
func ParseSchedule(s string) (Schedule, error) {
	switch s {
	case "1f1b":
		return Schedule{Kind: OneFOneB}, nil
	case "gpipe":
		return Schedule{Kind: GPipe}, nil
	}
	if v, ok := strings.CutPrefix(s, "interleaved:"); ok {
		n, err := strconv.Atoi(v)
		if err == nil && n >= 2 {
			return Schedule{Kind: Interleaved, Virtual: n}, nil
		}
	}
	return Schedule{}, fmt.Errorf("pipeline schedule %q: want gpipe, 1f1b or interleaved:V with V >= 2", s)
}

func (s Schedule) String() string {
	switch s.Kind {
	case GPipe:
		return "gpipe"
	case Interleaved:
		return "interleaved:" + strconv.Itoa(s.Virtual)
	}
	return "1f1b"
}

// Recompute is which activations a layer recomputes in the backward pass instead of keeping.
type Recompute int

const (
	// RecomputeNone keeps every activation the backward pass needs.
	RecomputeNone Recompute = iota
	// RecomputeSelective recomputes the attention core (QK^T, softmax, its dropout, the product with V),
	// as Megatron's --recompute-granularity selective does; flash attention, which never stores the
	// scores, holds the same.
	RecomputeSelective
	// RecomputeFull keeps only each layer's input and reruns the layer in the backward pass
	// (--recompute-granularity full --recompute-method uniform --recompute-num-layers 1).
	RecomputeFull
)

// ParseRecompute reads none, selective or full.
func ParseRecompute(s string) (Recompute, error) {
	switch s {
	case "none":
		return RecomputeNone, nil
	case "selective":
		return RecomputeSelective, nil
	case "full":
		return RecomputeFull, nil
	}
	return 0, fmt.Errorf("activation recompute %q: want none, selective or full", s)
}

func (r Recompute) String() string {
	switch r {
	case RecomputeSelective:
		return "selective"
	case RecomputeFull:
		return "full"
	}
	return "none"
}

// Layout is how a job spreads one model over its GPUs. Ranks are laid out as Megatron does: TP innermost,
// then CP, DP and PP; every rank of one pipeline stage holds the same amounts.
type Layout struct {
	GPUs int // the job's world size; DP*TP*PP*CP must equal it
	DP   int // data-parallel replicas
	TP   int // tensor-parallel ranks (Megatron's column/row-parallel linears)
	PP   int // pipeline stages
	CP   int // context-parallel ranks, each holding Seq/CP of every sequence

	SequenceParallel     bool     // shard the LayerNorm and dropout activations over the TP ranks
	Schedule             Schedule // the pipeline's schedule (ignored when PP is 1)
	MicroBatches         int      // micro-batches per step and pipeline (gradient accumulation)
	DistributedOptimizer bool     // --use-distributed-optimizer: ZeRO-1 over the data-parallel ranks
	Recompute            Recompute
}

func (l Layout) String() string {
	return fmt.Sprintf("dp=%d tp=%d pp=%d cp=%d", l.DP, l.TP, l.PP, l.CP)
}

// LayoutError is a layout that cannot run a model on its GPUs; Error is one line that says what to change.
type LayoutError struct {
	Layout Layout
	Reason string
}

func (e *LayoutError) Error() string { return "layout " + e.Layout.String() + ": " + e.Reason }

// Validate reports, as a *LayoutError, the first reason l cannot train m: sizes whose product is not the
// GPUs, or a dimension that does not divide evenly over the ranks that share it (Megatron's own checks in
// megatron/training/arguments.py and its layers' divide()).
func (l Layout) Validate(m Model) error {
	fail := func(format string, args ...any) error {
		return &LayoutError{Layout: l, Reason: fmt.Sprintf(format, args...)}
	}
	if err := m.validate(); err != nil {
		return &LayoutError{Layout: l, Reason: err.Error()}
	}
	if l.DP < 1 || l.TP < 1 || l.PP < 1 || l.CP < 1 {
		return fail("every size must be at least 1")
	}
	if n := l.DP * l.TP * l.PP * l.CP; n != l.GPUs {
		return fail("DP*TP*PP*CP = %d but the job has %d GPUs; choose sizes whose product is %d", n, l.GPUs, l.GPUs)
	}
	if l.MicroBatches < 1 {
		return fail("%d micro-batches; a step needs at least 1", l.MicroBatches)
	}
	t := int64(l.TP)
	switch {
	case m.Heads%t != 0:
		return fail("%d attention heads do not split over %d TP ranks", m.Heads, l.TP)
	case m.queryGroups()%t != 0:
		return fail("%d query groups do not split over %d TP ranks", m.queryGroups(), l.TP)
	case m.FFN%t != 0:
		return fail("FFN width %d does not split over %d TP ranks", m.FFN, l.TP)
	case m.Seq%int64(l.CP) != 0:
		return fail("sequence length %d does not split over %d CP ranks", m.Seq, l.CP)
	case l.SequenceParallel && (m.Seq/int64(l.CP))%t != 0:
		return fail("sequence parallelism needs the sequence per CP rank (%d) to split over %d TP ranks", m.Seq/int64(l.CP), l.TP)
	case m.Layers%int64(l.PP) != 0:
		return fail("%d layers do not split over %d pipeline stages", m.Layers, l.PP)
	}
	if l.PP > 1 && l.Schedule.Kind == Interleaved {
		v := l.Schedule.Virtual
		if v < 2 {
			return fail("the interleaved schedule needs at least 2 model chunks per stage, not %d", v)
		}
		if m.Layers%int64(l.PP*v) != 0 {
			return fail("%d layers do not split into %d stages of %d model chunks", m.Layers, l.PP, v)
		}
	}
	return nil
}

// MarshalText writes the schedule as ParseSchedule reads it.
func (s Schedule) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads a schedule as ParseSchedule does.
func (s *Schedule) UnmarshalText(text []byte) error {
	v, err := ParseSchedule(string(text))
	if err == nil {
		*s = v
	}
	return err
}
