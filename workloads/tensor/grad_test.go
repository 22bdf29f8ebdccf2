package tensor

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// newCPU returns a runtime on a cpu device with a fixed seed, so that two runtimes draw the same dropout masks.
func newCPU(t testing.TB) *Runtime {
	t.Helper()
	return NewRuntime(device.NewSimulated(device.CPU, 0, 1<<30, 0, allocator.DefaultConfig()), nil, 7)
}

// newMeta returns a runtime on a meta device.
func newMeta(t testing.TB, capacity uint64) *Runtime {
	t.Helper()
	return NewRuntime(device.NewSimulated(device.Meta, 0, capacity, 0, allocator.DefaultConfig()), nil, 7)
}

// input is a leaf of a gradient check: its shape, values and whether it is checked.
type input struct {
	shape  []int
	values []float32
	dtype  DType
	noGrad bool // e.g. class indices
}

func randInput(r *rand.Rand, shape ...int) input {
	v := make([]float32, numel(shape))
	for i := range v {
		v[i] = float32(r.NormFloat64())
	}
	return input{shape: shape, values: v}
}

// weightedSum makes any output a scalar whose gradient is not uniform: Σ y * w with fixed random w.
func weightedSum(y *Tensor) *Tensor {
	r := rand.New(rand.NewPCG(11, uint64(y.Numel())))
	w := make([]float32, y.Numel())
	for i := range w {
		w[i] = float32(r.NormFloat64())
	}
	wt := y.rt.FromValues(F32, y.shape, w, "w", snapshot.CategoryInput)
	defer wt.Release()
	yc := y.Contiguous()
	defer yc.Release()
	m := Mul(yc, wt)
	defer m.Release()
	return Sum(m)
}

// gradCheck compares the gradients autograd computes for build's scalar output with central finite
// differences, and checks that releasing everything returns every byte to the allocator.
func gradCheck(t *testing.T, inputs []input, build func(rt *Runtime, xs []*Tensor) *Tensor) {
	t.Helper()
	leaves := func(rt *Runtime, override int, pos int, delta float32) []*Tensor {
		xs := make([]*Tensor, len(inputs))
		for i, in := range inputs {
			v := append([]float32(nil), in.values...)
			if i == override {
				v[pos] += delta
			}
			xs[i] = rt.FromValues(in.dtype, in.shape, v, "x", snapshot.CategoryInput)
			if !in.noGrad {
				xs[i].SetRequiresGrad(true)
			}
		}
		return xs
	}
	release := func(xs []*Tensor) {
		for _, x := range xs {
			x.Release()
		}
	}

	rt := newCPU(t)
	xs := leaves(rt, -1, 0, 0)
	loss := build(rt, xs)
	loss.Backward(false)
	analytic := make([][]float32, len(xs))
	for i, x := range xs {
		if x.Grad() != nil {
			analytic[i] = x.Grad().Values()
		}
	}
	loss.Release()
	release(xs)
	if got := allocated(rt); got != 0 {
		t.Errorf("%d bytes still allocated after releasing everything", got)
	}
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d tensor references still live", n)
	}

	eval := func(i, j int, d float32) float64 {
		rt := newCPU(t)
		xs := leaves(rt, i, j, d)
		var v float32
		rt.NoGrad(func() {
			l := build(rt, xs)
			v = l.Item()
			l.Release()
		})
		release(xs)
		return float64(v)
	}
	const h = 1e-2
	for i, in := range inputs {
		if in.noGrad {
			continue
		}
		if analytic[i] == nil {
			t.Errorf("input %d got no gradient", i)
			continue
		}
		for j := range in.values {
			num := (eval(i, j, h) - eval(i, j, -h)) / (2 * h)
			if d := math.Abs(num - float64(analytic[i][j])); d > 2e-2*(1+math.Abs(num)) {
				t.Errorf("input %d element %d: autograd %.5f, finite difference %.5f", i, j, analytic[i][j], num)
			}
		}
	}
}

func TestGradients(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 1))
	tests := map[string]struct {
		inputs []input
		build  func(rt *Runtime, xs []*Tensor) *Tensor
	}{
		"linear 2d": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 5, 4), randInput(r, 5)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Linear(xs[0], xs[1], xs[2])) },
		},
		"linear 3d": {
			inputs: []input{randInput(r, 2, 3, 4), randInput(r, 5, 4), randInput(r, 5)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Linear(xs[0], xs[1], xs[2])) },
		},
		"linear without bias": {
			inputs: []input{randInput(r, 2, 3, 4), randInput(r, 5, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Linear(xs[0], xs[1], nil)) },
		},
		"matmul batched transposed": {
			inputs: []input{randInput(r, 2, 3, 2, 4), randInput(r, 2, 3, 2, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				q := xs[0].Transpose(1, 2) // (2,2,3,4), not contiguous
				defer q.Release()
				k := xs[1].Transpose(1, 2)
				defer k.Release()
				kt := k.Transpose(-2, -1)
				defer kt.Release()
				return out(weightedSum, Matmul(q, kt))
			},
		},
		"add broadcast": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Add(xs[0], xs[1])) },
		},
		"mul": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Mul(xs[0], xs[1])) },
		},
		"mul broadcast over middle dimensions": { // rotary: q (B,H,T,D) * cos (1,1,T,D)
			inputs: []input{randInput(r, 2, 3, 4, 2), randInput(r, 1, 1, 4, 2)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Mul(xs[1], xs[0])) },
		},
		"add broadcast over heads": { // an additive mask (B,1,T,T) over scores (B,H,T,T)
			inputs: []input{randInput(r, 2, 3, 4, 4), randInput(r, 2, 1, 4, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Add(xs[0], xs[1])) },
		},
		"pow": {
			inputs: []input{randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Pow(xs[0], 2)) },
		},
		"rsqrt": {
			inputs: []input{{shape: []int{2, 3}, values: []float32{0.5, 0.8, 1, 1.5, 2.5, 4}}},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Rsqrt(xs[0])) },
		},
		"neg and add scalar": {
			inputs: []input{randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, out(Neg, AddScalar(xs[0], 0.25))) },
		},
		"silu": {
			inputs: []input{randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, SiLU(xs[0])) },
		},
		"cos and sin": {
			inputs: []input{randInput(r, 3, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				c := Cos(xs[0])
				defer c.Release()
				return out(weightedSum, out(func(s *Tensor) *Tensor { return Mul(c, s) }, Sin(xs[0])))
			},
		},
		"mean of the last dimension": {
			inputs: []input{randInput(r, 2, 3, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				sq := Mul(xs[0], xs[0])
				defer sq.Release()
				return out(weightedSum, MeanLast(sq))
			},
		},
		"cat of halves": { // rotate_half: cat(-x2, x1)
			inputs: []input{randInput(r, 2, 3, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				x1, x2 := xs[0].Narrow(-1, 0, 2), xs[0].Narrow(-1, 2, 2)
				defer x1.Release()
				defer x2.Release()
				n := Neg(x2)
				defer n.Release()
				return out(weightedSum, Cat([]*Tensor{n, x1}, -1))
			},
		},
		"unsqueeze, expand and reshape": { // repeat_kv
			inputs: []input{randInput(r, 2, 2, 3, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				u := xs[0].Unsqueeze(2)
				defer u.Release()
				e := u.Expand(2, 2, 3, 3, 4)
				defer e.Release()
				return out(weightedSum, e.Reshape(2, 6, 3, 4))
			},
		},
		"mul same input": {
			inputs: []input{randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Mul(xs[0], xs[0])) },
		},
		"scale": {
			inputs: []input{randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Scale(xs[0], -0.5)) },
		},
		"reciprocal": {
			inputs: []input{{shape: []int{2, 3}, values: []float32{0.5, 0.8, 1, 1.5, -0.7, -2}}},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Reciprocal(xs[0])) },
		},
		"relu": {
			inputs: []input{awayFromZero(randInput(r, 3, 4))},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, ReLU(xs[0])) },
		},
		"gelu": {
			inputs: []input{randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, GELU(xs[0])) },
		},
		"dropout": {
			inputs: []input{randInput(r, 4, 8)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Dropout(xs[0], 0.3, true)) },
		},
		"softmax": {
			inputs: []input{randInput(r, 3, 5)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Softmax(xs[0])) },
		},
		"log_softmax": {
			inputs: []input{randInput(r, 3, 5)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, LogSoftmax(xs[0])) },
		},
		"layer_norm": {
			inputs: []input{randInput(r, 2, 3, 5), randInput(r, 5), randInput(r, 5)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				return out(weightedSum, LayerNorm(xs[0], xs[1], xs[2], 1e-5))
			},
		},
		"embedding": {
			inputs: []input{{shape: []int{2, 3}, values: []float32{1, 3, 1, 0, 2, 3}, dtype: I64, noGrad: true}, randInput(r, 4, 5)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return out(weightedSum, Embedding(xs[0], xs[1])) },
		},
		"cross_entropy": {
			inputs: []input{randInput(r, 2, 3, 5), {shape: []int{2, 3}, values: []float32{4, 0, 2, 1, 1, 3}, dtype: I64, noGrad: true}},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return CrossEntropy(xs[0], xs[1]) },
		},
		"mse": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 3, 4)},
			build:  func(rt *Runtime, xs []*Tensor) *Tensor { return MSELoss(xs[0], xs[1]) },
		},
		"mean": {
			inputs: []input{randInput(r, 3, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				sq := Mul(xs[0], xs[0])
				defer sq.Release()
				return Mean(sq)
			},
		},
		"views": {
			inputs: []input{randInput(r, 2, 3, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				v := xs[0].View(6, 4)
				defer v.Release()
				tr := v.T() // (4,6), not contiguous
				defer tr.Release()
				re := tr.Reshape(2, 12) // needs a copy
				defer re.Release()
				return out(weightedSum, GELU(re))
			},
		},
		"split": {
			inputs: []input{randInput(r, 3, 6)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				parts := xs[0].Split(2, 1)
				defer releaseAll(parts)
				a := Mul(parts[0], parts[2])
				return out(weightedSum, a) // parts[1] gets no gradient: zeros in the split's backward
			},
		},
		"masked fill and narrow": {
			inputs: []input{randInput(r, 2, 2, 3, 3)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				tril := rt.Tril(4, "bias", snapshot.CategoryParameter)
				defer tril.Release()
				m4 := tril.View(1, 1, 4, 4)
				defer m4.Release()
				m3 := m4.Narrow(2, 0, 3)
				defer m3.Release()
				m := m3.Narrow(3, 0, 3)
				defer m.Release()
				causal := EqualScalar(m, 0)
				defer causal.Release()
				f := MaskedFill(xs[0], causal, -1e9)
				return out(weightedSum, out(Softmax, f))
			},
		},
		"narrow of a tracked tensor": {
			inputs: []input{randInput(r, 3, 5)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				return out(weightedSum, xs[0].Narrow(1, 1, 3))
			},
		},
		"flash attention": {
			inputs: []input{randInput(r, 2, 2, 4, 3), randInput(r, 2, 2, 4, 3), randInput(r, 2, 2, 4, 3)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				return out(weightedSum, ScaledDotProductAttention(xs[0], xs[1], xs[2], true, 0, true))
			},
		},
		"flash attention with dropout": {
			inputs: []input{randInput(r, 1, 2, 4, 3), randInput(r, 1, 2, 4, 3), randInput(r, 1, 2, 4, 3)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				return out(weightedSum, ScaledDotProductAttention(xs[0], xs[1], xs[2], true, 0.3, true))
			},
		},
		"flash attention with grouped key-value heads": {
			inputs: []input{randInput(r, 2, 4, 3, 2), randInput(r, 2, 2, 3, 2), randInput(r, 2, 2, 3, 2)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				return out(weightedSum, FlashAttention(xs[0], xs[1], xs[2], true, 0, true))
			},
		},
		"checkpoint of several inputs, one that needs no gradient": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 4, 4), {shape: []int{3, 4}, values: make([]float32, 12), noGrad: true}},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				y := CheckpointInputs(func(in, _ []*Tensor) *Tensor {
					h := Linear(in[0], xs[1], nil)
					defer h.Release()
					m := Add(h, in[1])
					defer m.Release()
					return SiLU(m)
				}, []*Tensor{xs[0], xs[2]})
				return out(weightedSum, y)
			},
		},
		"4-bit matmul": { // the frozen 4-bit weight is quantized the same way in every evaluation
			inputs: []input{randInput(r, 3, 64), {shape: []int{5, 64}, values: randInput(r, 5, 64).values, noGrad: true}},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				q := Quantize4Bit(xs[1], snapshot.CategoryParameter)
				defer q.Release()
				return out(weightedSum, MatMul4Bit(xs[0], q, nil))
			},
		},
		"checkpoint": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 4, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				y := Checkpoint(func(x *Tensor) *Tensor {
					h := Linear(x, xs[1], nil)
					defer h.Release()
					d := Dropout(h, 0.25, true) // the recompute must draw the same mask
					defer d.Release()
					return GELU(d)
				}, xs[0])
				return out(weightedSum, y)
			},
		},
		"shared subexpression": {
			inputs: []input{randInput(r, 3, 4), randInput(r, 4, 4)},
			build: func(rt *Runtime, xs []*Tensor) *Tensor {
				h := Linear(xs[0], xs[1], nil)
				defer h.Release()
				g := GELU(h)
				defer g.Release()
				s := Add(g, h) // h's gradient arrives twice and is accumulated
				return out(weightedSum, s)
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) { gradCheck(t, tc.inputs, tc.build) })
	}
}

// out applies f to y and releases y: ops chain without leaking references.
func out(f func(*Tensor) *Tensor, y *Tensor) *Tensor {
	defer y.Release()
	return f(y)
}

func awayFromZero(in input) input {
	for i, v := range in.values {
		if math.Abs(float64(v)) < 0.1 {
			in.values[i] = 0.5
		}
	}
	return in
}

// allocated returns the bytes the runtime's allocator has handed out (memory_allocated()).
func allocated(rt *Runtime) int64 {
	st := rt.dev.Allocator().Stats()
	return st.AllocatedBytes.All().Current
}
