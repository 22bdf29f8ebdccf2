package snapshottest

import (
	"github.com/oomdbg/oomdbg/snapshot"
)

// Go-like frames of the workload, as the recorder would capture them (allocator internals skipped). Each stack
// is built outermost first here and interned innermost first.
type frame struct {
	fn   string
	file string
	line int
}

const mod = "github.com/oomdbg/oomdbg/"

var (
	outerFrames = []frame{
		{"runtime.goexit", "runtime/asm_amd64.s", 1700},
		{"main.main", mod + "main.go", 12},
		{"github.com/spf13/cobra.(*Command).Execute", "github.com/spf13/cobra/command.go", 1071},
		{"github.com/spf13/cobra.(*Command).ExecuteC", "github.com/spf13/cobra/command.go", 1115},
		{"github.com/spf13/cobra.(*Command).execute", "github.com/spf13/cobra/command.go", 1015},
		{mod + "cmd/oomdbg.runRun", mod + "cmd/oomdbg/run.go", 88},
		{mod + "workloads.Run", mod + "workloads/run.go", 54},
		{mod + "workloads.(*Loop).Train", mod + "workloads/loop.go", 131},
	}
	phaseFrames = map[snapshot.Phase][]frame{
		snapshot.PhaseSetup: {
			{mod + "workloads.(*Loop).setup", mod + "workloads/loop.go", 77},
			{mod + "workloads/nn.NewGPT", mod + "workloads/nn/gpt.go", 41},
		},
		snapshot.PhaseData: {
			{mod + "workloads.(*Loop).step", mod + "workloads/loop.go", 160},
			{mod + "workloads.(*Batches).Next", mod + "workloads/data.go", 63},
			{mod + "workloads/tensor.FromInt64", mod + "workloads/tensor/tensor.go", 112},
		},
		snapshot.PhaseForward: {
			{mod + "workloads.(*Loop).step", mod + "workloads/loop.go", 164},
			{mod + "workloads/nn.(*GPT).Loss", mod + "workloads/nn/gpt.go", 118},
			{mod + "workloads/nn.(*GPT).Forward", mod + "workloads/nn/gpt.go", 97},
		},
		snapshot.PhaseBackward: {
			{mod + "workloads.(*Loop).step", mod + "workloads/loop.go", 166},
			{mod + "workloads/tensor.(*Tensor).Backward", mod + "workloads/tensor/autograd.go", 58},
			{mod + "workloads/tensor.(*engine).run", mod + "workloads/tensor/autograd.go", 131},
			{mod + "workloads/tensor.(*engine).apply", mod + "workloads/tensor/autograd.go", 174},
		},
		snapshot.PhaseOptimizer: {
			{mod + "workloads.(*Loop).step", mod + "workloads/loop.go", 170},
			{mod + "workloads/optim.(*AdamW).Step", mod + "workloads/optim/adamw.go", 66},
			{mod + "workloads/optim.foreachUpdate", mod + "workloads/optim/foreach.go", 29},
		},
		snapshot.PhaseZeroGrad: {
			{mod + "workloads.(*Loop).step", mod + "workloads/loop.go", 173},
			{mod + "workloads/optim.(*AdamW).ZeroGrad", mod + "workloads/optim/adamw.go", 121},
		},
	}
	// Module frames, by the module kind an op runs in.
	moduleFrames = map[string][]frame{
		"gpt":  {},
		"emb":  {{mod + "workloads/nn.(*Embedding).Forward", mod + "workloads/nn/embedding.go", 33}},
		"attn": {{mod + "workloads/nn.(*Block).Forward", mod + "workloads/nn/block.go", 47}, {mod + "workloads/nn.(*CausalSelfAttention).Forward", mod + "workloads/nn/attention.go", 71}},
		"mlp":  {{mod + "workloads/nn.(*Block).Forward", mod + "workloads/nn/block.go", 49}, {mod + "workloads/nn.(*MLP).Forward", mod + "workloads/nn/mlp.go", 38}},
		"ln":   {{mod + "workloads/nn.(*Block).Forward", mod + "workloads/nn/block.go", 46}, {mod + "workloads/nn.(*LayerNorm).Forward", mod + "workloads/nn/layernorm.go", 29}},
		"head": {{mod + "workloads/nn.(*Linear).Forward", mod + "workloads/nn/linear.go", 40}},
		"loss": {{mod + "workloads/nn.CrossEntropy", mod + "workloads/nn/loss.go", 22}},
	}
	// Op frames, innermost last: where the tensor is made.
	opFrames = map[string][]frame{
		"linear":      {{mod + "workloads/nn.(*Linear).Forward", mod + "workloads/nn/linear.go", 44}, {mod + "workloads/tensor.Linear", mod + "workloads/tensor/linalg.go", 203}, {mod + "workloads/tensor.MatMul", mod + "workloads/tensor/linalg.go", 87}},
		"matmul":      {{mod + "workloads/tensor.MatMul", mod + "workloads/tensor/linalg.go", 91}},
		"mul":         {{mod + "workloads/tensor.(*Tensor).MulScalar", mod + "workloads/tensor/elementwise.go", 140}},
		"masked_fill": {{mod + "workloads/tensor.(*Tensor).MaskedFill", mod + "workloads/tensor/index.go", 58}},
		"softmax":     {{mod + "workloads/tensor.Softmax", mod + "workloads/tensor/reduce.go", 211}},
		"log_softmax": {{mod + "workloads/tensor.LogSoftmax", mod + "workloads/tensor/reduce.go", 248}},
		"nll":         {{mod + "workloads/tensor.NLLLoss", mod + "workloads/tensor/loss.go", 31}},
		"dropout":     {{mod + "workloads/nn.(*Dropout).Forward", mod + "workloads/nn/dropout.go", 27}, {mod + "workloads/tensor.Dropout", mod + "workloads/tensor/random.go", 64}},
		"contiguous":  {{mod + "workloads/tensor.(*Tensor).Contiguous", mod + "workloads/tensor/view.go", 176}},
		"add":         {{mod + "workloads/tensor.Add", mod + "workloads/tensor/elementwise.go", 35}},
		"gelu":        {{mod + "workloads/nn.(*GELU).Forward", mod + "workloads/nn/activation.go", 19}, {mod + "workloads/tensor.GELU", mod + "workloads/tensor/activation.go", 44}},
		"layernorm":   {{mod + "workloads/tensor.LayerNorm", mod + "workloads/tensor/norm.go", 52}},
		"embedding":   {{mod + "workloads/tensor.Embedding", mod + "workloads/tensor/index.go", 17}},
		"param":       {{mod + "workloads/nn.newParameter", mod + "workloads/nn/module.go", 88}, {mod + "workloads/tensor.Randn", mod + "workloads/tensor/random.go", 23}},
		"grad":        {{mod + "workloads/tensor.(*node).backward", mod + "workloads/tensor/autograd.go", 212}, {mod + "workloads/tensor.gradOf", mod + "workloads/tensor/grad.go", 75}},
		"accumulate":  {{mod + "workloads/tensor.(*Tensor).accumulateGrad", mod + "workloads/tensor/autograd.go", 251}, {mod + "workloads/tensor.ZerosLike", mod + "workloads/tensor/tensor.go", 140}},
		"adam_state":  {{mod + "workloads/optim.(*AdamW).initState", mod + "workloads/optim/adamw.go", 102}, {mod + "workloads/tensor.ZerosLike", mod + "workloads/tensor/tensor.go", 140}},
		"foreach":     {{mod + "workloads/tensor.ForeachSqrt", mod + "workloads/tensor/foreach.go", 61}},
		"input":       {},
		"release":     {{mod + "workloads/tensor.(*Tensor).Release", mod + "workloads/tensor/tensor.go", 301}, {mod + "workloads/tensor.(*storage).decRef", mod + "workloads/tensor/storage.go", 48}},
	}
	// The innermost frames every allocation goes through before the allocator.
	allocFrames = []frame{
		{mod + "workloads/tensor.newTensor", mod + "workloads/tensor/tensor.go", 71},
		{mod + "workloads/tensor.newStorage", mod + "workloads/tensor/storage.go", 22},
		{mod + "workloads/device.(*Meta).Alloc", mod + "workloads/device/meta.go", 35},
	}
)

// stacks interns stacks by a (phase, module kind, op) site key.
type stacks struct {
	s    Sink
	ids  map[stackKey]snapshot.StackID
	tmp  []frame
	fids []snapshot.FrameID
}

type stackKey struct {
	phase  snapshot.Phase
	module string
	op     string
}

func newStacks(s Sink) *stacks { return &stacks{s: s, ids: make(map[stackKey]snapshot.StackID)} }

// get returns the stack of an allocation (or, for op "release", a free) made by op in a module during phase.
func (st *stacks) get(phase snapshot.Phase, module, op string) snapshot.StackID {
	k := stackKey{phase, module, op}
	if id, ok := st.ids[k]; ok {
		return id
	}
	st.tmp = append(st.tmp[:0], outerFrames...)
	st.tmp = append(st.tmp, phaseFrames[phase]...)
	if phase == snapshot.PhaseForward || phase == snapshot.PhaseBackward && op != "release" {
		st.tmp = append(st.tmp, moduleFrames[module]...)
	}
	st.tmp = append(st.tmp, opFrames[op]...)
	if op != "release" {
		st.tmp = append(st.tmp, allocFrames...)
	}
	st.fids = st.fids[:0]
	for i := len(st.tmp) - 1; i >= 0; i-- {
		f := st.tmp[i]
		st.fids = append(st.fids, st.s.InternFrame(f.fn, f.file, f.line))
	}
	id := st.s.InternStack(st.fids)
	st.ids[k] = id
	return id
}
