// Package tensor is the eager tensor runtime of oomdbg's workloads: tensors with refcounted device storage,
// views, the ops a training loop needs, autograd, no_grad, retain_graph, activation checkpointing and
// autocast.
//
// Memory behaves as in eager PyTorch, because that is what a user's lessons must transfer to: a block is
// allocated through the device's caching allocator when an op makes its output, and freed the moment its last
// holder lets go; autograd saves exactly what PyTorch saves for each op and frees it node by node during
// backward unless the graph is retained. Go's garbage collector plays no part: every holder releases its
// tensors explicitly (Release), as Python's reference counting would.
//
// Allocation failures unwind like Python exceptions: an op that cannot get memory panics with an *OOMError,
// which Runtime.Catch turns back into an error at the training loop's boundary.
package tensor

import (
	"errors"
	"fmt"
	"github.com/oomdbg/oomdbg/versions"
	"math/rand/v2"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// Tracer is told about memory as the runtime allocates it; *tracer.Recorder implements it.
type Tracer interface {
	SetPhase(p snapshot.Phase)
	TagNextAlloc(c snapshot.Category, label string)
	SetCategory(device int, addr uint64, c snapshot.Category, label string)
	PushScope(path string)
	PopScope()
}

// Runtime is the state every tensor of one workload shares: the device, the tracer, grad mode, autocast, the
// random generator and the registry of live tensors that heap dumps walk. It is not safe for concurrent use:
// a training loop runs on one goroutine, as eager PyTorch's Python thread does.
type Runtime struct {
	dev *device.Device
	tr  Tracer
	src *rand.PCG // rng's source, whose state checkpointing saves and restores
	rng *rand.Rand

	gradEnabled bool
	autocast    DType // F32: autocast off; F16 or BF16: the autocast dtype
	ampCache    map[*object]*Tensor
	ampOrder    []*object         // the cache's keys in insertion order
	category    snapshot.Category // category of new allocations unless an op says otherwise
	phase       snapshot.Phase
	inBackward  bool

	scopes []string // module scopes entered, innermost last
	seq    uint64   // sequence numbers of autograd nodes, in creation order
	// handles lists every live tensor reference (Tensor.prev, next), newest first: a list, not a map, as
	// every operation makes and drops references and a map's hashing was a tenth of a simulated step.
	handles  *Tensor
	nHandles int
	nextRef  uint64
	onOOM    func(*OOMError)

	scopeHook func(path string, enter bool) // SetScopeHook
	pinned    bool                          // new allocations page-locked (Pinned)
	// versions are the library releases whose behaviour the ops follow where it changed (versions.Behaviours).
	versions versions.Set
	stream   int64 // the current stream (OnStream): where new allocations and kernels go

	policy *CheckpointPolicy // what checkpointed regions keep (SetCheckpointPolicy)
	region *policyRegion     // the checkpointed region running under policy, if any

	offload       *ActivationOffload // saved tensors moved to host memory (SetActivationOffload)
	backwardDepth int                // backward runs under way: a reentrant checkpoint's runs inside another
}

// NewRuntime returns a runtime on dev. tr may be nil (nothing traced). seed makes dropout and initialisation
// reproducible.
func NewRuntime(dev *device.Device, tr Tracer, seed uint64) *Runtime {
	src := rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)
	return &Runtime{
		dev:         dev,
		tr:          tr,
		src:         src,
		rng:         rand.New(src),
		gradEnabled: true,
		autocast:    F32,
		category:    snapshot.CategoryTemporary,
	}
}

// SetVersions sets the library releases the ops follow (the zero Set: versions.Default).
func (rt *Runtime) SetVersions(s versions.Set) { rt.versions = s }

// Versions returns the library releases the ops follow.
func (rt *Runtime) Versions() versions.Set { return rt.versions }

// Device returns the runtime's device.
func (rt *Runtime) Device() *device.Device { return rt.dev }

// Tracer returns the runtime's tracer, or nil.
func (rt *Runtime) Tracer() Tracer { return rt.tr }

// Rand returns the runtime's random generator.
func (rt *Runtime) Rand() *rand.Rand { return rt.rng }

// GradEnabled reports whether ops record autograd graphs (torch.is_grad_enabled).
func (rt *Runtime) GradEnabled() bool { return rt.gradEnabled }

// SetGradEnabled turns graph recording on or off and returns the previous setting.
func (rt *Runtime) SetGradEnabled(on bool) (prev bool) {
	prev, rt.gradEnabled = rt.gradEnabled, on
	return prev
}

// NoGrad runs f with graph recording off (torch.no_grad): no node is created and nothing is saved.
func (rt *Runtime) NoGrad(f func()) {
	prev := rt.SetGradEnabled(false)
	defer rt.SetGradEnabled(prev)
	f()
}

// SetPhase tells the tracer that phase p begins and returns the previous phase.
func (rt *Runtime) SetPhase(p snapshot.Phase) (prev snapshot.Phase) {
	prev, rt.phase = rt.phase, p
	if rt.tr != nil {
		rt.tr.SetPhase(p)
	}
	return prev
}

// Phase returns the current phase.
func (rt *Runtime) Phase() snapshot.Phase { return rt.phase }

// SetCategory sets the category of new allocations that no op tags otherwise (e.g. temporary in the
// forward pass, autograd_detail in backward) and returns the previous one.
func (rt *Runtime) SetCategory(c snapshot.Category) (prev snapshot.Category) {
	prev, rt.category = rt.category, c
	return prev
}

// Scope enters a module scope (e.g. "blocks.3.attn"): allocations and autograd nodes made inside carry it.
// Call the returned function to leave it.
func (rt *Runtime) Scope(path string) (leave func()) {
	rt.scopes = append(rt.scopes, path)
	if rt.offload != nil && rt.offload.packing {
		rt.offload.enterScope(path)
	}
	if rt.tr != nil {
		rt.tr.PushScope(path)
	}
	if rt.scopeHook != nil {
		rt.scopeHook(path, true)
	}
	return func() {
		if rt.scopeHook != nil {
			rt.scopeHook(path, false)
		}
		rt.scopes = rt.scopes[:len(rt.scopes)-1]
		if rt.tr != nil {
			rt.tr.PopScope()
		}
	}
}

// scope returns the innermost module scope, or "".
func (rt *Runtime) scope() string {
	if n := len(rt.scopes); n > 0 {
		return rt.scopes[n-1]
	}
	return ""
}

// OnOOM sets a function called when an allocation fails, before the OOM unwinds: the moment to take a heap
// dump, while every holder still holds.
func (rt *Runtime) OnOOM(f func(*OOMError)) { rt.onOOM = f }

// OOMError is an allocation the device could not satisfy.
type OOMError struct {
	Bytes uint64 // what the tensor needed
	Label string // the tensor being allocated
	Err   error  // the allocator's error, whose text is PyTorch's OOM message
}

func (e *OOMError) Error() string { return e.Err.Error() }
func (e *OOMError) Unwrap() error { return e.Err }

// Catch runs f and returns the OOM it raised or the error it aborted with, if any. Other panics pass
// through: they are bugs.
func (rt *Runtime) Catch(f func()) (err error) {
	defer func() {
		if r := recover(); r != nil {
			switch e := r.(type) {
			case *OOMError:
				err = e
			case *abort:
				err = e.err
			default:
				panic(r)
			}
		}
	}()
	f()
	return nil
}

// Abort unwinds the running computation to the enclosing Catch, which returns err: how a training loop
// stops between two ops when it is interrupted.
func Abort(err error) { panic(&abort{err}) }

type abort struct{ err error }

// LiveHandles returns the number of live tensor handles (for tests: a loop that releases everything returns
// to where it started).
func (rt *Runtime) LiveHandles() int { return rt.nHandles }

// errShape reports a shape mismatch in an op: a bug in the workload, so it panics.
func errShape(op string, format string, args ...any) {
	panic(fmt.Errorf("tensor.%s: %s", op, fmt.Sprintf(format, args...)))
}

// IsOOM reports whether err is (or wraps) an allocation failure.
func IsOOM(err error) bool {
	var oom *OOMError
	return errors.As(err, &oom)
}
