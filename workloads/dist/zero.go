package dist

import (
	"fmt"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// zero12 is DeepSpeed's ZeRO stages 1 and 2, DeepSpeedZeroOptimizer (runtime/zero/stage_1_and_2.py), with
// its config's defaults (contiguous_gradients, reduce_scatter, overlap_comm off below stage 3):
//
//   - The trainable parameters, in the model's half precision under bf16 or fp16, are flattened into one
//     buffer padded to a multiple of 2 x world size (bit16_groups_flat) and become its views. Each rank owns
//     an equal partition of it, of which it keeps an fp32 master copy (single_partition_of_fp32_groups) and
//     Adam's two moments: 12 bytes a parameter over N ranks.
//   - Gradients are copied, as autograd makes them, into a reduce bucket of reduce_bucket_size elements
//     (the IPG bucket, allocated at the first gradient of each backward); a full bucket is reduced and the
//     gradients of parameters that reach into this rank's partition are copied into grads_in_partition,
//     whole. Stage 2 does this during backward and drops the others' gradients; stage 1 keeps every
//     gradient (2 bytes a parameter) until the last micro-batch's backward ends, then reduces.
//   - The step flattens the partition's gradients, converts them to an fp32 partition (so for a moment the
//     rank holds 2 + 4 bytes per partition element of gradients, DeepSpeed's estimator counts 2 + 4 of its
//     18), runs Adam, copies the master weights into its half partition and all-gathers the flat buffer.
//   - With the optimizer offloaded, the master weights, Adam's moments and an fp32 gradient partition live in
//     host memory (pinned unless offload_pageable), gradients go there as they are reduced, and the step
//     runs on the host: only the half parameters, the bucket and a staging buffer stay on the GPU.
type zero12 struct {
	base
	stage2  bool
	half    tensor.DType
	params  []*nn.Parameter // the bit16 group: trainable, in registration order
	numels  []int64
	offsets []int64
	flat    *tensor.Tensor
	part    zeroPartition
	inPart  []bool
	partEl  int64 // elements of the parameters in this rank's partition, whole
	first   int64 // offset into the first of them where the partition starts

	master     *tensor.Tensor // the fp32 partition
	adam       *flatAdam
	hostGrad   *tensor.Tensor // offload: the fp32 gradient partition in host memory
	hostHalf   *tensor.Tensor // offload: param_buffer_of_bit16_for_cpu_offload_groups
	gpuStaging *tensor.Tensor // offload: temp_grad_buffer_for_gpu_offload
	hostStage  *tensor.Tensor // offload: temp_grad_buffer_for_cpu_offload

	// Backward.
	ipg        *tensor.Tensor // the reduce bucket while one is set up
	ipgElems   int64
	ipgParams  []int
	gip        *tensor.Tensor // grads_in_partition
	gipOff     int64
	accum      []*tensor.Tensor // all_grad_tensors: this rank's gradients, across micro-batches
	averaged   []*tensor.Tensor // averaged_gradients: views of this rank's part of its gradients
	index      map[*nn.Parameter]int
	reduced    []bool
	gradsReady bool
}

func (z *zero12) ParamDType(requested tensor.DType) tensor.DType {
	if h := halfOf(z.env.AMP); h != tensor.F32 {
		return h
	}
	return requested
}

func (z *zero12) Autocast() bool       { return halfOf(z.env.AMP) == tensor.F32 }
func (z *zero12) BuiltBlock(nn.Module) {}

func (z *zero12) offloaded() bool { return z.s.Offload != OffloadNone }

func (z *zero12) Wrap(model nn.Module) {
	z.stage2 = z.s.Strategy == ZeRO2
	z.params = trainable(model)
	z.index = map[*nn.Parameter]int{}
	z.half = z.ParamDType(tensor.F32)
	if z.half == tensor.F32 && len(z.params) > 0 {
		z.half = z.params[0].Tensor.DType() // a model loaded in half precision stays half
	}
	var total int64
	for i, p := range z.params {
		z.index[p] = i
		n := int64(p.Tensor.Numel())
		z.numels = append(z.numels, n)
		z.offsets = append(z.offsets, total)
		total += n
	}
	z.reduced = make([]bool, len(z.params))
	z.part = newZeroPartition(total, z.world())
	in, el := z.part.paramsIn(z.numels, z.s.Rank)
	z.inPart = make([]bool, len(z.params))
	for _, i := range in {
		z.inPart[i] = true
	}
	z.partEl = el
	if len(in) > 0 {
		z.first = max(z.part.size*int64(z.s.Rank)-z.offsets[in[0]], 0)
	}

	z.allocating(snapshot.CategoryParameter, "deepspeed", func() {
		// module.half() / bfloat16(): parameters not already in the half dtype are cast one at a time.
		for _, p := range z.params {
			if p.Tensor.DType() != z.half {
				c := tensor.ToDType(p.Tensor, z.half)
				p.Tensor.SetData(c)
				c.Release()
			}
		}
		// flatten_dense_tensors_aligned, then _update_model_bit16_weights: the parameters become views.
		z.flat = z.rt.Zeros(z.half, []int{int(z.part.aligned)}, "zero.bit16_groups_flat", snapshot.CategoryParameter)
		for i, p := range z.params {
			v := flatView(z.flat, int(z.offsets[i]), int(z.numels[i]), p.Tensor.Shape())
			tensor.Copy_(v, p.Tensor)
			p.Tensor.SetData(v)
			v.Release()
		}
	})
	z.makeMaster()
	for i, p := range z.params {
		p.Tensor.OnGradAccumulated(func() { z.gradReady(i) })
	}
}

// partitionView returns this rank's partition of the flat buffer.
func (z *zero12) partitionView() *tensor.Tensor {
	return z.flat.Narrow(0, int(z.part.size)*z.s.Rank, int(z.part.size))
}

// makeMaster makes the fp32 master partition (a clone of the half partition, converted), on the GPU or in
// host memory, and what initialize_optimizer_states and offloading allocate.
func (z *zero12) makeMaster() {
	p := int(z.part.size)
	z.allocating(snapshot.CategoryOptimizerState, "deepspeed", func() {
		part := z.partitionView()
		clone := tensor.Clone(part, "zero.partition_clone", snapshot.CategoryTemporary)
		part.Release()
		if !z.offloaded() {
			z.master = tensor.ToDType(clone, tensor.F32)
			if z.master.SharesStorage(clone) { // already fp32: the clone is the master
				z.master.SetCategory(snapshot.CategoryOptimizerState)
			}
			clone.Release()
			// initialize_optimizer_states: an fp32 gradient partition made and dropped again.
			tensor.ZerosLike(z.master, "zero.single_grad_partition", snapshot.CategoryTemporary).Release()
			return
		}
		host := z.env.Host
		hostAllocating(host, snapshot.CategoryOptimizerState, func() {
			pageable := host.Zeros(tensor.F32, []int{p}, "zero.fp32_partition", snapshot.CategoryOptimizerState)
			tensor.Copy_(pageable, clone)
			z.master = z.pin(pageable, "zero.fp32_partition", snapshot.CategoryOptimizerState)
			stage := host.Zeros(z.half, []int{p}, "zero.bit16_cpu_buffer", snapshot.CategoryParameter)
			z.hostHalf = z.pin(stage, "zero.bit16_cpu_buffer", snapshot.CategoryParameter)
			grad := host.Zeros(tensor.F32, []int{p}, "zero.fp32_grad_partition", snapshot.CategoryGradient)
			z.hostGrad = z.pin(grad, "zero.fp32_grad_partition", snapshot.CategoryGradient)
			var largest int
			for _, n := range z.numels {
				largest = max(largest, int(n))
			}
			tmp := host.Zeros(z.half, []int{largest}, "zero.temp_grad_buffer_for_cpu_offload", snapshot.CategoryGradient)
			z.hostStage = z.pin(tmp, "zero.temp_grad_buffer_for_cpu_offload", snapshot.CategoryGradient)
		})
		clone.Release()
		var largest int
		for _, n := range z.numels {
			largest = max(largest, int(n))
		}
		z.gpuStaging = z.rt.Zeros(z.half, []int{largest}, "zero.temp_grad_buffer_for_gpu_offload", snapshot.CategoryGradient)
	})
	z.adam = newFlatAdam(z.master, z.env.Optimizer, "zero.fp32_partition")
}

// pin returns t pinned (tensor.pin_memory(): a pinned copy, the pageable one released), or t itself when the
// settings keep offloaded buffers pageable.
func (z *zero12) pin(t *tensor.Tensor, role string, c snapshot.Category) *tensor.Tensor {
	return pinCopy(z.env.Host, t, role, c, !z.s.OffloadPageable)
}

func (z *zero12) BeginForward(iteration int, sync bool) {
	z.iteration, z.sync = iteration, sync
	z.gradsReady = false
	clear(z.reduced)
}

// gradReady is the gradient hook (process_gradients): the bucket is set up at the first gradient of a
// backward; stage 2 reduces as gradients come.
func (z *zero12) gradReady(i int) {
	z.setupBuckets()
	if z.stage2 {
		z.reduceIndependent(i)
	}
}

// setupBuckets allocates the reduce bucket once per backward (setup_buckets).
func (z *zero12) setupBuckets() {
	if z.gradsReady {
		return
	}
	z.gradsReady = true
	if z.ipg == nil {
		z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
			z.ipg = z.rt.Empty(z.half, []int{int(z.s.ReduceBucketSize)}, "zero.ipg_bucket")
		})
	}
}

// reduceIndependent is reduce_independent_p_g_buckets_and_remove_grads: the gradient joins the bucket
// (reducing the bucket first when it would overflow) and becomes the bucket's view.
func (z *zero12) reduceIndependent(i int) {
	p := z.params[i]
	g := p.Tensor.Grad()
	if g == nil || z.reduced[i] {
		return
	}
	z.reduced[i] = true
	n := z.numels[i]
	if z.ipgElems+n > z.s.ReduceBucketSize {
		z.reduceIPG()
	}
	if n <= z.s.ReduceBucketSize { // a larger one is reduced on its own, where it is
		v := flatView(z.ipg, int(z.ipgElems), int(n), g.Shape())
		tensor.Copy_(v, g)
		g.SetData(v)
		v.Release()
	}
	z.ipgElems += n
	z.ipgParams = append(z.ipgParams, i)
}

// reduceIPG is reduce_ipg_grads: the bucket reduced, the gradients of this rank's partition copied into
// grads_in_partition (or, offloaded, into the host's fp32 partition), the others' dropped at stage 2.
func (z *zero12) reduceIPG() {
	if len(z.ipgParams) == 0 {
		return
	}
	z.comm.record(ReduceScatter, z.ipgElems*int64(z.half.Size()), z.world(), fmt.Sprintf("zero reduce bucket of %d gradients", len(z.ipgParams)))
	for _, i := range z.ipgParams {
		p := z.params[i]
		switch {
		case z.inPart[i]:
			z.copyGradInPartition(i)
		case z.stage2:
			p.Tensor.SetGrad(nil) // clear_grad_attribute: its memory is the bucket's
		}
	}
	z.ipgParams, z.ipgElems = nil, 0
}

// copyGradInPartition is copy_grads_in_partition.
func (z *zero12) copyGradInPartition(i int) {
	g := z.params[i].Tensor.Grad()
	if z.offloaded() {
		// async_inplace_copy_grad_to_fp32_buffer_from_gpu: this rank's part of the gradient, as fp32, to the
		// host's gradient partition.
		start := max(z.part.size*int64(z.s.Rank)-z.offsets[i], 0)
		end := min(z.part.size*int64(z.s.Rank+1)-z.offsets[i], z.numels[i])
		z.allocating(snapshot.CategoryTemporary, "deepspeed", func() {
			flat := g.View(-1)
			part := flat.Narrow(0, int(start), int(end-start))
			flat.Release()
			f := tensor.ToDType(part, tensor.F32)
			part.Release()
			z.comm.record(DeviceToHost, (end-start)*4, 0, "gradient partition to the host optimizer")
			f.Release()
		})
		return
	}
	if z.gip == nil {
		z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
			z.gip = z.rt.Empty(z.half, []int{int(z.partEl)}, "zero.grads_in_partition")
		})
		z.gipOff = 0
	}
	v := flatView(z.gip, int(z.gipOff), int(z.numels[i]), g.Shape())
	tensor.Copy_(v, g)
	g.SetData(v)
	v.Release()
	z.gipOff += z.numels[i]
}

func (z *zero12) EndBackward() {
	if !z.stage2 && !z.sync {
		return // stage 1 reduces at the accumulation boundary
	}
	z.setupBuckets()
	if !z.stage2 {
		for i := range z.params {
			z.reduceIndependent(i) // reduce_gradients: every gradient, in order
		}
	}
	// independent_gradient_partition_epilogue.
	z.reduceIPG()
	if z.ipg != nil {
		z.ipg.Release()
		z.ipg = nil
	}
	if z.gip != nil {
		z.gip.Release() // grads_in_partition = None: the gradients hold its memory
		z.gip = nil
	}
	if !z.offloaded() {
		z.accumulate()
	}
	for _, p := range z.params { // _clear_param_grad_only
		p.Tensor.SetGrad(nil)
	}
}

// accumulate keeps this rank's gradients across the step's micro-batches (all_grad_tensors: the first
// backward's gradients held, the later ones added into them) and, at the boundary, makes averaged_gradients:
// views of this rank's part of them, with zero padding for the last partition.
func (z *zero12) accumulate() {
	if z.accum == nil {
		z.accum = make([]*tensor.Tensor, len(z.params))
	}
	for i, p := range z.params {
		g := p.Tensor.Grad()
		if !z.inPart[i] || g == nil {
			continue
		}
		if z.accum[i] == nil {
			z.accum[i] = g.Ref()
		} else {
			tensor.AddScaled_(z.accum[i], g, 1)
		}
	}
	if !z.sync {
		return
	}
	var have int64
	for i, a := range z.accum {
		if a == nil {
			continue
		}
		start := max(z.part.size*int64(z.s.Rank)-z.offsets[i], 0)
		end := min(z.part.size*int64(z.s.Rank+1)-z.offsets[i], z.numels[i])
		flat := a.View(-1)
		z.averaged = append(z.averaged, flat.Narrow(0, int(start), int(end-start)))
		flat.Release()
		a.Release()
		z.accum[i] = nil
		have += end - start
	}
	if have < z.part.size {
		z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
			z.averaged = append(z.averaged, z.rt.Zeros(z.half, []int{int(z.part.size - have)}, "zero.partition_padding", snapshot.CategoryGradient))
		})
	}
}

func (z *zero12) Step(*optim.GradScaler) {
	if z.offloaded() {
		host := z.env.Host
		z.adam.step(host, z.hostGrad)
		tensor.Copy_(z.hostHalf, z.master)
		part := z.partitionView()
		tensor.Copy_(part, z.hostHalf)
		part.Release()
		z.comm.record(HostToDevice, z.part.size*int64(z.half.Size()), 0, "updated half partition from the host")
		tensor.Zero_(z.hostGrad) // reset_cpu_buffers
	} else {
		var g *tensor.Tensor
		z.allocating(snapshot.CategoryGradient, "deepspeed", func() {
			// flatten(averaged_gradients).to(fp32): a half flat partition, then its fp32 copy.
			flat := z.rt.Empty(z.half, []int{int(z.part.size)}, "zero.flat_grad_partition")
			g = tensor.ToDType(flat, tensor.F32)
			flat.Release()
		})
		for _, r := range z.averaged { // free_grad_in_param_list, averaged_gradients[i] = None
			r.Release()
		}
		z.averaged = z.averaged[:0]
		z.allocating(snapshot.CategoryOptimizerState, "deepspeed", func() { z.adam.step(z.rt, g) })
		g.Release()
		part := z.partitionView()
		tensor.Copy_(part, z.master)
		part.Release()
	}
	z.comm.record(AllGather, z.part.aligned*int64(z.half.Size()), z.world(), "zero all-gather of the updated parameters")
	z.endStep()
}

func (z *zero12) ZeroGrad(setToNone bool) {
	for _, p := range z.params {
		if setToNone {
			p.Tensor.SetGrad(nil)
		} else if g := p.Tensor.Grad(); g != nil {
			tensor.Zero_(g)
		}
	}
}

// hostAllocating runs f with the host runtime's new allocations tagged as category c, outside autograd.
func hostAllocating(host *tensor.Runtime, c snapshot.Category, f func()) {
	prev := host.SetCategory(c)
	defer host.SetCategory(prev)
	host.NoGrad(f)
}

// pinCopy returns a pinned copy of the host tensor t (tensor.pin_memory()), releasing t, or t itself when
// pinned is false.
func pinCopy(host *tensor.Runtime, t *tensor.Tensor, role string, c snapshot.Category, pinned bool) *tensor.Tensor {
	if !pinned {
		return t
	}
	var p *tensor.Tensor
	host.Pinned(func() { p = tensor.Clone(t, role, c) })
	t.Release()
	return p
}
