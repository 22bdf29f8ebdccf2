package tensor

import (
	"fmt"
	"slices"
)

// NotEqualScalar returns x != v as a new bool tensor of x's shape (a mask; no history).
func NotEqualScalar(x *Tensor, v float32) *Tensor {
	return scalarMask(x, "ne.out", func(a float32) bool { return a != v })
}

// scalarMask returns the bool tensor of where test holds on x's values, a new allocation named role.
func scalarMask(x *Tensor, role string, test func(float32) bool) *Tensor {
	x.check()
	out := x.rt.Empty(Bool, x.shape, role)
	if x.rt.dev.Computes() {
		d, s := out.data(), x.host()
		for i := range d {
			d[i] = 0
			if test(s[i]) {
				d[i] = 1
			}
		}
	}
	return out
}

// CountTrue returns mask.sum(): the trues of a bool mask as a new int64 scalar (no history).
func CountTrue(mask *Tensor) *Tensor {
	mask.check()
	out := mask.rt.Empty(I64, nil, "sum.out")
	if mask.rt.dev.Computes() {
		out.data()[0] = float32(trues(mask.host()))
	}
	return out
}

// MaskRows returns x[mask] for a bool mask whose shape is x's leading dimensions: a new tensor of the rows
// (the positions over the trailing dimensions) where the mask is true, in order. valid is how many trues
// the mask holds; a computing device counts them and they must agree. Autograd saves the mask itself, as
// IndexBackward0 saves a boolean index; the backward allocates zeros of x's shape and puts the gradient's
// rows in them.
func MaskRows(x, mask *Tensor, valid int) *Tensor {
	x.check()
	mask.check()
	rt := x.rt
	lead := mask.NDim()
	if lead > x.NDim() || !slices.Equal(mask.shape, x.shape[:lead]) {
		panic(fmt.Sprintf("tensor: mask %v does not index the leading dimensions of %v", mask.shape, x.shape))
	}
	rest := x.shape[lead:]
	row := 1
	for _, d := range rest {
		row *= d
	}
	out := rt.Empty(x.dtype, append([]int{valid}, rest...), "index.out")
	if rt.dev.Computes() {
		m := mask.host()
		if n := trues(m); n != valid {
			panic(fmt.Sprintf("tensor: the mask holds %d trues, not %d", n, valid))
		}
		d, s := out.data(), x.host()
		i := 0
		for r, on := range m {
			if on != 0 {
				copy(d[i*row:(i+1)*row], s[r*row:(r+1)*row])
				i++
			}
		}
	}
	if rt.needsGrad(x) {
		node := rt.node("IndexBackward0", []*Tensor{x}, []*Tensor{out}, nil)
		saved := node.save("indices", mask)
		full := slices.Clone(x.shape)
		node.apply = func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			dx := n.rt.Zeros(g[0].dtype, full, "index.grad", n.rt.category)
			if n.rt.dev.Computes() {
				d, gv := dx.data(), g[0].host()
				i := 0
				for r, on := range saved.host() {
					if on != 0 {
						copy(d[r*row:(r+1)*row], gv[i*row:(i+1)*row])
						i++
					}
				}
			}
			return []*Tensor{dx}
		}
	}
	return out
}

func trues(m []float32) int {
	n := 0
	for _, v := range m {
		if v != 0 {
			n++
		}
	}
	return n
}

// MarkFirst_ sets mask[0] = True in place: the first entry of the leading dimension, all of it.
func MarkFirst_(mask *Tensor) {
	mask.check()
	if mask.NDim() == 0 || mask.Dim(0) == 0 {
		return
	}
	row := mask.Numel() / mask.Dim(0)
	inplace(mask, func(i int, d []float32) {
		if i < row {
			d[i] = 1
		}
	})
}
