package tui

import (
	"context"
	"encoding/json"
	"io"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Backend is what the TUI needs of the domain: oomdbg's own training workloads read from a snapshot's
// metadata and recorded (the one the TUI opens on, and the fixes pane's re-runs), their fixes measured, and
// the plans that fit their card found. The command line provides internal/backend's, over workloads/train
// and fit, the same that serves triage as its Measurer, so that the TUI never drives the runtime itself;
// tests provide one that plays back recorded snapshots. A backend that cannot do one of these returns an
// error, which the pane that asked shows.
type Backend interface {
	// Parse reads the workload an oomdbg snapshot recorded (its Meta.Workload), or says why it cannot.
	Parse(spec json.RawMessage) (Workload, error)
	// Record runs w with its Device and Fixes, writing the snapshot to out as it records, and returns when
	// the run has ended. Running out of device memory is what a run may do, not an error of Record's.
	Record(ctx context.Context, w Workload, out io.Writer) error
	// MeasureFixes measures fixes as oomdbg fixes does: it runs w without its leak bug, then w with each
	// fix, on the meta device, once on the configured device and once with unlimited memory, and returns
	// them in that order. The fixes pane ranks them and the OOM panel says what the run needs.
	MeasureFixes(ctx context.Context, w Workload) ([]Measured, error)
	// Plans finds the plans of fixes that fit w's card, cheapest first (oomdbg fit).
	Plans(ctx context.Context, w Workload) ([]FitPlan, error)
	// CanPlan reports whether Plans searches for plans at all; the fixes pane mentions the fit key only
	// then (pressed anyway, it shows Plans' error).
	CanPlan() bool
}

// Measured is one fix's run.
type Measured struct {
	Fix   string
	Fixes Fixes // the workload's settings with the fix
	// Needs is the peak of allocated memory with unlimited memory: what the run needs. Peak is the peak on
	// the configured device, up to its OOM; OOM says it ran out there, in OOMPhase.
	Needs, Peak int64
	OOM         bool
	OOMPhase    string
	// Reserved is the peak of reserved memory on the configured device, and Usable what its allocator can
	// use (the card less the CUDA context; 0: unknown): whether the run fits is judged on them by the
	// headroom rule. StepTime is the estimated seconds of an optimizer step on the planner's GPU profile, as
	// FitPlan's (0: not estimated): the fixes pane ranks what fits by it, plans and measured fixes alike.
	Reserved, Usable int64
	StepTime         float64

	plan *FitPlan // the plan it stands for, when it is a plan the fit key found rather than a measured fix
}

// FitPlan is one plan: its fixes, in the fixes pane's words, and what the planner measured and estimated.
type FitPlan struct {
	Name         string // what it changes, e.g. "bf16 autocast, checkpoint all"
	Fixes        Fixes
	PeakReserved int64
	StepTime     float64 // estimated seconds per optimizer step
}

// Workload is one of oomdbg's own training runs as the TUI shows and re-runs it.
type Workload struct {
	Name string // what it is in a few words, e.g. "gpt2-medium on meta"
	// GPT says the model is a GPT, to which the attention and checkpointing fixes apply.
	GPT bool
	// Llama says the model is a Llama-family decoder, to which the attention, layer checkpointing, weights
	// and adapter fixes apply.
	Llama bool
	// GPUs is the job's GPUs when the workload is one rank of a data-parallel job (0 or 1: one GPU); the
	// data-parallel fixes apply to it.
	GPUs   int
	Device device.Kind
	Fixes  Fixes
	// Spec is the whole configuration as a snapshot's metadata stores it; Record applies Device and Fixes
	// over it.
	Spec json.RawMessage
}

// Fixes are the settings the fixes pane changes, as the values oomdbg run's flags parse into: a choice in
// the pane is made of them once, and the runtime takes them as they are.
type Fixes struct {
	AMP        knob.AMP        // --amp
	Attention  knob.Attention  // --attention
	Checkpoint knob.Checkpoint // --checkpoint
	Batch      int             // --batch
	Accum      int             // --accum
	Optimizer  knob.Optimizer  // --optimizer
	// OptimizerImpl is --optimizer-impl; "" is foreach, as it is in a recorded configuration that leaves
	// it out.
	OptimizerImpl knob.OptimizerImpl
	ZeroGrad      knob.ZeroGrad // --zero-grad
	Bug           string        // --bug: "" when the run has no leak bug

	// The Llama's: the weights' dtype and its adapters.
	Weights     train.Weights     // --weights
	LoRA        int               // --lora: the adapters' rank (0: a full fine-tune)
	QLoRA       bool              // --qlora
	LoRATargets train.LoRATargets // --lora-targets: none for peft's default

	// A data-parallel rank's: its strategy and what it offloads.
	Parallel dist.Strategy // --dp
	Offload  dist.Offload  // --offload
}
