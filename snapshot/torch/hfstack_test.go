package torch_test

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/torch"
)

// The frames of a fine-tune through Hugging Face's stack, as the libraries' sources make them: a notebook
// cell (IPython's run_code under ipykernel and runpy) calls PeftModelForCausalLM.forward (peft_model.py),
// which calls the LoRA model's BaseTuner.forward (tuners_utils.py: self.model.forward), which calls
// LlamaForCausalLM.forward through accelerate's hook (hooks.py new_forward: module._old_forward); each of
// HF's modules runs under nn.Module.__call__ and accelerate's hook; a LoRA layer (peft's tuners/lora/bnb.py
// Linear4bit.forward) calls its base layer, bitsandbytes' Linear4bit.forward (nn/modules.py), which calls
// bnb.matmul_4bit and MatMul4Bit.apply (autograd/_functions.py), which dequantizes the weight
// (functional.py). Backward runs on autograd's thread: its allocations have the engine's C++ frames, and
// MatMul4Bit.backward's Python frames under PyNode::apply. The line numbers of modeling_llama.py are those
// of a real notebook's snapshot (transformers 4.40's LlamaMLP.forward 216, LlamaDecoderLayer.forward 713
// and 727, LlamaModel.forward's loop 968, LlamaForCausalLM.forward 1164), the others those of the
// libraries' sources.

// pyFrame is one frame of a trace entry, innermost first.
type pyFrame struct {
	file, name string
	line       int
}

// Library frames, by the code that makes them.
var (
	callImpl     = []pyFrame{{"/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", "_call_impl", 1527}, {"/opt/conda/lib/python3.10/site-packages/torch/nn/modules/module.py", "_wrapped_call_impl", 1518}}
	newForward   = pyFrame{"/opt/conda/lib/python3.10/site-packages/accelerate/hooks.py", "new_forward", 190}
	tunerForward = pyFrame{"/opt/conda/lib/python3.10/site-packages/peft/tuners/tuners_utils.py", "forward", 347}
	peftForward  = pyFrame{"/opt/conda/lib/python3.10/site-packages/peft/peft_model.py", "forward", 2117}
	notebook     = []pyFrame{
		{"/tmp/ipykernel_114/3105878423.py", "<module>", 21},
		{"/opt/conda/lib/python3.10/site-packages/IPython/core/interactiveshell.py", "run_code", 3577},
		{"/opt/conda/lib/python3.10/site-packages/IPython/core/interactiveshell.py", "run_ast_nodes", 3517},
		{"/opt/conda/lib/python3.10/site-packages/ipykernel/zmqshell.py", "run_cell", 549},
		{"/opt/conda/lib/python3.10/site-packages/ipykernel/ipkernel.py", "do_execute", 449},
		{"/opt/conda/lib/python3.10/site-packages/ipykernel/kernelapp.py", "start", 739},
		{"/opt/conda/lib/python3.10/runpy.py", "_run_code", 86},
		{"/opt/conda/lib/python3.10/runpy.py", "_run_module_as_main", 196},
	}
	// The allocator's and ATen's frames under every allocation (stacks="all").
	mallocFrames = []pyFrame{
		{"CUDACachingAllocator.cpp", "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long, CUstream_st*)", 0},
		{"??", "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, c10::optional<c10::Device>, c10::optional<c10::MemoryFormat>)", 0},
	}
	// Autograd's thread: no Python frames but the engine's.
	engineFrames = []pyFrame{
		{"??", "torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&, torch::autograd::Node*, torch::autograd::InputBuffer&, std::shared_ptr<torch::autograd::ReadyQueue> const&)", 0},
		{"??", "torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::GraphTask> const&)", 0},
		{"??", "torch::autograd::python::PythonEngine::thread_init(int, std::shared_ptr<torch::autograd::ReadyQueue> const&, bool)", 0},
	}
)

const modelingLlama = "/opt/conda/lib/python3.10/site-packages/transformers/models/llama/modeling_llama.py"

// module returns the frames of a call of an HF module's forward at line, under __call__ and accelerate's hook.
func module(line int, rest ...pyFrame) []pyFrame {
	return append(append([]pyFrame{{modelingLlama, "forward", line}, newForward}, callImpl...), rest...)
}

// qloraStack is the stack of an allocation at the model's code: inner (innermost first) inside the module
// forwards of the decoder layer's line decLine and its module's line modLine (0: the decoder layer's own
// allocation), then the model's forward at its loop, the causal LM, peft and the notebook.
func qloraStack(inner []pyFrame, modLine, decLine int) []pyFrame {
	st := append([]pyFrame{}, mallocFrames...)
	st = append(st, inner...)
	if modLine != 0 {
		st = append(st, module(modLine)...)
	}
	st = append(st, module(decLine)...)
	st = append(st, causalLM(968)...)
	return st
}

// causalLM is the frames from LlamaModel.forward at line out: the causal LM's forward, peft and the notebook.
func causalLM(line int) []pyFrame {
	st := module(line)
	st = append(st, pyFrame{modelingLlama, "forward", 1164}, newForward, tunerForward)
	st = append(st, callImpl...)
	st = append(st, peftForward)
	st = append(st, callImpl...)
	return append(st, notebook...)
}

// bnbMatmul is the frames of a 4-bit linear layer's forward under peft's LoRA layer: dequantize (or the
// matmul) inside MatMul4Bit.forward.
func bnbMatmul(dequantize bool) []pyFrame {
	var st []pyFrame
	if dequantize {
		st = append(st, pyFrame{"/opt/conda/lib/python3.10/site-packages/bitsandbytes/functional.py", "dequantize_4bit", 1349})
	}
	st = append(st,
		pyFrame{"/opt/conda/lib/python3.10/site-packages/bitsandbytes/autograd/_functions.py", "forward", 337},
		pyFrame{"/opt/conda/lib/python3.10/site-packages/torch/autograd/function.py", "apply", 539},
		pyFrame{"/opt/conda/lib/python3.10/site-packages/bitsandbytes/autograd/_functions.py", "matmul_4bit", 491},
		pyFrame{"/opt/conda/lib/python3.10/site-packages/bitsandbytes/nn/modules.py", "forward", 637}, newForward)
	st = append(st, callImpl...)
	st = append(st, pyFrame{"/opt/conda/lib/python3.10/site-packages/peft/tuners/lora/bnb.py", "forward", 521})
	return append(st, callImpl...)
}

// traceBuilder writes a PyTorch snapshot (the JSON form memory_viz and oomdbg read): a trace on device 0 and
// the final state, every block at an address of its own in one segment, the blocks alive before the trace
// at its start.
type traceBuilder struct {
	entries []map[string]any
	blocks  []tb // every block, in address order
	next    int64
	time    int64
}

type tb struct {
	addr, size int64
	alive      bool
}

const segBase = 1 << 32

func newTraceBuilder() *traceBuilder { return &traceBuilder{next: segBase} }

func frames(st []pyFrame) []map[string]any {
	out := make([]map[string]any, len(st))
	for i, f := range st {
		out[i] = map[string]any{"filename": f.file, "name": f.name, "line": f.line}
	}
	return out
}

// before adds a block alive before the trace began (a weight loaded before the history was turned on).
func (b *traceBuilder) before(size int64) {
	b.blocks = append(b.blocks, tb{b.next, size, true})
	b.next += size
}

func (b *traceBuilder) entry(action string, addr, size int64, st []pyFrame) {
	b.time++
	e := map[string]any{"action": action, "addr": addr, "size": size, "stream": 0, "time_us": b.time, "frames": frames(st)}
	if action == "oom" {
		e["device_free"] = 0
		delete(e, "addr")
	}
	b.entries = append(b.entries, e)
}

// alloc allocates size bytes at st and returns the block's address.
func (b *traceBuilder) alloc(size int64, st []pyFrame) int64 {
	a := b.next
	b.next += size
	b.blocks = append(b.blocks, tb{a, size, true})
	b.entry("alloc", a, size, st)
	return a
}

// free frees the block at addr (its frames, as PyTorch records them, are the free's).
func (b *traceBuilder) free(addr int64, st []pyFrame) {
	i := slices.IndexFunc(b.blocks, func(x tb) bool { return x.addr == addr })
	b.blocks[i].alive = false
	b.entry("free_requested", addr, b.blocks[i].size, st)
	b.entry("free_completed", addr, b.blocks[i].size, st)
}

func (b *traceBuilder) oom(size int64, st []pyFrame) { b.entry("oom", 0, size, st) }

// json returns the snapshot: the trace, and one segment that holds every block.
func (b *traceBuilder) json(t *testing.T) []byte {
	t.Helper()
	var blocks []map[string]any
	var allocated int64
	for _, x := range b.blocks {
		state := "inactive"
		if x.alive {
			state = "active_allocated"
			allocated += x.size
		}
		blocks = append(blocks, map[string]any{"address": x.addr, "size": x.size, "requested_size": x.size, "state": state, "frames": []any{}})
	}
	total := b.next - segBase
	seg := map[string]any{"device": 0, "address": segBase, "total_size": total, "allocated_size": allocated,
		"active_size": allocated, "requested_size": allocated, "stream": 0, "segment_type": "large", "blocks": blocks}
	data, err := json.Marshal(map[string]any{"segments": []any{seg}, "device_traces": []any{b.entries}})
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// qloraNotebook builds a QLoRA fine-tune of a Llama of layers decoder layers, recorded in a notebook after
// the model was loaded: one forward and one backward, or, with oomLayer >= 0, a forward that runs out of
// memory in that layer's MLP. It returns the snapshot and, by address, the layer each decoder layer's
// allocation ran in.
func qloraNotebook(t *testing.T, layers, oomLayer int) ([]byte, map[int64]int) {
	const mb = 1 << 20
	b := newTraceBuilder()
	for range 2 + layers*9 { // embeddings, head, and per layer 7 quantized weights and two norms
		b.before(4 * mb)
	}
	for range layers * 4 { // LoRA A and B of q_proj and v_proj
		b.before(mb)
	}
	b.before(mb) // the batch, made before the recording began
	layerOf := map[int64]int{}
	saved := []int64{} // what backward frees, last first
	embed := b.alloc(2*mb, append(append(append([]pyFrame{}, mallocFrames...),
		pyFrame{"/opt/conda/lib/python3.10/site-packages/torch/nn/functional.py", "embedding", 2264},
		pyFrame{"/opt/conda/lib/python3.10/site-packages/torch/nn/modules/sparse.py", "forward", 163}), append(callImpl, causalLM(935)...)...))
	saved = append(saved, embed)
	for l := range layers {
		note := func(a int64) int64 { layerOf[a] = l; return a }
		// LlamaRMSNorm.forward (modeling_llama.py:87) upcasts (freed at once) and keeps its output.
		norm := func(decLine int) int64 {
			rms := qloraStack(nil, 87, decLine)
			tmp := note(b.alloc(4*mb, rms))
			out := note(b.alloc(2*mb, rms))
			b.free(tmp, rms)
			return out
		}
		saved = append(saved, norm(709))
		// self_attn: q_proj and v_proj through LoRA and bitsandbytes; MatMul4Bit keeps its input.
		for _, line := range []int{318, 320} {
			dq := qloraStack(bnbMatmul(true), line, 713)
			w := note(b.alloc(8*mb, dq))
			out := note(b.alloc(2*mb, qloraStack(bnbMatmul(false), line, 713)))
			b.free(w, dq)
			saved = append(saved, out)
		}
		scores := qloraStack([]pyFrame{{"/opt/conda/lib/python3.10/site-packages/torch/nn/functional.py", "scaled_dot_product_attention", 5200}}, 343, 713)
		saved = append(saved, note(b.alloc(3*mb, scores)))
		saved = append(saved, norm(726))
		// mlp: LlamaMLP.forward (modeling_llama.py:216) through bitsandbytes, the OOM's place when asked.
		mlp := qloraStack(bnbMatmul(true), 216, 727)
		if l == oomLayer {
			b.oom(64*mb, mlp)
			return b.json(t), layerOf
		}
		w := note(b.alloc(8*mb, mlp))
		saved = append(saved, note(b.alloc(6*mb, qloraStack(bnbMatmul(false), 216, 727))))
		b.free(w, mlp)
	}
	// lm_head (an nn.Linear, not quantized) in LlamaForCausalLM.forward: the logits, kept for the loss.
	head := append(append([]pyFrame{}, mallocFrames...), pyFrame{"/opt/conda/lib/python3.10/site-packages/torch/nn/modules/linear.py", "forward", 114}, newForward)
	head = append(append(head, callImpl...), pyFrame{modelingLlama, "forward", 1183}, newForward, tunerForward)
	head = append(append(append(append(head, callImpl...), peftForward), callImpl...), notebook...)
	saved = append(saved, b.alloc(16*mb, head))
	// Backward: autograd's thread. Each saved tensor is freed as its node runs; the LoRA weights get their
	// gradients, which stay.
	bnbBackward := append(append(append([]pyFrame{}, mallocFrames...),
		pyFrame{"/opt/conda/lib/python3.10/site-packages/bitsandbytes/functional.py", "dequantize_4bit", 1349},
		pyFrame{"/opt/conda/lib/python3.10/site-packages/bitsandbytes/autograd/_functions.py", "backward", 384},
		pyFrame{"/opt/conda/lib/python3.10/site-packages/torch/autograd/function.py", "apply", 288},
		pyFrame{"??", "torch::autograd::PyNode::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", 0}), engineFrames...)
	mm := append(append(append([]pyFrame{}, mallocFrames...), pyFrame{"??", "torch::autograd::generated::MmBackward0::apply(std::vector<at::Tensor, std::allocator<at::Tensor> >&&)", 0}), engineFrames...)
	gradIn := b.alloc(16*mb, mm)
	for i := len(saved) - 1; i >= 0; i-- {
		g := b.alloc(2*mb, mm) // the gradient flowing back
		if i%4 == 2 {
			w := b.alloc(8*mb, bnbBackward)
			b.free(w, bnbBackward)
			b.alloc(mb/2, mm) // a LoRA weight's gradient
		}
		b.free(saved[i], mm)
		b.free(gradIn, mm)
		gradIn = g
	}
	return b.json(t), layerOf
}

// TestScopesThroughHFStack: on a QLoRA fine-tune's trace with the frames of transformers, peft,
// bitsandbytes, accelerate and IPython, every allocation in a decoder layer is scoped to the model's own
// module's forward in modeling_llama.py, with the index of the layer it ran in, and no scope names a
// library's frame; the forward and backward are iteration 0; the weights loaded before the trace are
// parameters, what the forward keeps for backward activations, the dequantized weights temporaries and the
// LoRA gradients gradients. Run out of memory in a layer's MLP, the request is scoped to that layer.
func TestScopesThroughHFStack(t *testing.T) {
	const layers = 4
	data, layerOf := qloraNotebook(t, layers, -1)
	s, err := torch.Import(data)
	if err != nil {
		t.Fatal(err)
	}
	if o, _ := torch.OriginOf(s); o.Iterations != torch.IterationsPartial.String() {
		t.Errorf("iterations %q, want %q", o.Iterations, torch.IterationsPartial)
	}
	libraries := []string{"hooks.py", "tuners_utils.py", "peft_model.py", "bnb.py", "modules.py", "_functions.py",
		"functional.py", "interactiveshell.py", "zmqshell.py", "runpy.py", "3105878423.py", "module.py"}
	cats := map[snapshot.Category]int64{}
	for _, e := range s.Events.All() {
		if e.Action != snapshot.ActionAlloc || s.Reconstructed(&e) {
			continue
		}
		if e.Iteration != 0 {
			t.Errorf("alloc at %#x in iteration %d, want 0", e.Addr, e.Iteration)
		}
		cats[e.Category] += e.Size
		scope := s.String(e.Scope)
		for _, lib := range libraries {
			if strings.Contains(scope, lib) {
				t.Errorf("alloc at %#x scoped to a library's frame: %q", e.Addr, scope)
			}
		}
		l, ok := layerOf[int64(e.Addr)]
		if !ok {
			continue
		}
		if !strings.HasPrefix(scope, fmt.Sprintf("layer %d: forward modeling_llama.py:", l)) {
			t.Errorf("alloc at %#x in layer %d (%s): scope %q", e.Addr, l, e.Phase, scope)
		}
	}
	t.Logf("allocated by category: %v", cats)
	for _, want := range []snapshot.Category{snapshot.CategoryActivation, snapshot.CategoryTemporary, snapshot.CategoryGradient, snapshot.CategoryAutogradDetail} {
		if cats[want] == 0 {
			t.Errorf("no %s allocated: %v", want, cats)
		}
	}
	if cats[snapshot.CategoryUnknown] != 0 {
		t.Errorf("%d B allocated unknown", cats[snapshot.CategoryUnknown])
	}

	oomData, _ := qloraNotebook(t, layers, 2)
	s, err = torch.Import(oomData)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Events.All() {
		if e.Action == snapshot.ActionOOM {
			if got := s.String(e.Scope); got != "layer 2: forward modeling_llama.py:216" || e.Iteration != 0 || e.Phase != snapshot.PhaseForward {
				t.Errorf("OOM in iteration %d, %s, scope %q; want iteration 0, forward, layer 2: forward modeling_llama.py:216", e.Iteration, e.Phase, got)
			}
		}
	}
}

const modelingGPT2 = "/usr/lib/python3/dist-packages/transformers/models/gpt2/modeling_gpt2.py"

// gpt2Checkpointed returns the stack of an allocation of GPT-2's block (modeling_gpt2.py) with HF's
// gradient checkpointing, in a model torch.compile wrapped and runs eagerly: inner inside the block's
// module at modLine (0: the block's own), the block's forward at blockLine under nn.Module.__call__, which
// GradientCheckpointingLayer.__call__ (modeling_layers.py) runs through torch.utils.checkpoint (disabled for
// dynamo: torch/_compile.py, torch/_dynamo/eval_frame.py), from GPT2Model.forward's loop, GPT2LMHeadModel's
// forward under OptimizedModule's eval frames, and a training script.
func gpt2Checkpointed(inner []pyFrame, modLine, blockLine int) []pyFrame {
	const torch = "/usr/lib/python3/dist-packages/torch/"
	st := append(append([]pyFrame{}, mallocFrames...), inner...)
	if modLine != 0 {
		st = append(append(st, pyFrame{modelingGPT2, "forward", modLine}), callImpl...)
	}
	st = append(append(st, pyFrame{modelingGPT2, "forward", blockLine}), callImpl...)
	st = append(st,
		pyFrame{torch + "utils/checkpoint.py", "forward", 264},
		pyFrame{torch + "autograd/function.py", "apply", 575},
		pyFrame{torch + "utils/checkpoint.py", "checkpoint", 494},
		pyFrame{torch + "_compile.py", "inner", 32},
		pyFrame{torch + "_dynamo/eval_frame.py", "_fn", 632},
		pyFrame{"/usr/lib/python3/dist-packages/transformers/modeling_layers.py", "__call__", 83},
		pyFrame{modelingGPT2, "forward", 922})
	st = append(append(st, callImpl...), pyFrame{modelingGPT2, "forward", 1062},
		pyFrame{torch + "_dynamo/eval_frame.py", "_fn", 632}, pyFrame{torch + "_dynamo/eval_frame.py", "forward", 375})
	return append(append(st, callImpl...), pyFrame{"train.py", "main", 57}, pyFrame{"train.py", "<module>", 80})
}

// TestScopesThroughHFCheckpointing: GPT-2 with HF's gradient checkpointing in a compiled model, out of
// memory in its third block's MLP: every allocation of a block is scoped to GPT-2's own modules with the
// block's index, never to Conv1D, the activation, the checkpointing layer or torch.compile's frames, and
// so is the request: to the MLP's module, whichever of its lines asked.
func TestScopesThroughHFCheckpointing(t *testing.T) {
	const mb = 1 << 20
	conv1D := []pyFrame{{"/usr/lib/python3/dist-packages/transformers/pytorch_utils.py", "forward", 116}}
	conv1D = append(conv1D, callImpl...)
	gelu := []pyFrame{{"/usr/lib/python3/dist-packages/transformers/activations.py", "forward", 57}}
	gelu = append(gelu, callImpl...)
	b := newTraceBuilder()
	b.before(64 * mb)
	layerOf := map[int64]int{}
	for l := range 3 {
		note := func(a int64) int64 { layerOf[a] = l; return a }
		// GPT2Attention.forward (line 310 c_attn, 335 the attention, 345 c_proj) from GPT2Block.forward:404;
		// GPT2MLP.forward (line 362 c_fc, 363 the activation) from GPT2Block.forward:419.
		qkv := note(b.alloc(3*mb, gpt2Checkpointed(conv1D, 310, 404)))
		att := note(b.alloc(4*mb, gpt2Checkpointed([]pyFrame{{modelingGPT2, "eager_attention_forward", 58}}, 335, 404)))
		b.free(qkv, nil)
		note(b.alloc(mb, gpt2Checkpointed(conv1D, 345, 404)))
		b.free(att, nil)
		note(b.alloc(mb, gpt2Checkpointed(nil, 0, 406))) // the residual
		fc := gpt2Checkpointed(conv1D, 362, 419)
		note(b.alloc(4*mb, fc))
		act := gpt2Checkpointed(gelu, 363, 419)
		if l == 2 {
			b.oom(4*mb, act)
			break
		}
		note(b.alloc(4*mb, act))
	}
	s, err := torch.Import(b.json(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range s.Events.All() {
		scope := s.String(e.Scope)
		for _, lib := range []string{"pytorch_utils.py", "activations.py", "checkpoint.py", "modeling_layers.py", "eval_frame.py", "_compile.py"} {
			if strings.Contains(scope, lib) {
				t.Errorf("%s at %#x scoped to a library's frame: %q", e.Action, e.Addr, scope)
			}
		}
		if l, ok := layerOf[int64(e.Addr)]; ok && e.Action == snapshot.ActionAlloc && !strings.HasPrefix(scope, fmt.Sprintf("layer %d: forward modeling_gpt2.py:", l)) {
			t.Errorf("alloc at %#x in block %d: scope %q", e.Addr, l, scope)
		}
		// The MLP's module, at the lowest line of its forward that allocated (c_fc's, 362), though the request
		// came from the activation's line.
		if e.Action == snapshot.ActionOOM && (scope != "layer 2: forward modeling_gpt2.py:362" || e.Iteration != 0 || e.Phase != snapshot.PhaseForward) {
			t.Errorf("OOM in iteration %d, %s, scope %q; want iteration 0, forward, layer 2: forward modeling_gpt2.py:362", e.Iteration, e.Phase, scope)
		}
	}
}
