package dist

import (
	"fmt"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// ddp is torch.nn.parallel.DistributedDataParallel (torch/nn/parallel/distributed.py, with the C++ Reducer
// of torch/csrc/distributed/c10d/reducer.cpp):
//
//   - the constructor broadcasts the module's state from rank 0 in flat chunks of up to 250 MiB
//     (broadcast_bucket_size), each flattened into a temporary and copied back;
//   - it allocates a flat gradient buffer per bucket (bucket.gradients = at::empty({offset})), every
//     trainable parameter's gradient in one of them: in the first iteration one bucket per dtype holding
//     them all (find_unused_parameters=False gives the limit sys.maxsize), rebuilt before the second
//     forward in the order the gradients became ready, with a first bucket of 1 MiB
//     (_DEFAULT_FIRST_BUCKET_BYTES, when bucket_cap_mb is left at its default) and bucket_cap_mb (25) for
//     the rest;
//   - as autograd accumulates each gradient, the reducer copies it into its bucket
//     (mark_variable_ready_dense); with gradient_as_bucket_view the gradient then becomes the bucket's
//     view, and the gradient autograd made is freed; without, both stay: the gradients and the buckets;
//   - a bucket whose gradients are all in is all-reduced in place on ProcessGroupNCCL's stream, which
//     waits for the default stream and records the bucket on itself (so an old bucket freed when they are
//     rebuilt waits for its all-reduce); the default stream waits for the reductions at the end of
//     backward; gradients are reduced on the last micro-batch of a step only (no_sync for the others, as
//     accelerate and HF Trainer do). The constructor's broadcast runs before training, when the host and
//     not the GPU sets the pace, outside the streams model: it is modelled on the default stream.
type ddp struct {
	base
	params     []*nn.Parameter // trainable, in registration order
	index      map[*nn.Parameter]int
	opt        optim.Optimizer
	buckets    []*ddpBucket
	bucketOf   []int // each parameter's bucket
	readyOrder []int // parameters in the order their gradients became ready, in the first iteration
	rebuilt    bool
	nccl       int64 // ProcessGroupNCCL's stream
}

// ddpBucket is one bucket: a flat gradient buffer and the parameters whose gradients it holds.
type ddpBucket struct {
	grads   *tensor.Tensor
	params  []int
	offsets []int // each parameter's first element in grads
	pending int   // gradients still to come in this backward
}

func (d *ddp) ParamDType(requested tensor.DType) tensor.DType { return requested }
func (d *ddp) Autocast() bool                                 { return true }
func (d *ddp) BuiltBlock(nn.Module)                           {}

func (d *ddp) Wrap(model nn.Module) {
	d.nccl = d.newStream("nccl")
	d.params = trainable(model)
	d.index = map[*nn.Parameter]int{}
	for i, p := range d.params {
		d.index[p] = i
	}
	d.broadcastModuleStates(model)
	all := make([]int, len(d.params))
	for i := range all {
		all[i] = i
	}
	d.initBuckets(d.assign(all, []int64{noLimit}))
	for i, p := range d.params {
		p.Tensor.OnGradAccumulated(func() { d.ready(i) })
	}
	opt, err := optim.New(d.rt, d.params, d.env.Optimizer)
	if err != nil {
		panic(err) // the configuration was validated
	}
	d.opt = opt
}

// broadcastModuleStates is _sync_module_states: every parameter broadcast from rank 0 in coalesced chunks of
// up to broadcast_bucket_size, each flattened into a temporary buffer (torch's _broadcast_coalesced).
func (d *ddp) broadcastModuleStates(model nn.Module) {
	const chunkBytes = 250 << 20
	ps := model.Parameters()
	for start := 0; start < len(ps); {
		dtype := ps[start].Tensor.DType()
		var n int
		end := start
		for end < len(ps) && ps[end].Tensor.DType() == dtype && (end == start || int64(n+ps[end].Tensor.Numel())*int64(dtype.Size()) <= chunkBytes) {
			n += ps[end].Tensor.Numel()
			end++
		}
		d.allocating(snapshot.CategoryTemporary, "ddp", func() {
			flat := d.rt.Empty(dtype, []int{n}, "ddp.broadcast_coalesced")
			d.comm.record(Broadcast, int64(n)*int64(dtype.Size()), d.world(), "module state from rank 0")
			flat.Release()
		})
		start = end
	}
}

// assign returns the buckets of the parameters order names, as the reducer assigns them.
func (d *ddp) assign(order []int, limits []int64) [][]int {
	sizes := make([]int64, len(order))
	dtypes := make([]tensor.DType, len(order))
	for i, p := range order {
		t := d.params[p].Tensor
		sizes[i], dtypes[i] = int64(t.Numel())*int64(t.DType().Size()), t.DType()
	}
	buckets := bucketAssignment(sizes, dtypes, limits)
	for _, b := range buckets {
		for j, i := range b {
			b[j] = order[i]
		}
	}
	return buckets
}

// initBuckets is Reducer::initialize_buckets: the old buckets go, a flat buffer per new bucket is allocated,
// and a gradient that is a view of an old bucket is copied into its new one.
func (d *ddp) initBuckets(assignment [][]int) {
	old := d.buckets
	d.buckets = nil
	d.bucketOf = make([]int, len(d.params))
	for _, b := range old {
		b.grads.Release()
	}
	for bi, ps := range assignment {
		b := &ddpBucket{params: ps}
		n := 0
		for _, p := range ps {
			b.offsets = append(b.offsets, n)
			n += d.params[p].Tensor.Numel()
			d.bucketOf[p] = bi
		}
		dtype := d.params[ps[0]].Tensor.DType()
		d.allocating(snapshot.CategoryGradient, "ddp", func() {
			b.grads = d.rt.Empty(dtype, []int{n}, fmt.Sprintf("ddp.bucket[%d]", bi))
		})
		d.buckets = append(d.buckets, b)
	}
	if d.s.GradientAsBucketView {
		for p := range d.params {
			if d.params[p].Tensor.Grad() != nil {
				d.toView(p)
			}
		}
	}
}

// view returns parameter p's view of its bucket.
func (d *ddp) view(p int) *tensor.Tensor {
	b := d.buckets[d.bucketOf[p]]
	t := d.params[p].Tensor
	return flatView(b.grads, b.offsets[indexOf(b.params, p)], t.Numel(), t.Shape())
}

// toView copies p's gradient into its bucket and makes the gradient the bucket's view.
func (d *ddp) toView(p int) {
	t := d.params[p].Tensor
	if t.Grad().SharesStorage(d.buckets[d.bucketOf[p]].grads) {
		return // already a view: autograd accumulated into the bucket
	}
	v := d.view(p)
	tensor.Copy_(v, t.Grad())
	t.SetGrad(v)
}

func (d *ddp) BeginForward(iteration int, sync bool) {
	d.iteration, d.sync = iteration, sync
	if iteration > 0 && !d.rebuilt && len(d.readyOrder) == len(d.params) {
		// Reducer::rebuild_buckets, from DDP's pre-forward of the second iteration.
		first := int64(FirstBucketBytes)
		if d.s.BucketCapMB != DefaultBucketCapMB {
			first = d.s.BucketCapBytes() // a cap given explicitly applies to the first bucket too
		}
		d.initBuckets(d.assign(d.readyOrder, []int64{first, d.s.BucketCapBytes()}))
		d.rebuilt = true
	}
	for _, b := range d.buckets {
		b.pending = len(b.params)
	}
}

// ready is the reducer's autograd hook for parameter p: its gradient is in.
func (d *ddp) ready(p int) {
	if d.iteration == 0 && len(d.readyOrder) < len(d.params) && !containsInt(d.readyOrder, p) {
		d.readyOrder = append(d.readyOrder, p)
	}
	if !d.sync {
		return
	}
	if d.s.GradientAsBucketView {
		d.toView(p)
	} else {
		v := d.view(p)
		tensor.Copy_(v, d.params[p].Tensor.Grad())
		v.Release()
	}
	b := d.buckets[d.bucketOf[p]]
	if b.pending--; b.pending == 0 {
		// ProcessGroupNCCL::collective: its stream waits for the current one, runs the all-reduce and
		// records the bucket on itself (recordStream of the inputs).
		d.waitStream(d.nccl, d.current())
		d.launch(d.nccl)
		b.grads.RecordStream(d.nccl)
		bytes := int64(b.grads.Numel()) * int64(b.grads.DType().Size())
		d.comm.record(AllReduce, bytes, d.world(), fmt.Sprintf("ddp bucket %d of %d", d.bucketOf[p], len(d.buckets)))
	}
}

// EndBackward is the reducer's finalize_backward: the default stream waits for the all-reduces
// (Work::wait).
func (d *ddp) EndBackward() {
	if d.sync {
		d.waitStream(d.current(), d.nccl)
	}
}

func (d *ddp) Step(scaler *optim.GradScaler) {
	if scaler != nil {
		scaler.Step(d.opt, d.params)
		scaler.Update()
	} else {
		d.opt.Step()
	}
	d.endStep()
}

func (d *ddp) ZeroGrad(setToNone bool) { d.opt.ZeroGrad(setToNone) }

func indexOf(xs []int, x int) int {
	for i, y := range xs {
		if y == x {
			return i
		}
	}
	return -1
}

func containsInt(xs []int, x int) bool { return indexOf(xs, x) >= 0 }
