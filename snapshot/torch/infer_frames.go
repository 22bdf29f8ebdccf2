package torch

import (
	"path"
	"slices"
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
	// Forward, ForwardLoss, Loss and forward* methods).
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
	// factLibrary: code that wraps or implements modules but is not the model's own: torch.nn's own
	// modules in the runtime (module.go), peft's tuner layers and PeftModel (and the runtime's lora.go),
	// bitsandbytes' layers and autograd functions (linear4bit.go), accelerate's hooks, HF's checkpointing
	// layer and decorators, torch.utils.checkpoint, torch.compile's frames and the code it generates,
	// IPython, ipykernel and runpy. It is never a scope, and a module's forward is found through it: the
	// caller of a forward that accelerate's new_forward wraps is still the module call.
	factLibrary
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
		return ok && (strings.Contains(m, ").Forward") || strings.Contains(m, ").forward") || strings.Contains(m, ").Loss"))
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
	{factLibrary, libraryFrame},
}

// libraryPackages are the Python packages, files and directories whose frames are library code around a
// model's modules (factLibrary), as their frames name them: accelerate's hooks.py new_forward (which calls
// module._old_forward), peft's BaseTuner.forward (tuners_utils.py, which calls self.model.forward),
// PeftModel.forward (peft_model.py) and tuner layers (tuners/lora/layer.py, bnb.py), bitsandbytes'
// Linear4bit.forward (nn/modules.py) and MatMul4Bit (autograd/_functions.py), HF's
// GradientCheckpointingLayer.__call__ (modeling_layers.py), its layers that stand for torch.nn's (GPT-2's
// Conv1D in pytorch_utils.py, the activations of activations.py), the decorators of transformers/utils
// (can_return_tuple, check_model_inputs, deprecate_kwarg), and a notebook's kernel.
var libraryPackages = []string{
	"accelerate/", "peft/", "bitsandbytes/", "transformers/modeling_layers.py", "transformers/pytorch_utils.py",
	"transformers/activations.py", "transformers/utils/", "transformers/integrations/", "IPython/", "ipykernel/",
	"ipykernel_launcher.py", "runpy.py",
}

// torchLibrary are the files and directories of the torch package that run a module's forward for it
// (torch.utils.checkpoint, torch.compile's eval frames, a custom autograd Function's apply, no_grad's
// decorator) rather than being a module.
var torchLibrary = []string{
	"utils/checkpoint.py", "_dynamo/", "_compile.py", "_functorch/", "_inductor/", "autograd/function.py",
	"utils/_contextlib.py",
}

// goLibrary are the runtime's files that mirror library code: torch.nn's modules, peft's LoRA layer and
// bitsandbytes' 4-bit linear.
var goLibrary = []string{"module.go", "lora.go", "linear4bit.go"}

// libraryFrame reports whether a frame is library code around a model's modules (factLibrary).
func libraryFrame(fn, file string) bool {
	if strings.HasPrefix(fn, goNN) {
		return slices.Contains(goLibrary, path.Base(strings.ReplaceAll(file, `\`, "/")))
	}
	for _, p := range torchLibrary {
		if inTorch(file, p) {
			return true
		}
	}
	for _, p := range libraryPackages {
		if inPackage(file, p) {
			return true
		}
	}
	// The code torch.compile generates (torchinductor_<user>/.../<hash>.py).
	return strings.Contains(file, "torchinductor_")
}

// inPackage reports whether file is rel inside a Python installation (site-packages/accelerate/hooks.py for
// "accelerate/", .../lib/python3.10/runpy.py for "runpy.py"), or is rel itself: rel must start at a path
// element.
func inPackage(file, rel string) bool {
	file = strings.ReplaceAll(file, `\`, "/")
	for i := strings.Index(file, rel); i >= 0; {
		if i == 0 || file[i-1] == '/' {
			return strings.HasSuffix(rel, "/") || len(file) == i+len(rel)
		}
		j := strings.Index(file[i+1:], rel)
		if j < 0 {
			return false
		}
		i += 1 + j
	}
	return false
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
	// modules are the frames of the modules' forwards the program wrote, innermost first: Python frames
	// outside the torch package and the libraries around modules whose caller, the next frame out that is
	// neither native nor such a library, is a module call (the forward of the user's module that called
	// nn.Linear, not nn.Linear's), or the runtime's module forwards outside its mirrors of torch.nn, peft and
	// bitsandbytes. Empty when the stack shows none.
	modules []snapshot.FrameID
	// module is modules[0], the block's scope; 0 when the stack shows none.
	module snapshot.FrameID
}

// has reports whether any frame of the stack says f.
func (sf stackFacts) has(f frameFact) bool { return sf.facts&f != 0 }

// readStacks reads what every stack of s says. Frames are read once each.
func readStacks(s *snapshot.Snapshot) []stackFacts {
	frames := make([]frameFact, len(s.Frames))
	python := make([]bool, len(s.Frames)) // a Python frame of the program's own code: a module forward if called by one
	for id := 1; id < len(s.Frames); id++ {
		f := s.Frames[id]
		file := s.String(f.File)
		frames[id] = factsOf(s.String(f.Function), file)
		if s.NativeFrame(snapshot.FrameID(id)) {
			frames[id] |= factNative
		}
		python[id] = strings.HasSuffix(file, ".py") && !snapshot.TorchFile(file)
	}
	out := make([]stackFacts, len(s.Stacks))
	var modules moduleArena
	for id := 1; id < len(s.Stacks); id++ {
		out[id] = classify(s.Stacks[id], frames, python, &modules)
	}
	return out
}

// moduleArena holds the stacks' module frames in a few large chunks, not a slice per stack: a snapshot has
// tens of thousands of stacks.
type moduleArena struct {
	chunk   []snapshot.FrameID
	scratch []snapshot.FrameID
}

// keep returns a copy of ms held in the arena.
func (a *moduleArena) keep(ms []snapshot.FrameID) []snapshot.FrameID {
	if len(ms) == 0 {
		return nil
	}
	if cap(a.chunk)-len(a.chunk) < len(ms) {
		a.chunk = make([]snapshot.FrameID, 0, max(4096, len(ms)))
	}
	start := len(a.chunk)
	a.chunk = append(a.chunk, ms...)
	return a.chunk[start:len(a.chunk):len(a.chunk)]
}

// classify reads a stack innermost first. The first frame that names a phase other than forward decides it,
// so an optimizer's closure that calls backward() counts as backward; a module call names forward only when
// nothing else on the stack names a phase: a checkpoint recomputes modules inside backward, and an optimizer
// may call one.
func classify(stack []snapshot.FrameID, frames []frameFact, python []bool, modules *moduleArena) stackFacts {
	var sf stackFacts
	if len(stack) == 0 {
		return sf
	}
	sf.phase = evidenceOther
	decided, forward := false, false
	for _, id := range stack {
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
	}
	if !decided && forward {
		sf.phase = evidenceForward
	}
	modules.scratch = moduleForwards(modules.scratch[:0], stack, frames, python)
	sf.modules = modules.keep(modules.scratch)
	if len(sf.modules) > 0 {
		sf.module = sf.modules[0]
	}
	return sf
}

// moduleForwards appends to out the frames of stack that are forwards of the program's own modules,
// innermost first (stackFacts.modules). It reads the stack from its outermost frame in, keeping the nearest frame out of
// each that is neither native nor library code: a Python frame is a module's forward when that frame is a
// module call.
func moduleForwards(out, stack []snapshot.FrameID, frames []frameFact, python []bool) []snapshot.FrameID {
	caller := frameFact(0) // the facts of the nearest frame out that is neither native nor library code
	for i := len(stack) - 1; i >= 0; i-- {
		id := stack[i]
		if int(id) >= len(frames) {
			continue
		}
		f := frames[id]
		switch {
		case f&factLibrary != 0:
			continue
		case f&factForward != 0 || python[id] && f&(factModuleCall|factNative) == 0 && caller&factModuleCall != 0:
			out = append(out, id)
		}
		if f&factNative == 0 {
			caller = f
		}
	}
	slices.Reverse(out)
	return out
}
