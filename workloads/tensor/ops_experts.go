package tensor

import (
	"cmp"
	"slices"

	"github.com/oomdbg/oomdbg/snapshot"
)

// The ops a mixture-of-experts layer is written in (HF transformers' MixtralSparseMoeBlock): the router's
// top-k, the renormalisation in place, the tokens gathered for an expert, the routing weight each picks and
// the index_add_ that sums the experts' outputs, each saving what its derivatives.yaml formula needs.

// TopK returns the k largest values along the last dimension, largest first, and their int64 indices
// (torch.topk(x, k, dim=-1)). It allocates the values, then the indices, and saves the indices
// (TopkBackward0: indices and the input's sizes); its backward scatters the gradient into zeros of x's shape.
// On a device that computes nothing the indices hold no values: whoever routes by them decides.
func TopK(x *Tensor, k int) (values, indices *Tensor) {
	x.check()
	rt := x.rt
	cols := x.Dim(-1)
	if k < 1 || k > cols {
		errShape("TopK", "k %d out of range for %d columns", k, cols)
	}
	shape := slices.Clone(x.shape)
	shape[len(shape)-1] = k
	values = rt.Empty(x.dtype, shape, "topk.values")
	indices = rt.empty(I64, shape, "topk.indices", rt.category)
	if rt.dev.Computes() {
		v, ix, s := values.data(), indices.data(), x.host()
		order := make([]int, cols)
		for r := range len(s) / cols {
			row := s[r*cols : (r+1)*cols]
			for j := range order {
				order[j] = j
			}
			slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(row[b], row[a]) })
			for j := range k {
				v[r*k+j], ix[r*k+j] = row[order[j]], float32(order[j])
			}
		}
	}
	if rt.needsGrad(x) {
		node := rt.node("TopkBackward0", []*Tensor{x}, []*Tensor{values}, nil)
		saved := node.save("indices", indices)
		full := slices.Clone(x.shape)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Zeros(g[0].dtype, full, "topk.grad", n.rt.category)
			if n.rt.dev.Computes() {
				d, gv, ix := dx.data(), g[0].host(), saved.host()
				for i, j := range ix {
					d[(i/k)*cols+int(j)] += gv[i]
				}
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	return values, indices
}

// SumLast returns the sum over the last dimension, kept as a dimension of 1 (x.sum(dim=-1, keepdim=True)).
// It saves nothing; its backward expands the gradient (a view).
func SumLast(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	dtype := x.dtype
	if d := acSumLast.optDType(x, nil); d != nil {
		dtype = *d
	}
	cols := x.Dim(-1)
	shape := slices.Clone(x.shape)
	shape[len(shape)-1] = 1
	out := rt.Empty(dtype, shape, "sum.out")
	if rt.dev.Computes() {
		d, s := out.data(), x.host()
		for r := range d {
			var sum float32
			for _, v := range s[r*cols : (r+1)*cols] {
				sum += v
			}
			d[r] = sum
		}
		out.round()
	}
	if rt.needsGrad(x) {
		full := slices.Clone(x.shape)
		rt.node("SumBackward1", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{g[0].Expand(full...)}
		})
	}
	return out
}

// Div_ divides x by d in place, d broadcast to x's shape (x /= d), and returns another reference to x, whose
// history now ends in the division. Autograd saves d and, because the formula for d's gradient reads x as it
// was, a copy of x taken before the division (DivBackward0: self, other).
func Div_(x, d *Tensor) *Tensor {
	broadcastable("div_", x, d)
	rt := x.rt
	var original *Tensor
	if rt.needsGrad(x, d) && d.requiresGrad {
		original = rt.cloneAs(x, "div_.original_self", rt.category)
		defer original.Release()
	}
	if rt.dev.Computes() {
		dv := d.hostAs(x.shape)
		inplace(x, func(i int, v []float32) { v[i] /= dv[i] })
	}
	out := x.Ref()
	if rt.needsGrad(x, d) {
		xShape, dShape := slices.Clone(x.shape), slices.Clone(d.shape)
		node := rt.node("DivBackward0", []*Tensor{x, d}, []*Tensor{out}, nil)
		var self *Tensor
		if original != nil {
			self = node.save("self", original)
		}
		other := node.save("other", d)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			rt := n.rt
			grads := make([]*Tensor, 2)
			if needs[0] { // grad / other
				grads[0] = rt.Empty(g[0].dtype, xShape, "div.grad")
				if rt.dev.Computes() {
					dst, gv, ov := grads[0].data(), g[0].host(), other.hostAs(xShape)
					for i := range dst {
						dst[i] = gv[i] / ov[i]
					}
					grads[0].round()
				}
			}
			if needs[1] { // -grad * self / other^2, summed to other's shape
				full := rt.Empty(g[0].dtype, xShape, "div.grad")
				if rt.dev.Computes() {
					dst, gv, sv, ov := full.data(), g[0].host(), self.host(), other.hostAs(xShape)
					for i := range dst {
						dst[i] = -gv[i] * sv[i] / (ov[i] * ov[i])
					}
					full.round()
				}
				grads[1] = rt.sumTo(full, dShape, "div.grad")
				full.Release()
			}
			return grads
		}
	}
	return out
}

// IndexRows returns the rows of the 2-D x at the int64 positions rows holds (x[None, rows].reshape(-1, d),
// as MixtralSparseMoeBlock gathers an expert's tokens): a new (len(rows), d) tensor. It saves the indices
// (IndexBackward0); its backward allocates zeros of x's shape and accumulates the gradient's rows into them
// (index_put_ with accumulate).
func IndexRows(x, rows *Tensor) *Tensor {
	x.check()
	rows.check()
	rt := x.rt
	n, cols := rows.Numel(), x.Dim(1)
	out := rt.Empty(x.dtype, []int{n, cols}, "index.out")
	if rt.dev.Computes() {
		d, s, ix := out.data(), x.host(), rows.host()
		for i, r := range ix {
			copy(d[i*cols:(i+1)*cols], s[int(r)*cols:(int(r)+1)*cols])
		}
	}
	if rt.needsGrad(x) {
		node := rt.node("IndexBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		saved := node.save("indices", rows)
		full := slices.Clone(x.shape)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Zeros(g[0].dtype, full, "index.grad", n.rt.category)
			if n.rt.dev.Computes() {
				d, gv, ix := dx.data(), g[0].host(), saved.host()
				for i, r := range ix {
					for c := range cols {
						d[int(r)*cols+c] += gv[i*cols+c]
					}
				}
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	return out
}

// IndexPairs returns x[rows, cols, None] for the 2-D x and two int64 index tensors of one length: a new
// (len, 1) tensor, as MixtralSparseMoeBlock picks each gathered token's routing weight. It saves the indices
// (IndexBackward0); its backward allocates zeros of x's shape.
func IndexPairs(x, rows, cols *Tensor) *Tensor {
	x.check()
	rt := x.rt
	n, width := rows.Numel(), x.Dim(1)
	out := rt.Empty(x.dtype, []int{n, 1}, "index.out")
	if rt.dev.Computes() {
		d, s, r, c := out.data(), x.host(), rows.host(), cols.host()
		for i := range d {
			d[i] = s[int(r[i])*width+int(c[i])]
		}
	}
	if rt.needsGrad(x) {
		node := rt.node("IndexBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		sr, sc := node.save("indices", rows), node.save("indices", cols)
		full := slices.Clone(x.shape)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Zeros(g[0].dtype, full, "index.grad", n.rt.category)
			if n.rt.dev.Computes() {
				d, gv, r, c := dx.data(), g[0].host(), sr.host(), sc.host()
				for i := range gv {
					d[int(r[i])*width+int(c[i])] += gv[i]
				}
				dx.round()
			}
			return []*Tensor{dx}
		}
	}
	return out
}

// IndexAdd_ adds the rows of src into dst at the int64 positions index holds (dst.index_add_(0, index,
// src)), in place, and returns another reference to dst, whose history now ends in the add. It allocates
// nothing and saves the index and the source (IndexAddBackward0: derivatives.yaml's formula for the source's
// gradient, grad.index_select(dim, index).expand_as(source), reads the source tensor, so autograd keeps it);
// its backward passes dst's gradient through and gathers src's (index_select, a new tensor of src's shape).
func IndexAdd_(dst, index, src *Tensor) *Tensor {
	dst.check()
	index.check()
	src.check()
	rt := dst.rt
	cols := dst.Dim(1)
	if src.dtype != dst.dtype {
		errShape("IndexAdd_", "self (%s) and source (%s) must have the same scalar type", dst.dtype, src.dtype)
	}
	if rt.dev.Computes() {
		d, s, ix := dst.data(), src.host(), index.host()
		for i, r := range ix {
			for c := range cols {
				d[int(r)*cols+c] += s[i*cols+c]
			}
		}
		dst.round()
	}
	out := dst.Ref()
	if rt.needsGrad(dst, src) {
		node := rt.node("IndexAddBackward0", []*Tensor{dst, src}, []*Tensor{out}, nil)
		saved := node.save("index", index)
		node.save("source", src)
		srcShape := slices.Clone(src.shape)
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			if needs[0] {
				grads[0] = g[0].Ref()
			}
			if needs[1] {
				gs := n.rt.Empty(g[0].dtype, srcShape, "index_select.out")
				if n.rt.dev.Computes() {
					d, gv, ix := gs.data(), g[0].host(), saved.host()
					for i, r := range ix {
						copy(d[i*cols:(i+1)*cols], gv[int(r)*cols:(int(r)+1)*cols])
					}
				}
				grads[1] = gs
			}
			return grads
		}
	}
	return out
}

// MeanRows returns the mean over the first dimension of the 2-D x (torch.mean(x, dim=0)). It saves nothing
// (MeanBackward1 keeps the sizes); its backward allocates the gradient expanded to x's shape and divided by
// the row count.
func MeanRows(x *Tensor) *Tensor {
	x.check()
	rt := x.rt
	rows, cols := x.Dim(0), x.Dim(1)
	out := rt.Empty(x.dtype, []int{cols}, "mean.out")
	if rt.dev.Computes() {
		d, s := out.data(), x.host()
		for c := range cols {
			var sum float64
			for r := range rows {
				sum += float64(s[r*cols+c])
			}
			d[c] = float32(sum / float64(rows))
		}
		out.round()
	}
	if rt.needsGrad(x) {
		rt.node("MeanBackward1", []*Tensor{x}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Empty(g[0].dtype, []int{rows, cols}, "mean.grad")
			if n.rt.dev.Computes() {
				d, gv := dx.data(), g[0].host()
				for i := range d {
					d[i] = gv[i%cols] / float32(rows)
				}
				dx.round()
			}
			return []*Tensor{dx}
		})
	}
	return out
}

// Values allocates a tensor of dtype and shape holding values (torch.tensor(values)) with the runtime's
// current category; on a device that computes nothing it holds none, and values may be nil.
func (rt *Runtime) Values(dtype DType, shape []int, values []float32, role string) *Tensor {
	if !rt.dev.Computes() {
		return rt.empty(dtype, shape, role, rt.category)
	}
	return rt.FromValues(dtype, shape, values, role, rt.category)
}

// Temporary allocates an uninitialised tensor outside autograd for what an op computes and no one
// differentiates (a one-hot mask, nonzero's output): it exists for the memory it takes.
func (rt *Runtime) Temporary(dtype DType, shape []int, role string) *Tensor {
	return rt.empty(dtype, shape, role, snapshot.CategoryTemporary)
}
