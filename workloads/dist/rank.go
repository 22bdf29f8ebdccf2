package dist

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Env is what a rank runs on and reports to.
type Env struct {
	RT *tensor.Runtime // the rank's GPU
	// Host is the rank's host memory, where offloaded state lives (nil when nothing is offloaded). Its device
	// is of the GPU's kind.
	Host *tensor.Runtime
	// Annotate records a note in the snapshot: every transfer as it happens and each step's totals (nil: no
	// notes).
	Annotate func(text string)
	// Optimizer is the optimizer the training loop asked for.
	Optimizer optim.Config
	// AMP is the loop's mixed precision: F32 for none, else the autocast dtype.
	AMP tensor.DType
}

// Rank is one process of a data-parallel job as the training loop drives it: the loop builds the model,
// hands it over, and then runs forward, backward, the step and zero_grad through the rank, which wraps the
// parameters, their gradients and the optimizer as its strategy does.
type Rank interface {
	// Settings are the job's settings, with every default filled in.
	Settings() Settings
	// ParamDType is the dtype the model's parameters are built in when requested is what the configuration
	// asks for: DeepSpeed's bf16 and fp16 modes run the model itself in half precision.
	ParamDType(requested tensor.DType) tensor.DType
	// Autocast reports whether the loop runs its forward under autocast (not for ZeRO in half precision, whose
	// model is half already).
	Autocast() bool
	// BuiltBlock is called with each repeated block (a GPT's transformer block, a Llama's decoder layer) as
	// soon as the model has built it: ZeRO-3 partitions its parameters at once (zero.Init) and FSDP makes it a
	// sharded unit (its per-unit move to the device), so that the whole model is never on the GPU.
	BuiltBlock(block nn.Module)
	// Wrap takes the built model and makes the optimizer. Like every method that allocates, it panics with a
	// *tensor.OOMError when the GPU runs out (tensor.Runtime.Catch turns it back into an error).
	Wrap(model nn.Module)
	// BeginForward is called before each micro-batch's forward; sync says whether its backward is the last
	// of the step's, the one whose gradients are reduced (DDP's no_sync for the others).
	BeginForward(iteration int, sync bool)
	// EndBackward is called after each micro-batch's backward.
	EndBackward()
	// Step is the optimizer step, through scaler when there is one (fp16 autocast with DDP or FSDP).
	Step(scaler *optim.GradScaler)
	// ZeroGrad clears the gradients: set to None, or zeroed in place.
	ZeroGrad(setToNone bool)
	// Traffic returns what the rank moved in each optimizer step so far.
	Traffic() []Traffic
	// StepTraffic returns what the rank has moved so far in the step under way.
	StepTraffic() Traffic
	// RepeatTraffic counts n times more what the rank moved in the step since it had moved from (a
	// StepTraffic of the same step): micro-batches a simulation did not run because they repeat those since.
	RepeatTraffic(from Traffic, n int)
}

// New returns the rank s describes, on env. s must be valid and parallel (s.Parallel()).
func New(s Settings, env Env) (Rank, error) {
	if err := s.Validate(); err != nil {
		return nil, err
	}
	if s.Offload != OffloadNone && env.Host == nil {
		return nil, fmt.Errorf("offload %s needs host memory", s.Offload)
	}
	b := base{s: s.withDefaults(), env: env, rt: env.RT, comm: comm{annotate: env.Annotate}}
	switch s.Strategy {
	case DDP:
		return &ddp{base: b}, nil
	case ZeRO1, ZeRO2:
		return &zero12{base: b}, nil
	case ZeRO3:
		return &zero3{base: b}, nil
	case FSDPFull, FSDPGradOp, HSDP:
		return &fsdp{base: b}, nil
	case FSDP2:
		return &fsdp2{base: b}, nil
	}
	return nil, fmt.Errorf("%s is not a data-parallel strategy", s.Strategy)
}

// base is what every rank shares: its settings, runtime and transfers.
type base struct {
	s         Settings
	env       Env
	rt        *tensor.Runtime
	comm      comm
	steps     []Traffic
	iteration int
	sync      bool
}

func (b *base) Settings() Settings { return b.s }

func (b *base) Traffic() []Traffic { return slices.Clone(b.steps) }

func (b *base) StepTraffic() Traffic { return b.comm.step }

func (b *base) RepeatTraffic(from Traffic, n int) {
	var d Traffic
	for c := range d.Payload {
		d.Payload[c] = int64(n) * (b.comm.step.Payload[c] - from.Payload[c])
		d.Calls[c] = n * (b.comm.step.Calls[c] - from.Calls[c])
	}
	d.Sent = int64(n) * (b.comm.step.Sent - from.Sent)
	b.comm.step.Add(d)
	b.comm.total.Add(d)
}

// endStep closes the step's traffic.
func (b *base) endStep() {
	b.steps = append(b.steps, b.comm.endStep(len(b.steps)))
}

// world is the number of ranks in the job.
func (b *base) world() int { return b.s.World() }

// allocating runs f with new allocations tagged as category c in the scope of the strategy's machinery,
// outside autograd.
func (b *base) allocating(c snapshot.Category, scope string, f func()) {
	prev := b.rt.SetCategory(c)
	defer b.rt.SetCategory(prev)
	if scope != "" {
		defer b.rt.Scope(scope)()
	}
	b.rt.NoGrad(f)
}

// trainable returns the model's parameters that require grad, in registration order.
func trainable(m nn.Module) []*nn.Parameter { return nn.Trainable(m) }

// flatView returns a view of flat's elements [off, off+numel) shaped as shape.
func flatView(flat *tensor.Tensor, off, numel int, shape []int) *tensor.Tensor {
	n := flat.Narrow(0, off, numel)
	defer n.Release()
	return n.View(shape...)
}

// ceilDiv is ceil(a/b) for positive b.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// halfOf returns the half dtype of a mixed-precision run (amp), or F32 without one.
func halfOf(amp tensor.DType) tensor.DType {
	if amp == tensor.BF16 || amp == tensor.F16 {
		return amp
	}
	return tensor.F32
}

// unitPrefix returns the unit a module path belongs to: the innermost unit whose path is path or a prefix
// of it (a LoRA adapter's unit nests in its block's), or "" (the root).
func unitPrefix(path string, prefixes []string) string {
	best := ""
	for _, p := range prefixes {
		if (path == p || strings.HasPrefix(path, p+".")) && len(p) > len(best) {
			best = p
		}
	}
	return best
}
