package torch

import (
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
)

// What frames say. A PyTorch snapshot carries the Python frames of each allocation (and C++ frames with
// stacks="all"); a snapshot oomdbg exports carries the Go frames of its workload runtime, whose packages
// mirror PyTorch's (workloads/nn is torch.nn, workloads/tensor's autograd is torch.autograd, workloads/optim
// is torch.optim). Each rule below names the frames of both that mean the same thing, and why.

// frameFact is one thing a frame says; a frame may say several.
type frameFact uint16

const (
	// factModuleCall: nn.Module.__call__ (_call_impl, _wrapped_call_impl): the frame inside it is a module's
	// forward.
	factModuleCall frameFact = 1 << iota
	// factForward: a module's forward itself, where the runtime has no __call__ frame (workloads/nn's
	// Forward, ForwardLoss and Loss methods).
	factForward
	// factBackward: the autograd engine, or the call that starts it (Tensor.backward, autograd.backward and
	// grad): what allocates here is backward.
	factBackward
	// factGradWrite: AccumulateGrad, which writes a parameter's .grad.
	factGradWrite
	// factRecompute: activation checkpointing rebuilding a segment's activations inside backward.
	factRecompute
	// factOptimizer: an optimizer's code (torch.optim, not its learning-rate schedulers).
	factOptimizer
	// factOptimizerInit: an optimizer creating its state (_init_group: exp_avg, exp_avg_sq, momentum buffers).
	factOptimizerInit
	// factZeroGrad: zero_grad, of an optimizer or a module.
	factZeroGrad
	// factParam: the model's weights being made or moved: module construction, Module._apply/to/cuda,
	// nn.Parameter, nn.init, state-dict and checkpoint loading.
	factParam
	// factAMPCast: autocast's cached cast of a weight (at::autocast::cached_cast).
	factAMPCast
	// factNative: compiled code (C, C++, or no file), which sits between a Python program's frames.
	factNative
	// factLoad: a pretrained model being loaded onto the device (transformers' from_pretrained and the
	// functions that put its state dict on the device, accelerate's load_checkpoint_and_dispatch); the
	// runtime's loading of a model (workloads/train's load).
	factLoad
)

// frameRule says what the frames it matches say.
type frameRule struct {
	facts frameFact
	match func(fn, file string) bool
}

// The oomdbg runtime's packages, as its Go frames name them.
const (
	goNN     = "github.com/oomdbg/oomdbg/workloads/nn."
	goTensor = "github.com/oomdbg/oomdbg/workloads/tensor."
	goOptim  = "github.com/oomdbg/oomdbg/workloads/optim."
)

// frameRules are read in order; the facts of every rule that matches a frame are added.
var frameRules = []frameRule{
	// Module calls: nn.Module.__call__ is _call_impl (and _wrapped_call_impl since 2.1).
	{factModuleCall, func(fn, file string) bool {
		return inTorch(file, "nn/modules/module.py") && (fn == "_call_impl" || fn == "_wrapped_call_impl")
	}},
	{factForward, func(fn, _ string) bool {
		m, ok := strings.CutPrefix(fn, goNN)
		return ok && (strings.Contains(m, ").Forward") || strings.Contains(m, ").Loss"))
	}},
	// Backward: the engine's C++ frames (autograd threads have no Python frames), or the Python call that
	// runs it on the calling thread.
	{factBackward, func(fn, file string) bool {
		switch {
		case strings.Contains(fn, "torch::autograd::Engine::"),
			strings.Contains(fn, "torch::autograd::python::PythonEngine::"),
			strings.Contains(fn, "torch::autograd::generated::") && strings.Contains(fn, "Backward"):
			return true
		case inTorch(file, "autograd/__init__.py"):
			return fn == "backward" || fn == "grad"
		case inTorch(file, "autograd/graph.py"):
			return fn == "_engine_run_backward"
		case inTorch(file, "_tensor.py"):
			return fn == "backward"
		}
		return fn == goTensor+"(*Tensor).Backward" || fn == goTensor+"(*Runtime).runBackward"
	}},
	{factBackward | factGradWrite, func(fn, _ string) bool {
		return strings.Contains(fn, "torch::autograd::AccumulateGrad::") || fn == goTensor+"accumulateGrad"
	}},
	// Checkpointing: CheckpointFunction.backward (reentrant), unpack (1.13's non-reentrant), unpack_hook and
	// recompute_fn (2.x); the runtime's checkpoint node.
	{factRecompute, func(fn, file string) bool {
		if inTorch(file, "utils/checkpoint.py") {
			return fn == "backward" || fn == "unpack" || fn == "unpack_hook" || fn == "recompute_fn"
		}
		return strings.HasPrefix(fn, goTensor+"CheckpointInputs.func")
	}},
	// zero_grad before the optimizer: both live in the optimizer's code.
	{factZeroGrad, func(fn, file string) bool {
		if fn == "zero_grad" {
			return inTorch(file, "optim/") || inTorch(file, "nn/modules/module.py")
		}
		return strings.HasPrefix(fn, goOptim) && strings.HasSuffix(fn, ").ZeroGrad")
	}},
	{factOptimizer, func(fn, file string) bool {
		if inTorch(file, "optim/") {
			return !strings.Contains(file, "lr_scheduler") && fn != "zero_grad"
		}
		return strings.HasPrefix(fn, goOptim) && !strings.HasSuffix(fn, ").ZeroGrad")
	}},
	{factOptimizerInit, func(fn, file string) bool {
		if inTorch(file, "optim/") {
			return fn == "_init_group"
		}
		return strings.HasPrefix(fn, goOptim) && strings.HasSuffix(fn, ").initGroup")
	}},
	// Weights made or moved: Module._apply (behind .to, .cuda, .half), nn.Parameter, nn.init, a module's
	// constructor or reset_parameters, state-dict and checkpoint loading (torch.load, safetensors, HF and
	// diffusers from_pretrained, accelerate's set_module_tensor_to_device); the runtime's module constructors.
	{factParam, func(fn, file string) bool {
		switch {
		case inTorch(file, "nn/modules/module.py"):
			switch fn {
			case "_apply", "to", "cuda", "to_empty", "load_state_dict", "_load_from_state_dict":
				return true
			}
			return false
		case inTorch(file, "nn/parameter.py"), inTorch(file, "nn/init.py"), inTorch(file, "serialization.py"):
			return true
		case inTorch(file, "nn/modules/"):
			return fn == "__init__" || fn == "reset_parameters"
		case strings.HasSuffix(file, "/modeling_utils.py"):
			return strings.Contains(fn, "load") || fn == "from_pretrained"
		case strings.HasSuffix(file, "accelerate/utils/modeling.py"):
			return fn == "set_module_tensor_to_device"
		case strings.HasSuffix(file, "safetensors/torch.py"):
			return strings.HasPrefix(fn, "load")
		}
		m, ok := strings.CutPrefix(fn, goNN)
		return ok && (strings.HasPrefix(m, "New") || strings.HasPrefix(m, "new") || strings.HasPrefix(m, "const"))
	}},
	{factLoad, func(fn, file string) bool {
		switch {
		case strings.HasSuffix(file, "/modeling_utils.py"):
			return fn == "from_pretrained" || fn == "_load_pretrained_model" || fn == "_load_state_dict_into_meta_model" ||
				fn == "load_shard_file"
		case strings.HasSuffix(file, "accelerate/big_modeling.py"):
			return fn == "load_checkpoint_and_dispatch"
		}
		return fn == "github.com/oomdbg/oomdbg/workloads/train.(*run).load"
	}},
	{factAMPCast, func(fn, _ string) bool {
		return strings.Contains(fn, "at::autocast::cached_cast") || fn == goTensor+"(*Runtime).cachedCast"
	}},
}

// inTorch reports whether file is rel inside the torch package ("nn/modules/module.py"; a rel ending in /
// is a directory).
func inTorch(file, rel string) bool {
	i := strings.Index(file, "torch/"+rel)
	if i < 0 {
		return false
	}
	// torch/ itself must be a path element: site-packages/torch/..., or a relative torch/...
	return i == 0 || file[i-1] == '/' || file[i-1] == '\\'
}

// factsOf is what one frame says.
func factsOf(fn, file string) frameFact {
	var f frameFact
	for _, r := range frameRules {
		if r.match(fn, file) {
			f |= r.facts
		}
	}
	return f
}

// phaseEvidence is what a stack says about the training phase it was captured in.
type phaseEvidence uint8

const (
	evidenceNone      phaseEvidence = iota // no frames: says nothing (autograd threads have no Python frames)
	evidenceOther                          // frames, none that name a phase
	evidenceForward                        // a module's forward is on the stack
	evidenceBackward                       // the autograd engine is on the stack
	evidenceRecompute                      // checkpointing is recomputing a forward inside backward
	evidenceOptimizer                      // the optimizer's code is on the stack
	evidenceZeroGrad                       // zero_grad of an optimizer or a module
	evidenceLoad                           // a pretrained model being loaded
)

// phase returns the phase evidence names, and false when it says nothing (no frames). Frames that name no
// phase name PhaseNone.
func (e phaseEvidence) phase() (snapshot.Phase, bool) {
	switch e {
	case evidenceOther:
		return snapshot.PhaseNone, true
	case evidenceForward:
		return snapshot.PhaseForward, true
	case evidenceBackward:
		return snapshot.PhaseBackward, true
	case evidenceRecompute:
		return snapshot.PhaseRecompute, true
	case evidenceOptimizer:
		return snapshot.PhaseOptimizer, true
	case evidenceZeroGrad:
		return snapshot.PhaseZeroGrad, true
	case evidenceLoad:
		return snapshot.PhaseLoad, true
	}
	return snapshot.PhaseNone, false
}

// stackFacts is what one stack says.
type stackFacts struct {
	phase phaseEvidence
	facts frameFact // of all its frames
	// module is the innermost frame of a module's forward outside the torch package (the forward of the
	// user's module that called nn.Linear, not nn.Linear's), or the runtime's innermost module forward; 0
	// when the stack shows none.
	module snapshot.FrameID
}

// has reports whether any frame of the stack says f.
func (sf stackFacts) has(f frameFact) bool { return sf.facts&f != 0 }

// readStacks reads what every stack of s says. Frames are read once each.
func readStacks(s *snapshot.Snapshot) []stackFacts {
	frames := make([]frameFact, len(s.Frames))
	for id := 1; id < len(s.Frames); id++ {
		f := s.Frames[id]
		frames[id] = factsOf(s.String(f.Function), s.String(f.File))
		if s.NativeFrame(snapshot.FrameID(id)) {
			frames[id] |= factNative
		}
	}
	out := make([]stackFacts, len(s.Stacks))
	for id := 1; id < len(s.Stacks); id++ {
		out[id] = classify(s, s.Stacks[id], frames)
	}
	return out
}

// moduleForward reports whether stack[0] is a module's forward the program wrote: the runtime's, or a Python
// frame outside the torch package whose caller, the next Python frame out, is a module call.
func moduleForward(s *snapshot.Snapshot, stack []snapshot.FrameID, frames []frameFact) bool {
	f := frames[stack[0]]
	if f&factForward != 0 {
		return true
	}
	if f&factModuleCall != 0 || snapshot.TorchFile(s.String(s.Frame(stack[0]).File)) {
		return false
	}
	for _, id := range stack[1:] {
		if int(id) < len(frames) && frames[id]&factNative == 0 {
			return frames[id]&factModuleCall != 0
		}
	}
	return false
}

// classify reads a stack innermost first. The first frame that names a phase other than forward decides it,
// so an optimizer's closure that calls backward() counts as backward; a module call names forward only when
// nothing else on the stack names a phase: a checkpoint recomputes modules inside backward, and an optimizer
// may call one.
func classify(s *snapshot.Snapshot, stack []snapshot.FrameID, frames []frameFact) stackFacts {
	var sf stackFacts
	if len(stack) == 0 {
		return sf
	}
	sf.phase = evidenceOther
	decided, forward := false, false
	for i, id := range stack {
		if int(id) >= len(frames) {
			continue
		}
		f := frames[id]
		sf.facts |= f
		if !decided {
			switch {
			case f&factRecompute != 0:
				sf.phase, decided = evidenceRecompute, true
			case f&factBackward != 0:
				sf.phase, decided = evidenceBackward, true
			case f&factZeroGrad != 0:
				sf.phase, decided = evidenceZeroGrad, true
			case f&factOptimizer != 0:
				sf.phase, decided = evidenceOptimizer, true
			case f&factLoad != 0:
				sf.phase, decided = evidenceLoad, true
			case f&(factModuleCall|factForward) != 0:
				forward = true
			}
		}
		if sf.module == 0 && f&factNative == 0 && moduleForward(s, stack[i:], frames) {
			sf.module = id
		}
	}
	if !decided && forward {
		sf.phase = evidenceForward
	}
	return sf
}
