package tensor

import (
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// Softmax is softmax over the last dimension. It saves its result.
func Softmax(x *Tensor) *Tensor {
	return softmaxLike(x, "softmax.out", "SoftmaxBackward0", device.Softmax, device.SoftmaxBackward)
}

// LogSoftmax is log-softmax over the last dimension. It saves its result.
func LogSoftmax(x *Tensor) *Tensor {
	return softmaxLike(x, "log_softmax.out", "LogSoftmaxBackward0", device.LogSoftmax, device.LogSoftmaxBackward)
}

func softmaxLike(x *Tensor, role, name string, fwd func(dst, x []float32, cols int), bwd func(dx, dy, y []float32, cols int)) *Tensor {
	x.check()
	rt := x.rt
	if rt.autocast != F32 && x.dtype != F32 { // float32 policy with the dtype argument set: convert first
		xc := ToDType(x, F32)
		defer xc.Release()
		return softmaxLike(xc, role, name, fwd, bwd)
	}
	cols := x.Dim(-1)
	out := rt.Empty(x.dtype, x.shape, role)
	if rt.dev.Computes() {
		fwd(out.data(), x.host(), cols)
		out.round()
	}
	if rt.needsGrad(x) {
		node := rt.node(name, []*Tensor{x}, []*Tensor{out}, nil)
		result := node.save("result", out)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Empty(g[0].dtype, g[0].shape, role+".grad")
			if n.rt.dev.Computes() {
				bwd(dx.data(), g[0].host(), result.host(), cols)
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	return out
}

// LayerNorm normalises over the last dimension with weight and bias (either may be nil), eps 1e-5. As ATen's
// native_layer_norm, it allocates the output, then the per-row mean and rstd in float32, and saves the input,
// weight, bias, mean and rstd.
func LayerNorm(x, weight, bias *Tensor, eps float32) *Tensor {
	x.check()
	rt := x.rt
	if rt.autocast != F32 && (x.dtype != F32 || (weight != nil && weight.dtype != F32)) {
		xc, wc, bc := fullPrecision(x), fullPrecision(weight), fullPrecision(bias)
		defer xc.Release()
		defer wc.Release()
		defer bc.Release()
		return LayerNorm(xc, wc, bc, eps)
	}
	cols := x.Dim(-1)
	rowShape := append(slices.Clone(x.shape[:x.NDim()-1]), 1)
	out := rt.Empty(x.dtype, x.shape, "layer_norm.out")
	mean := rt.Empty(F32, rowShape, "layer_norm.mean")
	rstd := rt.Empty(F32, rowShape, "layer_norm.rstd")
	if rt.dev.Computes() {
		device.LayerNorm(out.data(), mean.data(), rstd.data(), x.host(), hostOrNil(weight), hostOrNil(bias), cols, eps)
		out.round()
	}
	if rt.needsGrad(x, weight, bias) {
		node := rt.node("NativeLayerNormBackward0", []*Tensor{x, weight, bias}, []*Tensor{out}, nil)
		sx := node.save("input", x)
		var sw *Tensor
		if weight != nil {
			sw = node.save("weight", weight)
		}
		if bias != nil {
			node.save("bias", bias)
		}
		sm, sr := node.save("result1", mean), node.save("result2", rstd)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			rt := n.rt
			grads := make([]*Tensor, 3)
			if needs[0] {
				grads[0] = rt.Empty(g[0].dtype, g[0].shape, "layer_norm.grad")
			}
			if needs[1] {
				grads[1] = rt.Zeros(sw.dtype, sw.shape, "layer_norm.weight.grad", rt.category)
			}
			if needs[2] {
				grads[2] = rt.Zeros(sw.dtype, sw.shape, "layer_norm.bias.grad", rt.category)
			}
			if rt.dev.Computes() {
				dx := make([]float32, g[0].Numel()) // math scratch when the input needs no gradient
				if grads[0] != nil {
					dx = grads[0].data()
				}
				device.LayerNormBackward(dx, dataOrNil(grads[1]), dataOrNil(grads[2]), g[0].host(), sx.host(), sm.host(), sr.host(), hostOrNil(sw), cols)
				for _, gr := range grads {
					if gr != nil {
						gr.round()
					}
				}
			}
			return grads
		}
	}
	mean.Release()
	rstd.Release()
	return out
}

// Embedding looks up rows of weight (num, dim) for integer indices of any shape. It saves the indices; its
// backward allocates a gradient for the whole table.
func Embedding(indices, weight *Tensor) *Tensor {
	indices.check()
	weight.check()
	rt := weight.rt
	dim := weight.Dim(1)
	shape := append(slices.Clone(indices.shape), dim)
	out := rt.Empty(weight.dtype, shape, "embedding.out")
	if rt.dev.Computes() {
		device.Embedding(out.data(), weight.host(), indices.host(), dim)
	}
	if rt.needsGrad(weight) {
		node := rt.node("EmbeddingBackward0", []*Tensor{weight}, []*Tensor{out}, nil)
		idx := node.save("indices", indices)
		wShape := slices.Clone(weight.shape)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dw := n.rt.Zeros(g[0].dtype, wShape, "embedding.grad", n.rt.category)
			if n.rt.dev.Computes() {
				device.EmbeddingBackward(dw.data(), g[0].host(), idx.host(), dim)
				dw.round()
			}
			return []*Tensor{dw}
		}
	}
	return out
}

// CrossEntropy is F.cross_entropy(logits, target) with mean reduction over rows: log_softmax over the classes
// then nll_loss, as ATen composes it. logits is (n, classes) or (..., classes) viewed as rows; target holds
// class indices.
func CrossEntropy(logits, target *Tensor) *Tensor {
	if logits.rt.autocast != F32 && logits.dtype != F32 { // a float32-policy op: the logits are converted
		lc := ToDType(logits, F32)
		defer lc.Release()
		return CrossEntropy(lc, target)
	}
	logp := LogSoftmax(logits)
	defer logp.Release()
	if logp.NDim() != 2 {
		flat := logp.Reshape(-1, logp.Dim(-1))
		defer flat.Release()
		tflat := target.Reshape(-1)
		defer tflat.Release()
		return NLLLoss(flat, tflat)
	}
	return NLLLoss(logp, target)
}

// NLLLoss is the mean of -logp[i, target[i]]. As ATen's nll_loss_forward, it allocates the scalar output and
// the scalar total_weight, and saves the log-probabilities, the target and total_weight.
func NLLLoss(logp, target *Tensor) *Tensor {
	logp.check()
	target.check()
	rt := logp.rt
	cols := logp.Dim(1)
	out := rt.Empty(logp.dtype, nil, "nll_loss.out")
	totalWeight := rt.Empty(logp.dtype, nil, "nll_loss.total_weight")
	if rt.dev.Computes() {
		out.data()[0] = device.NLLLoss(logp.host(), target.host(), cols)
		totalWeight.data()[0] = float32(target.Numel())
	}
	if rt.needsGrad(logp) {
		node := rt.node("NllLossBackward0", []*Tensor{logp}, []*Tensor{out}, nil)
		self := node.save("self", logp)
		tgt := node.save("target", target)
		node.save("total_weight", totalWeight)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Zeros(self.dtype, self.shape, "nll_loss.grad", n.rt.category)
			if n.rt.dev.Computes() {
				device.NLLLossBackward(dx.data(), tgt.host(), cols, g[0].host()[0])
			}
			return []*Tensor{dx}
		}
	}
	totalWeight.Release()
	return out
}

// MSELoss is the mean of (x - y)^2. It saves both inputs.
func MSELoss(x, y *Tensor) *Tensor {
	x.check()
	y.check()
	rt := x.rt
	if rt.autocast != F32 && (x.dtype != F32 || y.dtype != F32) {
		xc, yc := fullPrecision(x), fullPrecision(y)
		defer xc.Release()
		defer yc.Release()
		return MSELoss(xc, yc)
	}
	out := rt.Empty(x.dtype, nil, "mse_loss.out")
	if rt.dev.Computes() {
		out.data()[0] = device.MSELoss(x.host(), y.host())
	}
	if rt.needsGrad(x, y) {
		node := rt.node("MseLossBackward0", []*Tensor{x, y}, []*Tensor{out}, nil)
		sx, sy := node.save("self", x), node.save("target", y)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			gv := float32(0)
			if n.rt.dev.Computes() {
				gv = g[0].host()[0]
			}
			if needs[0] {
				grads[0] = n.rt.Empty(sx.dtype, sx.shape, "mse_loss.grad")
				if n.rt.dev.Computes() {
					device.MSELossBackward(grads[0].data(), sx.host(), sy.host(), gv)
				}
			}
			if needs[1] {
				grads[1] = n.rt.Empty(sy.dtype, sy.shape, "mse_loss.grad")
				if n.rt.dev.Computes() {
					device.MSELossBackward(grads[1].data(), sy.host(), sx.host(), gv)
				}
			}
			return grads
		}
	}
	return out
}

// Sum returns the sum of all elements as a scalar. It saves nothing; its backward expands the gradient
// (a view, no allocation).
func Sum(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	out := rt.Empty(x.dtype, nil, "sum.out")
	if rt.dev.Computes() {
		out.data()[0] = device.Sum(x.host())
	}
	if rt.needsGrad(x) {
		shape := slices.Clone(x.shape)
		rt.node("SumBackward0", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{g[0].expand(shape)}
		})
	}
	return out
}

// Mean returns the mean of all elements as a scalar. Its backward allocates the expanded gradient divided by
// the element count.
func Mean(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	count := float32(x.Numel())
	out := rt.Empty(x.dtype, nil, "mean.out")
	if rt.dev.Computes() {
		out.data()[0] = device.Sum(x.host()) / count
	}
	if rt.needsGrad(x) {
		shape := slices.Clone(x.shape)
		rt.node("MeanBackward0", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			e := g[0].expand(shape)
			defer e.Release()
			return []*Tensor{Scale(e, 1/count)}
		})
	}
	return out
}

// expand views a scalar as shape (stride 0), without allocating.
func (t *Tensor) expand(shape []int) *Tensor {
	return t.rt.newObject(t.st, t.dtype, slices.Clone(shape), make([]int, len(shape)), t.offset)
}

func hostOrNil(t *Tensor) []float32 {
	if t == nil {
		return nil
	}
	return t.host()
}

func dataOrNil(t *Tensor) []float32 {
	if t == nil {
		return nil
	}
	return t.data()
}

var _ = snapshot.CategoryUnknown
