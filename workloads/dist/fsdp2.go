package dist

import (
	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// fsdp2 is PyTorch's fully_shard (FSDP2: torch/distributed/fsdp/_fully_shard/_fsdp_param.py,
// _fsdp_param_group.py, _fsdp_collectives.py and _fsdp_state.py, pytorch/pytorch@002a76fb), applied as
// torchtune's shard_model and accelerate do: to each repeated block, then to the model, whose remaining
// parameters form the root group. Under bf16 or fp16 it runs MixedPrecisionPolicy(param_dtype=half) with
// reduce_dtype unset (the gradients are reduced in param_dtype and cast back to the parameters' dtype).
//
//   - Each parameter is a DTensor sharded on dim 0 (Shard(0)): the rank keeps its chunk of
//     ceil(dim0/N) rows, padded to that many (_sharded_param_data), and the optimizer steps the unpadded
//     rows (sharded_param). Nothing is flattened across parameters.
//   - A group's pre-forward unshards it: the all-gather input is copied in on the all-gather copy-in stream
//     (a flat param_dtype copy of the shards under mixed precision, _get_param_all_gather_inputs) into a
//     flat all_gather_output of N times the shards, all-gathered on the all-gather stream; the default
//     stream waits for it and copies out into each parameter's padded unsharded tensor (all_gather_outputs,
//     allocated on the default stream). In forward the all_gather_output is kept until the next group's
//     copy-out (AllGatherState: the next copy-in must not write into it) and freed after the streams wait
//     for that copy-out; in backward it is freed at once. Resharding frees the unsharded tensors (default
//     stream: no record_stream).
//   - reshard_after_forward (default true, the root's false) frees them after each forward; pre-backward
//     unshards again and prefetches the group before it in post-forward order (_backward_prefetch).
//   - A group's post-backward collects its parameters' unsharded gradients, reshards, has the default
//     stream wait for the previous reduce-scatter and frees its input (ReduceScatterState), then
//     foreach_reduce: a flat reduce_scatter_input on the default stream (every gradient padded on dim 0 to a
//     multiple of N), the gradients freed, the reduce-scatter stream waits, allocates the output (its
//     sharded gradients, cast to the parameters' dtype in a new tensor when they differ) and reduce-scatters;
//     each sharded gradient is a view of it. The final callback has the default stream wait for the
//     reductions and frees the last reduce_scatter_input.
type fsdp2 struct {
	base
	n          int
	paramDType tensor.DType // MixedPrecisionPolicy's param_dtype: the half dtype under --amp, else none (F32)
	groups     []*fsdp2Group
	root       *fsdp2Group
	prefixes   []string
	groupOf    map[string]*fsdp2Group
	scopeGroup map[string]*fsdp2Group
	shards     []*nn.Parameter // the sharded parameters the optimizer steps
	opt        optim.Optimizer

	copyInStream, allGatherStream, reduceScatterStream int64

	agState        *tensor.Tensor // FSDPCommContext.all_gather_state: the last forward all-gather's output
	agStateEvent   allocator.Event
	rsState        *tensor.Tensor // FSDPCommContext.reduce_scatter_state: the last reduce-scatter's input
	rsStateEvent   allocator.Event
	postForwardSeq []*fsdp2Group // comm_ctx.post_forward_order
}

// fsdp2Param is one FSDPParam.
type fsdp2Param struct {
	p         *nn.Parameter  // the module's parameter: its data is the unsharded parameter while unsharded
	shape     []int          // the unsharded parameter's
	rows      int            // rows of the padded shard: ceil(dim0/N)
	shardEl   int            // elements of the padded shard
	padded    *tensor.Tensor // _sharded_param_data
	sharded   *nn.Parameter  // sharded_param: this rank's rows (none when the rank's chunk is empty)
	unsharded *tensor.Tensor // all_gather_outputs[0]: N padded shards, freed while sharded
	trainable bool
}

// fsdp2Group is one FSDPParamGroup.
type fsdp2Group struct {
	name        string // its module's path; "" for the root
	params      []*fsdp2Param
	unsharded   bool
	agOutput    *tensor.Tensor // _all_gather_result's output, from unshard to wait_for_unshard
	agEvent     allocator.Event
	reshardFwd  bool
	pending     int   // trainable parameters whose gradients this backward still owes
	pre         bool  // its pre-backward ran in this backward
	postForward []int // _post_forward_indices
	reduced     bool  // a post_reduce_event is outstanding
	reduceEvent allocator.Event
}

func (f *fsdp2) ParamDType(requested tensor.DType) tensor.DType { return requested }
func (f *fsdp2) Autocast() bool                                 { return true }

func (f *fsdp2) init() {
	if f.groupOf != nil {
		return
	}
	f.n = f.world()
	f.paramDType = halfOf(f.env.AMP)
	f.groupOf, f.scopeGroup = map[string]*fsdp2Group{}, map[string]*fsdp2Group{}
	f.copyInStream = f.newStream("fsdp2 all_gather_copy_in")
	f.allGatherStream = f.newStream("fsdp2 all_gather")
	f.reduceScatterStream = f.newStream("fsdp2 reduce_scatter")
}

// BuiltBlock applies fully_shard to the block at once, as the recipes do layer by layer.
func (f *fsdp2) BuiltBlock(block nn.Module) {
	f.init()
	if f.s.Wrap != WrapBlock {
		return
	}
	f.addGroup(block.Name(), block.Parameters())
}

func (f *fsdp2) Wrap(model nn.Module) {
	f.init()
	if f.s.Wrap == WrapBlock && len(f.groups) == 0 {
		for _, b := range nn.RepeatedBlocks(model) {
			f.addGroup(b.Name(), b.Parameters())
		}
	}
	in := map[*nn.Parameter]bool{}
	for _, g := range f.groups {
		for _, fp := range g.params {
			in[fp.p] = true
		}
	}
	var rest []*nn.Parameter
	for _, p := range model.Parameters() {
		if !in[p] {
			rest = append(rest, p)
		}
	}
	if len(rest) > 0 {
		f.root = f.makeGroup("", rest)
		f.root.reshardFwd = false // the root is kept for backward
		f.groupOf[""] = f.root    // modules in no block's group are the root's
	}
	for _, g := range f.all() {
		for _, fp := range g.params {
			if fp.trainable {
				fp.p.Tensor.OnGradAccumulated(func() { f.gradReady(g) })
				if fp.sharded != nil {
					f.shards = append(f.shards, fp.sharded)
				}
			}
		}
	}
	opt, err := optim.New(f.rt, f.shards, f.env.Optimizer)
	if err != nil {
		panic(err) // validated
	}
	f.opt = opt
	f.rt.SetScopeHook(f.scope)
}

// all returns the root group and the block groups.
func (f *fsdp2) all() []*fsdp2Group {
	if f.root == nil {
		return f.groups
	}
	return append([]*fsdp2Group{f.root}, f.groups...)
}

func (f *fsdp2) addGroup(name string, params []*nn.Parameter) {
	g := f.makeGroup(name, params)
	f.groups = append(f.groups, g)
	f.prefixes = append(f.prefixes, name)
	f.groupOf[name] = g
}

// makeGroup is fully_shard's FSDPParamGroup: each parameter sharded (FSDPParam._init_sharded_param) and
// its unsharded tensor made and freed.
func (f *fsdp2) makeGroup(name string, params []*nn.Parameter) *fsdp2Group {
	g := &fsdp2Group{name: name, reshardFwd: f.s.ReshardAfterForward == ReshardTrue}
	f.allocating(snapshot.CategoryParameter, "fsdp2", func() {
		for _, p := range params {
			g.params = append(g.params, f.shardParam(p))
		}
	})
	return g
}

// shardParam shards one parameter on dim 0: this rank's chunk (torch.chunk: ceil(dim0/N) rows each, the
// last chunks shorter or empty) copied into a padded shard of that many rows; the parameter's own storage
// goes, and its data becomes the unsharded tensor's (freed until the first all-gather).
func (f *fsdp2) shardParam(p *nn.Parameter) *fsdp2Param {
	t := p.Tensor
	fp := &fsdp2Param{p: p, shape: append([]int(nil), t.Shape()...), trainable: t.RequiresGrad()}
	dim0 := 1
	if len(fp.shape) > 0 {
		dim0 = fp.shape[0]
	}
	rest := t.Numel() / max(dim0, 1)
	fp.rows = int(ceilDiv(int64(dim0), int64(f.n)))
	fp.shardEl = fp.rows * rest
	dtype := t.DType()
	fp.padded = f.rt.Zeros(dtype, []int{fp.shardEl}, "fsdp2.sharded_param_data["+p.Name+"]", snapshot.CategoryParameter)
	if mine := min(fp.rows, max(dim0-f.s.Rank*fp.rows, 0)); mine > 0 {
		v := fp.padded.Narrow(0, 0, mine*rest)
		fp.sharded = &nn.Parameter{Name: p.Name, Tensor: v.SetName(p.Name).SetRequiresGrad(fp.trainable)}
	}
	unshardedDType := dtype
	if f.paramDType != tensor.F32 && dtype != f.paramDType && !p.Packed4Bit {
		unshardedDType = f.paramDType
	}
	fp.unsharded = f.rt.Empty(unshardedDType, []int{f.n * fp.shardEl}, "fsdp2.unsharded_param["+p.Name+"]")
	v := fp.unsharded.Narrow(0, 0, t.Numel())
	view := v.View(fp.shape...)
	v.Release()
	t.SetData(view)
	view.Release()
	fp.unsharded.FreeStorage()
	return fp
}

// unshard is FSDPParamGroup.unshard: the all-gather issued on the copy-in and all-gather streams.
func (f *fsdp2) unshard(g *fsdp2Group) {
	if g == nil || g.unsharded || g.agOutput != nil {
		return
	}
	label := g.label()
	f.allocating(snapshot.CategoryParameter, "fsdp2", func() {
		var total int
		for _, fp := range g.params {
			total += fp.shardEl
		}
		dtype := g.params[0].unsharded.DType()
		f.rt.OnStream(f.copyInStream, func() {
			var input *tensor.Tensor
			if dtype != g.params[0].padded.DType() { // foreach copy of the shards in param_dtype
				input = f.rt.Empty(dtype, []int{total}, "fsdp2.all_gather_input["+label+"]")
			}
			g.agOutput = f.rt.Empty(dtype, []int{f.n * total}, "fsdp2.all_gather_output["+label+"]")
			input.Release()
		})
		f.waitStream(f.allGatherStream, f.copyInStream)
		f.rt.OnStream(f.allGatherStream, func() {
			f.launch(f.allGatherStream)
			f.comm.record(AllGather, int64(f.n*total*dtype.Size()), f.n, "fsdp2 group "+label)
		})
		g.agEvent = f.recordEvent(f.allGatherStream)
	})
}

// waitForUnshard is FSDPParamGroup.wait_for_unshard: the copy-out on the default stream into each
// parameter's unsharded tensor, the all-gather output kept to the next copy-out in forward, freed in
// backward.
func (f *fsdp2) waitForUnshard(g *fsdp2Group, forward bool) {
	if g == nil || g.agOutput == nil {
		return
	}
	if forward {
		f.flushAllGatherState()
	}
	f.allocating(snapshot.CategoryParameter, "fsdp2", func() {
		f.waitEvent(f.current(), g.agEvent)
		for _, fp := range g.params {
			fp.unsharded.AllocStorage()
		}
	})
	g.unsharded = true
	done := f.recordEvent(f.current())
	if forward {
		f.agState, f.agStateEvent = g.agOutput, done
	} else {
		f.waitEvent(f.copyInStream, done)
		f.waitEvent(f.allGatherStream, done)
		g.agOutput.Release()
	}
	g.agOutput = nil
}

// flushAllGatherState frees the all-gather output kept from the last forward copy-out, once the all-gather
// streams wait for that copy-out.
func (f *fsdp2) flushAllGatherState() {
	if f.agState == nil {
		return
	}
	f.waitEvent(f.copyInStream, f.agStateEvent)
	f.waitEvent(f.allGatherStream, f.agStateEvent)
	f.agState.Release()
	f.agState = nil
}

// reshard frees the group's unsharded parameters (FSDPParam.to_sharded: free_storage).
func (f *fsdp2) reshard(g *fsdp2Group) {
	if g == nil || !g.unsharded {
		return
	}
	for _, fp := range g.params {
		fp.unsharded.FreeStorage()
	}
	g.unsharded = false
}

func (g *fsdp2Group) label() string {
	if g.name == "" {
		return "root"
	}
	return g.name
}

func (f *fsdp2) BeginForward(iteration int, sync bool) {
	f.iteration, f.sync = iteration, sync
	f.postForwardSeq = f.postForwardSeq[:0]
	for _, g := range f.all() {
		g.pre, g.pending, g.postForward = false, 0, g.postForward[:0]
		for _, fp := range g.params {
			if fp.trainable {
				g.pending++
			}
		}
	}
	f.preForward(f.root)
}

func (f *fsdp2) preForward(g *fsdp2Group) {
	f.unshard(g)
	f.waitForUnshard(g, true)
}

func (f *fsdp2) postForward(g *fsdp2Group) {
	if g.reshardFwd {
		f.reshard(g)
	}
	g.postForward = append(g.postForward, len(f.postForwardSeq))
	f.postForwardSeq = append(f.postForwardSeq, g)
}

// scope is fully_shard's module hooks seen through the runtime's scopes.
func (f *fsdp2) scope(path string, enter bool) {
	phase := f.rt.Phase()
	if phase == snapshot.PhaseSetup || len(f.groups) == 0 {
		return
	}
	g, seen := f.scopeGroup[path]
	if !seen {
		g = f.groupOf[unitPrefix(path, f.prefixes)]
		f.scopeGroup[path] = g
	}
	if g == nil {
		return
	}
	switch phase {
	case snapshot.PhaseBackward, snapshot.PhaseRecompute:
		if enter && !g.pre {
			f.preBackward(g)
		}
	default:
		if path != g.name {
			return
		}
		if enter {
			f.preForward(g)
		} else {
			f.postForward(g)
		}
	}
}

// preBackward is FSDPParamGroup.pre_backward: the group unsharded (the root's post-forward having freed the
// last forward all-gather output), and the group before it in post-forward order prefetched. A group that
// trains nothing gets no gradient to end its backward; its post-backward runs when backward moves on.
func (f *fsdp2) preBackward(g *fsdp2Group) {
	f.flushAllGatherState()
	for _, o := range f.all() {
		if o != g && o.pre && o.unsharded && !o.trains() {
			f.postBackward(o)
		}
	}
	g.pre = true
	f.unshard(g)
	f.waitForUnshard(g, false)
	if n := len(g.postForward); n > 0 {
		i := g.postForward[n-1]
		g.postForward = g.postForward[:n-1]
		if i > 0 {
			f.unshard(f.postForwardSeq[i-1])
		}
	}
}

func (g *fsdp2Group) trains() bool {
	for _, fp := range g.params {
		if fp.trainable {
			return true
		}
	}
	return false
}

// gradReady counts a group's gradients in; the last one runs its post-backward.
func (f *fsdp2) gradReady(g *fsdp2Group) {
	if g.pending--; g.pending == 0 {
		f.postBackward(g)
	}
}

// postBackward is FSDPParamGroup.post_backward: reshard, then (when gradients are synchronized)
// foreach_reduce of the group's gradients.
func (f *fsdp2) postBackward(g *fsdp2Group) {
	var with []*fsdp2Param
	if f.sync {
		for _, fp := range g.params {
			if fp.trainable && fp.p.Tensor.Grad() != nil {
				with = append(with, fp)
			}
		}
	}
	f.reshard(g) // reshard_after_backward
	if len(with) == 0 {
		return
	}
	if f.rsState != nil {
		f.waitEvent(f.current(), f.rsStateEvent)
		f.rsState.Release()
		f.rsState = nil
	}
	f.allocating(snapshot.CategoryGradient, "fsdp2", func() { f.reduce(g, with) })
}

// reduce is foreach_reduce.
func (f *fsdp2) reduce(g *fsdp2Group, with []*fsdp2Param) {
	label := g.label()
	var total int
	for _, fp := range with {
		total += fp.shardEl
	}
	gradDType := with[0].p.Tensor.Grad().DType()
	input := f.rt.Empty(gradDType, []int{f.n * total}, "fsdp2.reduce_scatter_input["+label+"]")
	for _, fp := range with { // chunk_cat into the input; the unsharded gradients go
		fp.p.Tensor.SetGrad(nil)
	}
	f.waitStream(f.reduceScatterStream, f.current())
	f.rt.OnStream(f.reduceScatterStream, func() {
		out := f.rt.Empty(gradDType, []int{total}, "fsdp2.reduce_scatter_output["+label+"]")
		f.launch(f.reduceScatterStream)
		f.comm.record(ReduceScatter, int64(f.n*total*gradDType.Size()), f.n, "fsdp2 group "+label)
		f.rsStateEvent = f.recordEvent(f.reduceScatterStream)
		if orig := with[0].padded.DType(); orig != gradDType { // _to_dtype_if_needed
			c := tensor.ToDType(out, orig)
			out.Release()
			out = c
		}
		off := 0
		for _, fp := range with {
			if fp.sharded != nil {
				v := out.Narrow(0, off, fp.sharded.Tensor.Numel())
				if gr := fp.sharded.Tensor.Grad(); gr != nil {
					tensor.AddScaled_(gr, v, 1)
					v.Release()
				} else {
					fp.sharded.Tensor.SetGrad(v)
				}
			}
			off += fp.shardEl
		}
		out.Release()
		g.reduced, g.reduceEvent = true, f.recordEvent(f.reduceScatterStream)
	})
	f.rsState = input
}

func (f *fsdp2) EndBackward() {
	// _root_post_backward_final_callback: groups still unsharded run their post-backward; the default
	// stream waits for every reduction (finalize_backward) and the last reduce-scatter, whose input goes.
	for _, g := range f.all() {
		if g.unsharded || g.pending > 0 {
			g.pending = 0
			f.postBackward(g)
		}
		if g.reduced {
			f.waitEvent(f.current(), g.reduceEvent)
			g.reduced = false
		}
	}
	if f.rsState != nil {
		f.waitEvent(f.current(), f.rsStateEvent)
		f.rsState.Release()
		f.rsState = nil
	}
}

func (f *fsdp2) Step(scaler *optim.GradScaler) {
	if scaler != nil {
		scaler.Step(f.opt, f.shards)
		scaler.Update()
	} else {
		f.opt.Step()
	}
	f.endStep()
}

func (f *fsdp2) ZeroGrad(setToNone bool) { f.opt.ZeroGrad(setToNone) }
