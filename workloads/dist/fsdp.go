package dist

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// fsdp is PyTorch's FullyShardedDataParallel with use_orig_params=False (torch/distributed/fsdp/
// _flat_param.py, _runtime_utils.py, _limiter_utils.py), its defaults (limit_all_gathers=True,
// backward_prefetch=BACKWARD_PRE, forward_prefetch=False) and, under bf16 or fp16, MixedPrecision with
// param_dtype and reduce_dtype the half dtype (what accelerate and HF Trainer set for FSDP with --bf16):
//
//   - Each unit (a repeated block under --fsdp-wrap block, the rest of the model as the root unit; or the
//     whole model) flattens its parameters into one FlatParameter. Each rank keeps its shard, ceil(numel/N)
//     elements (torch.chunk, the last shards padded), as _local_shard; the parameters become views of
//     _full_param_padded, N shards long, whose memory is freed while the unit is sharded (_free_storage).
//   - A unit is unsharded (its padded buffer allocated and all-gathered, through a low-precision shard
//     _mp_shard under mixed precision) in its pre-forward and pre-backward. Its post-forward reshards it
//     (FULL_SHARD, HYBRID_SHARD) or keeps it to backward (SHARD_GRAD_OP); the root unit is never resharded
//     after forward. With limit_all_gathers the CPU runs at most two all-gathers ahead, so memory holds the
//     unit computing and the next one: a pre-forward gathers the next unit too, and BACKWARD_PRE prefetching
//     gathers the previous one in each pre-backward.
//   - A unit's post-backward (its parameters' gradients all in) concatenates them into an unsharded flat
//     gradient, reduce-scatters it into a new sharded gradient (cast to the parameters' dtype under mixed
//     precision), frees the unsharded one, reshards the unit, and accumulates the shard into the
//     FlatParameter's gradient. HYBRID_SHARD all-reduces the shard across nodes.
//   - The optimizer (torch.optim, as the loop asked) steps the shards: 16 bytes a parameter over N ranks with
//     Adam.
//   - With CPUOffload(offload_params=True) the shards live in pinned host memory with a pinned gradient
//     shard (_cpu_grad) each; a shard is copied to the GPU for every all-gather, every reduced gradient to the
//     host, and the optimizer steps on the host.
//
// Streams (_init_streams): the low-precision (or offloaded) shard is made on the pre_unshard stream, the
// padded unsharded parameter on the unshard stream, whose all-gather the default stream waits for
// (_pre_forward_unshard, _pre_backward_hook); resharding frees it after record_stream on the default stream
// (_free_unsharded_flat_param), so its memory comes back only once the default stream's work has run past
// the free. The rate limiter keeps the free events of the last two reshards and, before a third all-gather,
// waits for the oldest (_FreeEventQueue, _limiter_utils.py). Gradients are reduced on the post_backward
// stream, which waits for the default stream; the unsharded gradient, made on the default stream, is
// recorded on it before it is freed. The final callback has the default stream wait for post_backward.
// Under Settings.OneStream all of this is one stream, and, as oomdbg modelled it before streams, a unit's
// pre-forward gathers the next unit too, standing for the CPU running one all-gather ahead.
type fsdp struct {
	base
	n        int          // ranks sharing a unit: the world, or one node's for HYBRID_SHARD
	dtype    tensor.DType // the unsharded parameters' dtype: the half dtype under mixed precision
	units    []*fsdpUnit  // the block units in forward order
	adapters []*fsdpUnit  // LoRA adapters' units, nested in their blocks'
	// postOrder is the units in post-forward order, recorded in the first forward (_exec_order_data's
	// handles_post_forward_order): backward prefetching gathers the unit before the current one in it.
	postOrder []*fsdpUnit
	root      *fsdpUnit
	prefixes  []string
	unitOf    map[string]*fsdpUnit
	// scopeUnit caches the unit of every module scope seen (nil: the root's or none).
	scopeUnit map[string]*fsdpUnit
	shards    []*nn.Parameter // the FlatParameters' shards, as the optimizer sees them
	opt       optim.Optimizer
	host      *tensor.Runtime

	unshardStream, preUnshardStream, postBackwardStream int64
	freeEvents                                          []allocator.Event // _free_event_queue, oldest first
}

// maxInflightAllGathers is _FreeEventQueue's _max_num_inflight_all_gathers (torch/distributed/fsdp/
// _limiter_utils.py): "empirically chosen".
const maxInflightAllGathers = 2

// fsdpUnit is one FlatParamHandle.
type fsdpUnit struct {
	name      string // its module's path; "" for the root
	index     int    // its place in forward order among the block units (-1: the root or an adapter)
	postIndex int    // its place in post-forward order (-1: not yet known)
	params    []*nn.Parameter
	numel     int
	shard     int            // elements of each rank's shard
	local     *tensor.Tensor // _local_shard (GPU, or pinned host memory when offloaded)
	flat      *nn.Parameter  // the FlatParameter as the optimizer steps it: its tensor is the local shard
	full      *tensor.Tensor // _full_param_padded: the all-gather's destination, freed while sharded
	cpuGrad   *tensor.Tensor // offload: _cpu_grad
	unsharded bool
	pending   int            // trainable parameters whose gradients this backward still owes
	pre       bool           // its pre-backward ran in this backward
	noSync    *tensor.Tensor // the unsharded gradient accumulated over no_sync micro-batches
	trainable bool
}

func (f *fsdp) ParamDType(requested tensor.DType) tensor.DType { return requested }
func (f *fsdp) Autocast() bool                                 { return true }
func (f *fsdp) offloaded() bool                                { return f.s.Offload != OffloadNone }

// reshardAfterForward is RESHARD_AFTER_FORWARD_HANDLE_STRATEGIES: FULL_SHARD and HYBRID_SHARD.
func (f *fsdp) reshardAfterForward() bool { return f.s.Strategy != FSDPGradOp }

func (f *fsdp) init() {
	if f.unitOf != nil {
		return
	}
	f.n = f.s.ShardGroup()
	f.dtype = halfOf(f.env.AMP)
	f.unitOf, f.scopeUnit = map[string]*fsdpUnit{}, map[string]*fsdpUnit{}
	f.host = f.env.Host
	f.unshardStream = f.newStream("fsdp unshard")
	f.postBackwardStream = f.newStream("fsdp post_backward")
	f.preUnshardStream = f.newStream("fsdp pre_unshard")
}

// BuiltBlock makes the block a unit at once: FSDP's auto-wrap moves and shards one unit at a time.
// With LoRA, peft's fsdp_auto_wrap_policy (what llama-recipes, Answer.AI's fsdp_qlora and accelerate use
// with use_orig_params=False) also makes each adapter (lora_A, lora_B: a leaf module with a trainable
// weight) a unit of its own, nested in its block's, so that every FlatParameter is all frozen or all
// trained.
func (f *fsdp) BuiltBlock(block nn.Module) {
	f.init()
	if f.s.Wrap != WrapBlock {
		return
	}
	f.addBlock(block.Name(), block.Parameters())
}

// addBlock makes a block's units: its adapters', then its own of the rest.
func (f *fsdp) addBlock(name string, params []*nn.Parameter) {
	f.quantStorage(params)
	if !peftFrozen(params) {
		f.addUnit(name, params)
		return
	}
	var rest []*nn.Parameter
	byModule := map[string][]*nn.Parameter{}
	var modules []string
	for _, p := range params {
		if !nn.IsAdapter(p.Name) {
			rest = append(rest, p)
			continue
		}
		m := p.Name[:strings.LastIndexByte(p.Name, '.')]
		if byModule[m] == nil {
			modules = append(modules, m)
		}
		byModule[m] = append(byModule[m], p)
	}
	for _, m := range modules {
		u := f.makeUnit(m, -1, byModule[m], true)
		f.adapters = append(f.adapters, u)
		f.prefixes = append(f.prefixes, m)
		f.unitOf[m] = u
	}
	f.addUnit(name, rest, true)
}

func (f *fsdp) Wrap(model nn.Module) {
	f.init()
	if f.s.Wrap == WrapBlock && len(f.units) == 0 { // a model built without a hook (the MLP)
		for _, b := range nn.RepeatedBlocks(model) {
			f.addBlock(b.Name(), b.Parameters())
		}
	}
	inUnit := map[*nn.Parameter]bool{}
	for _, u := range f.blockUnits() {
		for _, p := range u.params {
			inUnit[p] = true
		}
	}
	var rest []*nn.Parameter
	for _, p := range model.Parameters() {
		if !inUnit[p] {
			rest = append(rest, p)
		}
	}
	if len(rest) > 0 {
		f.quantStorage(rest)
		f.root = f.makeUnit("", -1, rest, false)
		f.unitOf[""] = f.root // modules in no block's unit are the root's
	}
	for _, u := range f.all() {
		for _, p := range u.params {
			if p.Tensor.RequiresGrad() {
				p.Tensor.OnGradAccumulated(func() { f.gradReady(u) })
			}
		}
		if u.trainable {
			f.shards = append(f.shards, u.flat)
		}
	}
	rt := f.rt
	if f.offloaded() {
		rt = f.host
	}
	cfg := f.env.Optimizer
	if f.offloaded() && (cfg.Kind == knob.Adam || cfg.Kind == knob.AdamW) && cfg.Impl == "" {
		cfg.Impl = knob.ForLoop // torch.optim's default on CPU tensors: neither foreach nor fused
	}
	opt, err := optim.New(rt, f.shards, cfg)
	if err != nil {
		panic(err) // validated
	}
	f.opt = opt
	f.rt.SetScopeHook(f.scope)
}

func (f *fsdp) addUnit(name string, params []*nn.Parameter, peft ...bool) {
	u := f.makeUnit(name, len(f.units), params, len(peft) > 0 && peft[0])
	f.units = append(f.units, u)
	f.prefixes = append(f.prefixes, name)
	f.unitOf[name] = u
}

// blockUnits returns the block units and the adapters'.
func (f *fsdp) blockUnits() []*fsdpUnit {
	return append(append([]*fsdpUnit(nil), f.units...), f.adapters...)
}

// all returns every unit: the root (if any), the blocks', the adapters'.
func (f *fsdp) all() []*fsdpUnit {
	if f.root == nil {
		return f.blockUnits()
	}
	return append([]*fsdpUnit{f.root}, f.blockUnits()...)
}

// makeUnit is FlatParamHandle's construction, shard() and _init_flat_param_attributes for params; peft
// says the block holds adapters, so that only they train.
func (f *fsdp) makeUnit(name string, index int, params []*nn.Parameter, peft bool) *fsdpUnit {
	u := &fsdpUnit{name: name, index: index, postIndex: -1, params: params}
	label := name
	if label == "" {
		label = "root"
	}
	for _, p := range params {
		u.numel += p.Tensor.Numel()
		u.trainable = u.trainable || trainsUnder(p, peft)
	}
	u.shard = int(ceilDiv(int64(u.numel), int64(f.n)))
	dtype := params[0].Tensor.DType()
	unsharded := dtype
	if f.dtype != tensor.F32 {
		unsharded = f.dtype
	}
	f.allocating(snapshot.CategoryParameter, "fsdp", func() {
		// flatten_tensors: the parameters concatenated (and viewed from the flat tensor), then the rank's
		// chunk cloned and padded (_get_shard); the flat tensor and the original storages go.
		flat := f.rt.Empty(dtype, []int{u.numel}, "fsdp.flat_param["+label+"]")
		off := 0
		for _, p := range params {
			v := flatView(flat, off, p.Tensor.Numel(), p.Tensor.Shape())
			tensor.Copy_(v, p.Tensor)
			p.Tensor.SetData(v)
			v.Release()
			off += p.Tensor.Numel()
		}
		if f.offloaded() {
			hostAllocating(f.host, snapshot.CategoryParameter, func() {
				f.host.Pinned(func() { // _local_shard.pin_memory()
					u.local = f.host.Zeros(dtype, []int{u.shard}, "fsdp.local_shard["+label+"]", snapshot.CategoryParameter)
				})
				f.host.Pinned(func() {
					u.cpuGrad = f.host.Zeros(dtype, []int{u.shard}, "fsdp.cpu_grad["+label+"]", snapshot.CategoryGradient)
				})
			})
			f.comm.record(DeviceToHost, int64(u.shard*dtype.Size()), 0, "fsdp shard "+label+" to host")
		} else {
			u.local = f.rt.Zeros(dtype, []int{u.shard}, "fsdp.local_shard["+label+"]", snapshot.CategoryParameter)
		}
		u.local.SetRequiresGrad(u.trainable)
		u.flat = &nn.Parameter{Name: label + ".flat_param", Tensor: u.local.SetName(label + ".flat_param")}
		// _full_param_padded: allocated and its storage freed at once; the parameters become its views.
		u.full = f.rt.Empty(unsharded, []int{f.n * u.shard}, "fsdp.unsharded["+label+"]")
		off = 0
		for _, p := range params {
			v := flatView(u.full, off, p.Tensor.Numel(), p.Tensor.Shape())
			p.Tensor.SetData(v)
			v.Release()
			off += p.Tensor.Numel()
		}
		u.full.FreeStorage()
		flat.Release()
	})
	return u
}

// unshard is _unshard: the unit's padded buffer allocated on the unshard stream and all-gathered into, from
// a shard on the GPU (its low-precision copy under mixed precision, or the host shard copied over when
// offloaded, made on the pre_unshard stream), after the rate limiter lets it.
func (f *fsdp) unshard(u *fsdpUnit) {
	if u == nil || u.unsharded {
		return
	}
	label := u.label()
	f.allocating(snapshot.CategoryParameter, "fsdp", func() {
		var staged *tensor.Tensor
		if f.offloaded() || f.dtype != tensor.F32 { // pre_unshard: _use_low_precision_shard
			f.rt.OnStream(f.preUnshardStream, func() {
				staged = f.rt.Empty(u.full.DType(), []int{u.shard}, "fsdp.mp_shard["+label+"]")
			})
			if f.offloaded() {
				f.comm.record(HostToDevice, int64(u.shard*u.local.DType().Size()), 0, "fsdp shard "+label+" to the GPU")
			}
			f.waitStream(f.unshardStream, f.preUnshardStream)
		}
		if len(f.freeEvents) >= maxInflightAllGathers { // limit_all_gathers: dequeue_if_needed
			ev := f.freeEvents[0]
			f.freeEvents = f.freeEvents[1:]
			f.synchronizeEvent(ev)
		}
		f.rt.OnStream(f.unshardStream, func() {
			u.full.AllocStorage()
			f.launch(f.unshardStream)
			f.comm.record(AllGather, int64(f.n*u.shard*u.full.DType().Size()), f.n, "fsdp unit "+label)
			if staged != nil { // _free_low_precision_sharded_param
				staged.RecordStream(f.unshardStream)
				staged.Release()
			}
		})
	})
	u.unsharded = true
}

// unshardForCompute is _pre_forward_unshard's and _pre_backward_hook's unshard: the default stream then waits
// for the all-gather.
func (f *fsdp) unshardForCompute(u *fsdpUnit) {
	f.unshard(u)
	f.waitStream(f.current(), f.unshardStream)
}

// reshard frees the unit's padded buffer once the default stream's work so far has run
// (_free_unsharded_flat_param), and queues the free's event for the rate limiter.
func (f *fsdp) reshard(u *fsdpUnit) {
	if u == nil || !u.unsharded {
		return
	}
	u.full.RecordStream(f.current())
	u.full.FreeStorage()
	u.unsharded = false
	f.freeEvents = append(f.freeEvents, f.recordEvent(f.current()))
}

func (u *fsdpUnit) label() string {
	if u.name == "" {
		return "root"
	}
	return u.name
}

// next returns the block unit step places after u in forward order, or nil (the early all-gather of
// --one-stream).
func (f *fsdp) next(u *fsdpUnit, step int) *fsdpUnit {
	i := u.index + step
	if u.index < 0 || i < 0 || i >= len(f.units) {
		return nil
	}
	return f.units[i]
}

// prefetchTarget is get_handle_to_backward_prefetch: the unit before u in post-forward order. The root's
// forward ends last.
func (f *fsdp) prefetchTarget(u *fsdpUnit) *fsdpUnit {
	if u == f.root && u.postIndex < 0 {
		u.postIndex = len(f.postOrder)
		f.postOrder = append(f.postOrder, u)
	}
	if u.postIndex <= 0 {
		return nil
	}
	return f.postOrder[u.postIndex-1]
}

func (f *fsdp) BeginForward(iteration int, sync bool) {
	f.iteration, f.sync = iteration, sync
	for _, u := range f.all() {
		u.pre = false
		u.pending = 0
		for _, p := range u.params {
			if p.Tensor.RequiresGrad() {
				u.pending++
			}
		}
	}
	// _root_pre_forward: the side streams wait for the default stream (_wait_for_computation_stream); then
	// the root unit's pre-forward.
	f.waitStream(f.unshardStream, f.current())
	f.waitStream(f.preUnshardStream, f.current())
	f.unshardForCompute(f.root)
}

// scope is FSDP's module hooks, seen through the runtime's scopes: a unit's pre- and post-forward around its
// block's forward, its pre-backward when backward first reaches it (through a recomputed forward under
// checkpointing).
func (f *fsdp) scope(path string, enter bool) {
	phase := f.rt.Phase()
	if phase == snapshot.PhaseSetup || len(f.units) == 0 {
		return
	}
	u, seen := f.scopeUnit[path]
	if !seen { // scopes repeat every step: find each one's unit once
		u = f.unitOf[unitPrefix(path, f.prefixes)]
		f.scopeUnit[path] = u
	}
	if u == nil {
		return
	}
	switch phase {
	case snapshot.PhaseBackward, snapshot.PhaseRecompute:
		if enter && !u.pre {
			f.preBackward(u)
		}
	default: // forward, eval
		if path != u.name {
			return
		}
		if enter {
			f.unshardForCompute(u)
			if f.s.OneStream { // the CPU one all-gather ahead, without streams to show it
				f.unshard(f.next(u, 1))
			}
			return
		}
		if f.reshardAfterForward() {
			f.reshard(u)
		}
		if u.postIndex < 0 { // _exec_order_data.record_post_forward, in the first iteration
			u.postIndex = len(f.postOrder)
			f.postOrder = append(f.postOrder, u)
		}
	}
}

// preBackward is _pre_backward_hook: the unit unsharded, and BACKWARD_PRE prefetching of the unit backward
// reaches next. A frozen unit (a LoRA model's block) has no gradient to end its backward: its
// reshard-only hook (_register_post_backward_reshard_only_hook, on its inputs' gradients) runs once backward
// has left it, which the runtime sees as backward reaching a unit outside it.
func (f *fsdp) preBackward(u *fsdpUnit) {
	for _, o := range f.all() {
		if o.pre && o.unsharded && !o.trainable && o != u && !strings.HasPrefix(u.name, o.name+".") {
			f.reshard(o)
		}
	}
	u.pre = true
	f.unshardForCompute(u)
	f.unshard(f.prefetchTarget(u))
}

// gradReady counts a unit's gradients in; the last one runs its post-backward.
func (f *fsdp) gradReady(u *fsdpUnit) {
	if u.pending--; u.pending == 0 {
		f.postBackward(u)
	}
}

// postBackward is _post_backward_hook and _reduce_grad: the unit's gradients, concatenated on the default
// stream into the FlatParameter's unsharded gradient (autograd's SplitWithSizesBackward), the unit
// resharded, and the gradient reduce-scattered on the post_backward stream.
func (f *fsdp) postBackward(u *fsdpUnit) {
	flat := f.unshardedGrad(u)
	if f.reshardAfterForward() || f.sync { // _should_free_in_backward
		f.reshard(u)
	}
	if !f.sync { // no_sync: the unsharded gradient is kept, unreduced, to the last micro-batch
		u.noSync = flat
		return
	}
	f.waitStream(f.postBackwardStream, f.current())
	f.rt.OnStream(f.postBackwardStream, func() {
		f.allocating(snapshot.CategoryGradient, "fsdp", func() { f.reduceGrad(u, flat) })
	})
}

// unshardedGrad gathers the unit's parameters' gradients into one flat gradient (accumulated into the
// no_sync one when there is one) and drops theirs.
func (f *fsdp) unshardedGrad(u *fsdpUnit) *tensor.Tensor {
	label := u.label()
	flat := u.noSync
	u.noSync = nil
	f.allocating(snapshot.CategoryGradient, "fsdp", func() {
		accumulate := flat != nil
		if !accumulate {
			flat = f.rt.Zeros(u.full.DType(), []int{u.numel}, "fsdp.unsharded_grad["+label+"]", snapshot.CategoryGradient)
		}
		off := 0
		for _, p := range u.params {
			if g := p.Tensor.Grad(); g != nil {
				v := flatView(flat, off, p.Tensor.Numel(), p.Tensor.Shape())
				if accumulate {
					tensor.AddScaled_(v, g, 1)
				} else {
					tensor.Copy_(v, g)
				}
				v.Release()
				p.Tensor.SetGrad(nil)
			}
			off += p.Tensor.Numel()
		}
	})
	return flat
}

// reduceGrad is _reduce_grad on the post_backward stream: the gradient padded to N shards (F.pad, when it
// needs padding), reduce-scattered into a new shard, cast to the parameters' dtype, accumulated (or copied
// to the host); the unsharded gradient, made on the default stream, is recorded on this one and freed.
func (f *fsdp) reduceGrad(u *fsdpUnit, flat *tensor.Tensor) {
	label := u.label()
	padded := flat
	if pad := f.n*u.shard - u.numel; pad > 0 {
		padded = f.rt.Zeros(flat.DType(), []int{f.n * u.shard}, "fsdp.padded_unsharded_grad["+label+"]", snapshot.CategoryGradient)
		v := padded.Narrow(0, 0, u.numel)
		tensor.Copy_(v, flat)
		v.Release()
	}
	shard := f.rt.Empty(flat.DType(), []int{u.shard}, "fsdp.sharded_grad["+label+"]")
	f.launch(f.postBackwardStream)
	f.comm.record(ReduceScatter, int64(f.n*u.shard*flat.DType().Size()), f.n, "fsdp unit "+label)
	if padded != flat {
		padded.Release()
	}
	if f.s.Strategy == HSDP {
		f.comm.record(AllReduce, int64(u.shard*shard.DType().Size()), f.s.NodeCount(), "hsdp shard "+label+" across nodes")
	}
	if shard.DType() != u.local.DType() { // _cast_grad_to_param_dtype
		c := tensor.ToDType(shard, u.local.DType())
		shard.Release()
		shard = c
	}
	switch g := u.flat.Tensor.Grad(); {
	case f.offloaded():
		tensor.Copy_(u.cpuGrad, shard) // _offload_grad
		f.comm.record(DeviceToHost, int64(u.shard*u.local.DType().Size()), 0, "fsdp gradient shard "+label+" to host")
		shard.Release()
		if g == nil {
			u.flat.Tensor.SetGrad(u.cpuGrad.Ref())
		}
	case g != nil: // _accumulate_sharded_grad
		tensor.AddScaled_(g, shard, 1)
		shard.Release()
	default:
		u.flat.Tensor.SetGrad(shard)
	}
	flat.RecordStream(f.postBackwardStream) // autograd_computed_grad
	flat.Release()
}

func (f *fsdp) EndBackward() {
	// _post_backward_final_callback: a unit whose gradients did not all come (a parameter unused) still
	// reshards; the default stream waits for the reductions, and, with the gradients copied to the host,
	// the host waits for the default stream.
	for _, u := range f.all() {
		if u.pending > 0 && f.sync {
			u.pending = 0
			f.postBackward(u)
		}
		if f.reshardAfterForward() || f.sync { // _catch_all_reshard, _should_free_in_backward
			f.reshard(u)
		}
	}
	if f.sync {
		f.waitStream(f.current(), f.postBackwardStream)
		if f.offloaded() {
			f.synchronizeEvent(f.recordEvent(f.current()))
		}
	}
}

func (f *fsdp) Step(scaler *optim.GradScaler) {
	if scaler != nil {
		scaler.Step(f.opt, f.shards)
		scaler.Update()
	} else {
		f.opt.Step()
	}
	f.endStep()
}

func (f *fsdp) ZeroGrad(setToNone bool) {
	if f.offloaded() {
		// The gradient is _cpu_grad itself: set to None it is dropped, the buffer stays.
		for _, p := range f.shards {
			if setToNone {
				p.Tensor.SetGrad(nil)
			} else if g := p.Tensor.Grad(); g != nil {
				tensor.Zero_(g)
			}
		}
		return
	}
	f.opt.ZeroGrad(setToNone)
}

// String names the unit for messages.
func (u *fsdpUnit) String() string { return fmt.Sprintf("%s (%d parameters)", u.label(), u.numel) }
