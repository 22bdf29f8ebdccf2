package tensor

import (
	"slices"

	"github.com/oomdbg/oomdbg/workloads/device"
)

// Softmax is softmax over the last dimension. It saves its result.
func Softmax(x *Tensor) *Tensor {
	return softmaxLike(acSoftmax, x, nil, "softmax.out", "SoftmaxBackward0", device.Softmax, device.SoftmaxBackward)
}

// SoftmaxDType is softmax(x, dim=-1, dtype=dtype): x converted to dtype first (eager attention's float32
// softmax of 16-bit scores).
func SoftmaxDType(x *Tensor, dtype DType) *Tensor {
	return softmaxLike(acSoftmax, x, &dtype, "softmax.out", "SoftmaxBackward0", device.Softmax, device.SoftmaxBackward)
}

// LogSoftmax is log-softmax over the last dimension. It saves its result.
func LogSoftmax(x *Tensor) *Tensor { return logSoftmax(x, nil) }

// logSoftmax is log_softmax(x, -1, dtype); a nil dtype is unset.
func logSoftmax(x *Tensor, dtype *DType) *Tensor {
	return softmaxLike(acLogSoftmax, x, dtype, "log_softmax.out", "LogSoftmaxBackward0", device.LogSoftmax, device.LogSoftmaxBackward)
}

// softmaxLike is ATen's softmax(input, dim, dtype) and log_softmax(input, dim, dtype) (SoftMax.cpp), with
// autocast's fp32_set_opt_dtype in front: a float16 input asked for float32 runs _softmax(half_to_float=true),
// reading the half values and writing a float32 result, with no copy, and its backward writes the float16
// gradient itself; any other dtype is converted first (toType: a copy, not saved), and the engine converts
// the gradient back.
func softmaxLike(rule *AutocastRule, x *Tensor, dtype *DType, role, name string, fwd func(dst, x []float32, cols int), bwd func(dx, dy, y []float32, cols int)) *Tensor {
	x.check()
	rt := x.rt
	dtype = rule.optDType(x, dtype)
	defer rt.withoutAutocast()()
	outDType := x.dtype
	if dtype != nil && *dtype != x.dtype {
		if x.dtype == F16 && *dtype == F32 {
			outDType = F32 // half_to_float
		} else {
			xc := ToDType(x, *dtype)
			defer xc.Release()
			x, outDType = xc, *dtype
		}
	}
	inDType := x.dtype
	cols := x.Dim(-1)
	out := rt.Empty(outDType, x.shape, role)
	if rt.dev.Computes() {
		fwd(out.data(), x.host(), cols)
		out.round()
	}
	if rt.needsGrad(x) {
		node := rt.node(name, []*Tensor{x}, []*Tensor{out}, nil)
		result := node.save("result", out)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			// _softmax_backward_data(grad, result, dim, input_dtype): the gradient in the input's dtype.
			dx := n.rt.Empty(inDType, g[0].shape, role+".grad")
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
	if in, ok := acLayerNorm.cast(rt, x, weight, bias); ok {
		defer releaseAll(in)
		defer rt.withoutAutocast()()
		return LayerNorm(in[0], in[1], in[2], eps)
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

// CrossEntropy is F.cross_entropy(logits, target) with mean reduction over rows, composed as ATen's
// cross_entropy_loss_symint composes it (LossNLL.cpp): log_softmax(logits, dim, logits.dtype), then
// nll_loss. CUDA autocast does not list cross_entropy, so under autocast the explicit dtype keeps the
// log-probabilities in the logits' dtype and nll_loss (fp32 policy) converts them to float32 and saves the
// copy: 16-bit logits leave 2 + 4 bytes per logit saved for backward; float32 ones 4 (one tensor saved by
// both). logits is (n, classes) or (..., classes) viewed as rows; target holds class indices.
func CrossEntropy(logits, target *Tensor) *Tensor { return crossEntropy(logits, target, false) }

// CrossEntropySum is cross_entropy(logits, target, reduction="sum"): CrossEntropy's tensors, the sum of the
// rows' losses instead of their mean.
func CrossEntropySum(logits, target *Tensor) *Tensor { return crossEntropy(logits, target, true) }

func crossEntropy(logits, target *Tensor, sum bool) *Tensor {
	logits.check()
	dtype := logits.dtype
	logp := logSoftmax(logits, &dtype)
	defer logp.Release()
	if logp.NDim() != 2 {
		flat := logp.Reshape(-1, logp.Dim(-1))
		defer flat.Release()
		tflat := target.Reshape(-1)
		defer tflat.Release()
		return nllLoss(flat, tflat, sum)
	}
	return nllLoss(logp, target, sum)
}

// NLLLoss is the mean of -logp[i, target[i]]. As ATen's nll_loss_forward, it allocates the scalar output and
// the scalar total_weight, and saves the log-probabilities, the target and total_weight. Under autocast
// (fp32 policy) 16-bit log-probabilities are converted to float32 first, and the copy is what it saves.
func NLLLoss(logp, target *Tensor) *Tensor { return nllLoss(logp, target, false) }

// nllLoss is nll_loss with reduction mean, or sum.
func nllLoss(logp, target *Tensor, sum bool) *Tensor {
	if in, ok := acNLLLoss.cast(logp.rt, logp); ok {
		defer releaseAll(in)
		defer logp.rt.withoutAutocast()()
		return nllLoss(in[0], target, sum)
	}
	logp.check()
	target.check()
	rt := logp.rt
	cols := logp.Dim(1)
	out := rt.Empty(logp.dtype, nil, "nll_loss.out")
	totalWeight := rt.Empty(logp.dtype, nil, "nll_loss.total_weight")
	if rt.dev.Computes() {
		count := float32(device.NLLCount(target.host()))
		out.data()[0] = device.NLLLoss(logp.host(), target.host(), cols)
		if sum {
			out.data()[0] *= count
		}
		totalWeight.data()[0] = count
	}
	if rt.needsGrad(logp) {
		node := rt.node("NllLossBackward0", []*Tensor{logp}, []*Tensor{out}, nil)
		self := node.save("self", logp)
		tgt := node.save("target", target)
		node.save("total_weight", totalWeight)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Zeros(self.dtype, self.shape, "nll_loss.grad", n.rt.category)
			if n.rt.dev.Computes() {
				gv := g[0].host()[0]
				if sum { // each counted row's gradient is -g, not -g/count
					gv *= float32(device.NLLCount(tgt.host()))
				}
				device.NLLLossBackward(dx.data(), tgt.host(), cols, gv)
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
	if in, ok := acMSELoss.cast(rt, x, y); ok {
		defer releaseAll(in)
		defer rt.withoutAutocast()()
		return MSELoss(in[0], in[1])
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
// (a view, no allocation). Under autocast (fp32_set_opt_dtype) it sums a 16-bit input into a float32
// result, reading the input as it is.
func Sum(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	dtype := x.dtype
	if d := acSum.optDType(x, nil); d != nil {
		dtype = *d
	}
	out := rt.Empty(dtype, nil, "sum.out")
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
