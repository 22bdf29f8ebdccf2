package dist

import (
	"fmt"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// zero3 is DeepSpeed's ZeRO stage 3: DeepSpeedZeroOptimizer_Stage3 (runtime/zero/stage3.py), parameters
// partitioned as zero.Init does (partition_parameters.py) and fetched by the PartitionedParameterCoordinator
// (partitioned_param_coordinator.py), with runtime/zero/config.py's defaults:
//
//   - Each parameter is partitioned as soon as its block exists: every rank keeps ceil(numel/N) elements of
//     it (ds_tensor, the parameter padded to a multiple of N), the parameter's own memory freed. The
//     partitions are then moved into one flat buffer per sub-group (fp16_partitioned_groups_flat), of which
//     the rank keeps an fp32 master copy and Adam's moments: 2 + 12 bytes a parameter over N ranks.
//   - A module's parameters are all-gathered when its forward (or, in backward, its first op) starts:
//     a lone parameter into a padded buffer, several through a flat buffer split into one tensor each
//     (AllGatherCoalescedHandle's torch.cat). They are released after the module, unless small enough to
//     persist (stage3_param_persistence_threshold) or, once the first iteration has traced the order of
//     modules, used again within stage3_max_reuse_distance elements. From the second iteration the
//     coordinator prefetches the parameters of the modules that follow, up to stage3_prefetch_bucket_size
//     elements and no more than stage3_max_live_parameters alive.
//   - Gradients are copied as they come into a reduce bucket of reduce_bucket_size elements, allocated once;
//     a full bucket is reduce-scattered and each rank's part accumulated into grad_partitions_flat_buffer
//     (2 bytes a parameter over N ranks).
//   - The step releases every gathered parameter, makes an fp32 gradient per sub-group of sub_group_size
//     elements (4 bytes a parameter over N ranks, for the time of the sub-group's step), runs Adam and copies
//     the master weights into the half partitions.
//   - Offloading the optimizer moves the master weights, Adam's moments and the fp32 gradients to host memory
//     (the gradient partitions as they are reduced); offloading parameters too keeps the partitions there,
//     copied to the GPU for each all-gather.
type zero3 struct {
	base
	half    tensor.DType
	params  []*z3param
	byParam map[*nn.Parameter]*z3param
	scopes  map[string][]*z3param

	subs      []*z3sub
	ipg       *tensor.Tensor
	ipgElems  int64
	ipgParams []*z3param
	gradParts *tensor.Tensor // grad_partitions_flat_buffer
	gradOff   map[*z3param]int

	// The coordinator.
	trace     []string // the modules fetched, in order, over the first iteration's forward and backward
	traceDone bool
	position  int    // the next step of the trace
	live      int64  // elements of gathered parameters
	backward  string // the module whose backward is running, released when the next one starts
	micro     bool   // a backward has accumulated into the gradient partitions this step
}

// z3param is one partitioned parameter.
type z3param struct {
	p        *nn.Parameter
	numel    int
	part     int // ds_tensor's elements: ceil(numel/N)
	shape    []int
	ds       *tensor.Tensor
	gathered bool
	persist  bool
	sub      int
}

// z3sub is one sub-group of the optimizer: a flat fp32 master partition and its Adam.
type z3sub struct {
	params []*z3param
	numel  int
	half   *tensor.Tensor // its slice of fp16_partitioned_groups_flat
	master *tensor.Tensor
	grad   *tensor.Tensor // offload: the fp32 gradient in host memory
	adam   *flatAdam
}

func (z *zero3) ParamDType(requested tensor.DType) tensor.DType {
	if h := halfOf(z.env.AMP); h != tensor.F32 {
		return h
	}
	return requested
}

func (z *zero3) Autocast() bool { return halfOf(z.env.AMP) == tensor.F32 }

func (z *zero3) offloadParams() bool    { return z.s.Offload == OffloadOptimizerParams }
func (z *zero3) offloadOptimizer() bool { return z.s.Offload != OffloadNone }

func (z *zero3) init() {
	if z.byParam != nil {
		return
	}
	z.byParam = map[*nn.Parameter]*z3param{}
	z.gradOff = map[*z3param]int{}
}

// hostMem runs f in host memory: pinned unless offload_pageable.
func (z *zero3) hostMem(c snapshot.Category, f func()) {
	hostAllocating(z.env.Host, c, func() {
		if z.s.OffloadPageable {
			f()
			return
		}
		z.env.Host.Pinned(f)
	})
}

// BuiltBlock partitions the block's parameters at once, as zero.Init does when a module is constructed.
func (z *zero3) BuiltBlock(block nn.Module) {
	z.init()
	for _, p := range block.Parameters() {
		z.partition(p)
	}
}

// partition is _partition_param: the rank's padded slice kept, the parameter's memory freed.
func (z *zero3) partition(p *nn.Parameter) {
	if z.byParam[p] != nil {
		return
	}
	z.quantStorage([]*nn.Parameter{p})
	t := p.Tensor
	zp := &z3param{p: p, numel: t.Numel(), shape: t.Shape(), sub: -1}
	zp.part = int(ceilDiv(int64(zp.numel), int64(z.world())))
	zp.persist = int64(zp.numel) <= z.s.ParamPersistenceThreshold
	z.allocating(snapshot.CategoryParameter, "deepspeed", func() {
		if z.offloadParams() {
			z.hostMem(snapshot.CategoryParameter, func() {
				zp.ds = z.env.Host.Zeros(t.DType(), []int{zp.part}, "zero3.ds_tensor["+p.Name+"]", snapshot.CategoryParameter)
			})
			z.comm.record(DeviceToHost, int64(zp.part*t.DType().Size()), 0, "partition of "+p.Name+" to host")
		} else {
			zp.ds = z.rt.Zeros(t.DType(), []int{zp.part}, "zero3.ds_tensor["+p.Name+"]", snapshot.CategoryParameter)
		}
		empty := z.rt.Empty(t.DType(), []int{0}, p.Name) // param.data = torch.empty(0)
		t.SetData(empty)
		empty.Release()
	})
	z.params = append(z.params, zp)
	z.byParam[p] = zp
}

func (z *zero3) Wrap(model nn.Module) {
	z.init()
	z.half = z.ParamDType(tensor.F32)
	for _, p := range model.Parameters() {
		if p.Tensor.DType() != z.half && p.Tensor.DType().IsFloat() && z.byParam[p] == nil && halfOf(z.env.AMP) != tensor.F32 {
			c := tensor.ToDType(p.Tensor, z.half)
			p.Tensor.SetData(c)
			c.Release()
		}
		z.partition(p)
	}
	if len(z.params) > 0 && halfOf(z.env.AMP) == tensor.F32 {
		z.half = z.params[0].ds.DType()
	}
	z.scopes = map[string][]*z3param{}
	for scope, ps := range nn.ParameterScopes(model) {
		for _, p := range ps {
			z.scopes[scope] = append(z.scopes[scope], z.byParam[p])
		}
	}
	z.makeSubGroups()
	z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
		z.ipg = z.rt.Empty(z.half, []int{int(z.s.ReduceBucketSize)}, "zero3.ipg_bucket")
		total := 0
		for _, zp := range z.params {
			if zp.p.Tensor.RequiresGrad() {
				z.gradOff[zp] = total
				total += zp.part
			}
		}
		if z.offloadOptimizer() {
			z.hostMem(snapshot.CategoryGradient, func() {
				z.gradParts = z.env.Host.Zeros(z.half, []int{total}, "zero3.grad_partitions_flat_buffer", snapshot.CategoryGradient)
			})
		} else {
			z.gradParts = z.rt.Zeros(z.half, []int{total}, "zero3.grad_partitions_flat_buffer", snapshot.CategoryGradient)
		}
	})
	for _, zp := range z.params {
		if zp.p.Tensor.RequiresGrad() {
			zp.p.Tensor.OnGradAccumulated(func() { z.gradReady(zp) })
		}
	}
	z.rt.SetScopeHook(z.scope)
}

// makeSubGroups groups the trainable partitions by sub_group_size, moves them into flat buffers
// (_create_fp16_partitions_with_defragmentation) and makes each group's fp32 master copy and the
// initialize_optimizer_states gradient buffer.
func (z *zero3) makeSubGroups() {
	var cur *z3sub
	for _, zp := range z.params {
		if !zp.p.Tensor.RequiresGrad() {
			continue
		}
		if cur == nil || int64(cur.numel) >= DefaultSubGroupSize {
			cur = &z3sub{}
			z.subs = append(z.subs, cur)
		}
		zp.sub = len(z.subs) - 1
		cur.params = append(cur.params, zp)
		cur.numel += zp.part
	}
	largest := 0
	for i, sg := range z.subs {
		label := fmt.Sprintf("zero3.fp16_partitioned_groups_flat[%d]", i)
		alloc := func() { sg.half = z.rt.Zeros(z.half, []int{sg.numel}, label, snapshot.CategoryParameter) }
		if z.offloadParams() {
			alloc = func() {
				z.hostMem(snapshot.CategoryParameter, func() {
					sg.half = z.env.Host.Zeros(z.half, []int{sg.numel}, label, snapshot.CategoryParameter)
				})
			}
		}
		z.allocating(snapshot.CategoryParameter, "deepspeed", alloc)
		off := 0
		for _, zp := range sg.params {
			v := sg.half.Narrow(0, off, zp.part)
			tensor.Copy_(v, zp.ds)
			zp.ds.SetData(v)
			v.Release()
			off += zp.part
		}
		largest = max(largest, sg.numel)
		// The fp32 master: converted, then cloned.
		if z.offloadOptimizer() {
			hostAllocating(z.env.Host, snapshot.CategoryOptimizerState, func() {
				conv := z.env.Host.Zeros(tensor.F32, []int{sg.numel}, "zero3.fp32_partition", snapshot.CategoryOptimizerState)
				tensor.Copy_(conv, sg.half)
				sg.master = tensor.Clone(conv, "zero3.fp32_partition", snapshot.CategoryOptimizerState)
				conv.Release()
			})
			z.comm.record(DeviceToHost, int64(sg.numel*4), 0, "fp32 partition to host")
			z.hostMem(snapshot.CategoryGradient, func() {
				sg.grad = z.env.Host.Zeros(tensor.F32, []int{sg.numel}, "zero3.fp32_grad_partition", snapshot.CategoryGradient)
			})
		} else {
			z.allocating(snapshot.CategoryOptimizerState, "deepspeed", func() {
				conv := tensor.ToDType(sg.half, tensor.F32)
				sg.master = tensor.Clone(conv, "zero3.fp32_partition", snapshot.CategoryOptimizerState)
				conv.Release()
			})
		}
		sg.adam = newFlatAdam(sg.master, z.env.Optimizer, fmt.Sprintf("zero3.fp32_partition[%d]", i))
	}
	if !z.offloadOptimizer() && largest > 0 {
		z.allocating(snapshot.CategoryTemporary, "deepspeed", func() {
			z.rt.Zeros(tensor.F32, []int{largest}, "zero3.initial_gradient_buffer", snapshot.CategoryTemporary).Release()
		})
	}
}

// gather all-gathers the parameters not already gathered.
func (z *zero3) gather(ps []*z3param, why string) {
	var need []*z3param
	for _, zp := range ps {
		if !zp.gathered {
			need = append(need, zp)
		}
	}
	if len(need) == 0 {
		return
	}
	w := z.world()
	z.allocating(snapshot.CategoryParameter, "deepspeed", func() {
		var staged []*tensor.Tensor
		if z.offloadParams() { // the partitions copied to the GPU for the all-gather
			for _, zp := range need {
				staged = append(staged, z.rt.Empty(zp.ds.DType(), []int{zp.part}, "zero3.partition_on_device["+zp.p.Name+"]"))
				z.comm.record(HostToDevice, int64(zp.part*zp.ds.DType().Size()), 0, "partition of "+zp.p.Name)
			}
		}
		if len(need) == 1 {
			zp := need[0]
			buf := z.rt.Empty(zp.ds.DType(), []int{zp.part * w}, "zero3.gathered["+zp.p.Name+"]")
			z.comm.record(AllGather, int64(zp.part*w*zp.ds.DType().Size()), w, why)
			v := flatView(buf, 0, zp.numel, zp.shape)
			zp.p.Tensor.SetData(v)
			v.Release()
			buf.Release()
		} else {
			n := 0
			for _, zp := range need {
				n += zp.part * w
			}
			flat := z.rt.Empty(need[0].ds.DType(), []int{n}, "zero3.allgather_coalesced")
			z.comm.record(AllGather, int64(n*need[0].ds.DType().Size()), w, why)
			for _, zp := range need { // torch.cat of each parameter's pieces
				t := z.rt.Empty(zp.ds.DType(), zp.shape, "zero3.gathered["+zp.p.Name+"]")
				zp.p.Tensor.SetData(t)
				t.Release()
			}
			flat.Release()
		}
		for _, s := range staged {
			s.Release()
		}
	})
	for _, zp := range need {
		zp.gathered = true
		z.live += int64(zp.numel)
	}
}

// free releases a gathered parameter's full tensor (param.data = empty).
func (z *zero3) free(zp *z3param) {
	if !zp.gathered {
		return
	}
	empty := z.rt.Empty(zp.ds.DType(), []int{0}, zp.p.Name)
	zp.p.Tensor.SetData(empty)
	empty.Release()
	zp.gathered = false
	z.live -= int64(zp.numel)
}

// scope is DeepSpeed's module hooks seen through the runtime's scopes: a module's pre- and post-forward,
// its pre- and post-backward (the next module's backward starting).
func (z *zero3) scope(path string, enter bool) {
	phase := z.rt.Phase()
	if phase == snapshot.PhaseSetup || phase == snapshot.PhaseOptimizer {
		return
	}
	ps := z.scopes[path]
	if len(ps) == 0 {
		return
	}
	if phase == snapshot.PhaseBackward {
		if !enter || path == z.backward {
			return
		}
		if z.backward != "" {
			z.release(z.backward)
		}
		z.backward = path
		z.fetch(path)
		return
	}
	if enter {
		z.fetch(path)
	} else {
		z.release(path)
	}
}

// fetch is fetch_sub_module: the module's parameters gathered, its step of the trace recorded or passed,
// and, with a complete trace, the parameters of the modules that follow prefetched.
func (z *zero3) fetch(path string) {
	if !z.traceDone {
		z.trace = append(z.trace, path)
	}
	z.gather(z.scopes[path], "zero3 fetch of "+path)
	if !z.traceDone {
		return
	}
	z.position++
	budget := min(z.s.MaxLiveParameters-z.live, z.s.PrefetchBucketSize)
	var prefetch []*z3param
	var numel int64
	for i := z.position; i < len(z.trace) && numel < budget; i++ {
		for _, zp := range z.scopes[z.trace[i]] {
			if !zp.gathered && !containsParam(prefetch, zp) && numel < budget {
				prefetch = append(prefetch, zp)
				numel += int64(zp.numel)
			}
		}
	}
	if len(prefetch) > 0 {
		z.gather(prefetch, "zero3 prefetch")
	}
}

// release is release_sub_module: the module's parameters freed unless they persist or, with a complete
// trace, come back within stage3_max_reuse_distance elements.
func (z *zero3) release(path string) {
	for _, zp := range z.scopes[path] {
		if zp.persist || (z.traceDone && z.reusedSoon(zp)) {
			continue
		}
		z.free(zp)
	}
}

// reusedSoon reports whether zp is used by a module of the trace within max_reuse_distance elements of the
// current step.
func (z *zero3) reusedSoon(zp *z3param) bool {
	var seen int64
	for i := z.position; i < len(z.trace) && seen < z.s.MaxReuseDistance; i++ {
		for _, q := range z.scopes[z.trace[i]] {
			if q == zp {
				return true
			}
			seen += int64(q.numel)
		}
	}
	return false
}

func (z *zero3) BeginForward(iteration int, sync bool) {
	z.iteration, z.sync = iteration, sync
	z.position, z.backward = 0, ""
}

// gradReady adds the gradient to the reduce bucket (__add_grad_to_ipg_bucket), reducing the bucket first
// when it would overflow.
func (z *zero3) gradReady(zp *z3param) {
	g := zp.p.Tensor.Grad()
	if g == nil {
		return
	}
	if z.ipgElems+int64(zp.numel) > z.s.ReduceBucketSize {
		z.reduceIPG()
	}
	if int64(zp.numel) <= z.s.ReduceBucketSize {
		v := flatView(z.ipg, int(z.ipgElems), zp.numel, g.Shape())
		tensor.Copy_(v, g)
		g.SetData(v)
		v.Release()
	}
	z.ipgElems += int64(zp.numel)
	z.ipgParams = append(z.ipgParams, zp)
}

// reduceIPG is __reduce_and_partition_ipg_grads: the bucket reduce-scattered into one partition per
// parameter, each added into its place in the gradient partitions (or sent to the host's fp32 gradient),
// the gradients dropped.
func (z *zero3) reduceIPG() {
	if len(z.ipgParams) == 0 {
		return
	}
	z.comm.record(ReduceScatter, z.ipgElems*int64(z.half.Size()), z.world(), fmt.Sprintf("zero3 reduce bucket of %d gradients", len(z.ipgParams)))
	z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
		n := 0
		for _, zp := range z.ipgParams {
			n += zp.part
		}
		out := z.rt.Empty(z.half, []int{n}, "zero3.reduce_scatter_out")
		for _, zp := range z.ipgParams {
			dst := z.gradParts.Narrow(0, z.gradOff[zp], zp.part)
			if z.offloadOptimizer() { // the partition to the host, as fp32
				f := z.rt.Empty(tensor.F32, []int{zp.part}, "zero3.fp32_grad_to_host")
				z.comm.record(DeviceToHost, int64(zp.part*4), 0, "gradient partition of "+zp.p.Name)
				f.Release()
			} else if z.micro {
				src := out.Narrow(0, 0, zp.part)
				tensor.AddScaled_(dst, src, 1)
				src.Release()
			}
			dst.Release()
			zp.p.Tensor.SetGrad(nil)
		}
		out.Release()
	})
	z.ipgParams, z.ipgElems = nil, 0
}

func (z *zero3) EndBackward() {
	z.reduceIPG()
	if z.backward != "" {
		z.release(z.backward)
		z.backward = ""
	}
	z.micro = !z.sync
}

func (z *zero3) Step(*optim.GradScaler) {
	for _, zp := range z.params { // _partition_all_parameters
		if !zp.persist {
			z.free(zp)
		}
	}
	z.traceDone = true
	for _, sg := range z.subs {
		if z.offloadOptimizer() {
			z.env.Host.NoGrad(func() { sg.adam.step(z.env.Host, sg.grad) })
			tensor.Copy_(sg.half, sg.master)
			if !z.offloadParams() {
				z.comm.record(HostToDevice, int64(sg.numel*z.half.Size()), 0, "updated half partitions from the host")
			}
			tensor.Zero_(sg.grad)
			continue
		}
		var g *tensor.Tensor
		z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
			flat := z.rt.Empty(z.half, []int{sg.numel}, "zero3.flat_grad_partition") // flatten(averaged_gradients)
			g = tensor.ToDType(flat, tensor.F32)
			flat.Release()
		})
		z.allocating(snapshot.CategoryOptimizerState, "deepspeed", func() { sg.adam.step(z.rt, g) })
		g.Release() // _release_sub_group
		tensor.Copy_(sg.half, sg.master)
	}
	if !z.offloadOptimizer() {
		tensor.Zero_(z.gradParts)
	}
	z.micro = false
	z.endStep()
}

func (z *zero3) ZeroGrad(bool) {
	for _, zp := range z.params {
		zp.p.Tensor.SetGrad(nil)
	}
}

func containsParam(ps []*z3param, p *z3param) bool {
	for _, q := range ps {
		if q == p {
			return true
		}
	}
	return false
}
