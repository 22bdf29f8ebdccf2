package tensor

import "fmt"

// The collectives of tensor and sequence parallelism as one rank runs them. The simulated rank stands for
// every rank of its group: what the others contribute is taken to be its own (they run alike), so the
// shapes, and what each collective allocates and autograd keeps, are the rank's; the values are those of
// one rank whose peers hold the same data.

// GatherSeq is sequence parallelism's all-gather of dimension 1 over n ranks (Megatron's
// gather_from_sequence_parallel_region): a new tensor n times as long. Its backward is the reduce-scatter,
// a gradient of x's shape.
func GatherSeq(x *Tensor, n int) *Tensor {
	x.check()
	if n == 1 {
		return x.Ref()
	}
	parts := make([]*Tensor, n)
	for i := range parts {
		parts[i] = x
	}
	return Cat(parts, 1)
}

// ScatterSeq is the reduce-scatter of dimension 1 over n ranks (reduce_scatter_to_sequence_parallel_region
// after a row-parallel linear): this rank's 1/n of the sequence, a new tensor. Its backward all-gathers the
// gradient, a tensor of x's shape.
func ScatterSeq(x *Tensor, n int) *Tensor {
	x.check()
	if n == 1 {
		return x.Ref()
	}
	if x.NDim() < 2 || x.Dim(1)%n != 0 {
		errShape("ScatterSeq", "dimension 1 of %v does not split over %d ranks", x.shape, n)
	}
	s := x.Narrow(1, 0, x.Dim(1)/n)
	defer s.Release()
	return s.rt.copyOp(s, "reduce_scatter")
}

// GatherLinear is a column-parallel linear under sequence parallelism as Megatron-LM runs it
// (LinearWithGradAccumulationAndAsyncCommunication with sequence_parallel): the input's shard x (batch,
// seq/n, in) is all-gathered into a transient buffer, multiplied by w (out, in) and the buffer freed;
// autograd saves the shard, not the gathered input, and the backward gathers it again to form the weight's
// gradient, reduce-scattering the input's. Without bias.
func GatherLinear(x, w *Tensor, n int) *Tensor {
	x.check()
	w.check()
	if x.NDim() != 3 || x.Dim(-1) != w.Dim(1) {
		errShape("GatherLinear", "input %v and weight %v do not match", x.shape, w.shape)
	}
	if in, ok := acLinear.cast(x.rt, x, w); ok {
		defer releaseAll(in)
		defer x.rt.withoutAutocast()()
		return GatherLinear(in[0], in[1], n)
	}
	rt := x.rt
	var y *Tensor
	rt.NoGrad(func() {
		full := GatherSeq(x, n)
		y = Linear(full, w, nil)
		full.Release()
	})
	if rt.needsGrad(x, w) {
		node := rt.node("LinearWithGradAccumulationAndAsyncCommunicationBackward", []*Tensor{x, w}, []*Tensor{y}, nil)
		sx, sw := node.save("input", x), node.save("weight", w)
		node.apply = func(_ *Node, g []*Tensor, needs []bool) []*Tensor {
			full := GatherSeq(sx, n) // the all-gather again, for the weight's gradient
			defer full.Release()
			out := make([]*Tensor, 2)
			if needs[1] {
				g2 := g[0].Reshape(-1, w.Dim(0))
				f2 := full.Reshape(-1, w.Dim(1))
				gt := g2.T()
				out[1] = Matmul(gt, f2)
				releaseAll([]*Tensor{g2, f2, gt})
			}
			if needs[0] {
				dfull := Matmul(g[0], sw)
				out[0] = sumSlices(dfull, n)
				dfull.Release()
			}
			return out
		}
	}
	return y
}

// sumSlices is the reduce-scatter of a gradient g (batch, n*s, d) over n ranks that all hold the same: the
// sum of its n slices of dimension 1, a new tensor (batch, s, d).
func sumSlices(g *Tensor, n int) *Tensor {
	if g.NDim() != 3 || g.Dim(1)%n != 0 {
		panic(fmt.Sprintf("tensor: gradient %v does not split over %d ranks", g.shape, n))
	}
	b, s, d := g.Dim(0), g.Dim(1)/n, g.Dim(2)
	out := g.rt.Zeros(g.dtype, []int{b, s, d}, "reduce_scatter", g.rt.category)
	if g.rt.dev.Computes() {
		o, v := out.data(), g.host()
		for i := range b {
			for r := range n {
				for j := range s * d {
					o[i*s*d+j] += v[(i*n+r)*s*d+j]
				}
			}
		}
	}
	return out
}

// Root is what a pipeline stage keeps of an output it sent on: the graph behind it, without its data
// (Megatron's deallocate_output_tensor sets the output's .data to a one-element tensor once it is sent).
type Root struct {
	e edge
}

// DetachRoot releases t, which must have a graph, and returns the root of that graph: the graph, and what it
// saved, stay alive until Backward runs from it.
func (t *Tensor) DetachRoot() *Root {
	t.check()
	if t.gradFn == nil {
		errShape("DetachRoot", "the tensor %v has no graph", t.shape)
	}
	r := &Root{e: t.gradEdge()}
	r.e.node.refs++
	t.Release()
	return r
}

// Backward runs the graph from the root with the gradient g received from the next stage (it takes g's
// reference), as torch.autograd.backward(output_tensor, grad_tensors=output_tensor_grad) does.
func (r *Root) Backward(g *Tensor) {
	rt := g.rt
	defer rt.enterBackward()()
	rt.runBackward(r.e, g, false)
	r.e.node.unref()
}
