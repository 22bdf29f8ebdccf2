package tensor

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

// policyCase builds one op of the autocast policy on inputs whose floating ones have dtype in (float32
// weights stay float32, as parameters are), and returns its output and the dtypes of its floating inputs, the
// op's main input first.
type policyCase func(rt *Runtime, in DType) (out *Tensor, inputs []DType)

// leaf makes a tensor that requires grad, so that every op saves what it saves for backward.
func leaf(rt *Runtime, dtype DType, shape ...int) *Tensor {
	return rt.Zeros(dtype, shape, "leaf", snapshot.CategoryInput).SetRequiresGrad(true)
}

func indices(rt *Runtime, shape ...int) *Tensor {
	return rt.Zeros(I64, shape, "indices", snapshot.CategoryInput)
}

var policyCases = map[string]policyCase{
	"Linear": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return Linear(leaf(rt, in, 3, 4), leaf(rt, F32, 5, 4), leaf(rt, F32, 5)), []DType{in, F32, F32}
	},
	"Matmul": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return Matmul(leaf(rt, in, 3, 4), leaf(rt, in, 4, 5)), []DType{in, in}
	},
	"ScaledDotProductAttention": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return ScaledDotProductAttention(leaf(rt, in, 1, 2, 4, 8), leaf(rt, in, 1, 2, 4, 8), leaf(rt, in, 1, 2, 4, 8), true, 0, true),
			[]DType{in, in, in}
	},
	"Softmax":    func(rt *Runtime, in DType) (*Tensor, []DType) { return Softmax(leaf(rt, in, 3, 5)), []DType{in} },
	"LogSoftmax": func(rt *Runtime, in DType) (*Tensor, []DType) { return LogSoftmax(leaf(rt, in, 3, 5)), []DType{in} },
	"Sum":        func(rt *Runtime, in DType) (*Tensor, []DType) { return Sum(leaf(rt, in, 3, 5)), []DType{in} },
	"Mean":       func(rt *Runtime, in DType) (*Tensor, []DType) { return Mean(leaf(rt, in, 3, 5)), []DType{in} },
	"LayerNorm": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return LayerNorm(leaf(rt, in, 3, 5), leaf(rt, F32, 5), leaf(rt, F32, 5), 1e-5), []DType{in, F32, F32}
	},
	"NLLLoss": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return NLLLoss(leaf(rt, in, 3, 5), indices(rt, 3)), []DType{in}
	},
	"MSELoss": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return MSELoss(leaf(rt, in, 3, 5), leaf(rt, in, 3, 5)), []DType{in, in}
	},
	"CrossEntropy": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return CrossEntropy(leaf(rt, in, 3, 5), indices(rt, 3)), []DType{in}
	},
	"Embedding": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return Embedding(indices(rt, 2, 3), leaf(rt, in, 7, 4)), []DType{in}
	},
	"GELU": func(rt *Runtime, in DType) (*Tensor, []DType) { return GELU(leaf(rt, in, 3, 5)), []DType{in} },
	"ReLU": func(rt *Runtime, in DType) (*Tensor, []DType) { return ReLU(leaf(rt, in, 3, 5)), []DType{in} },
	"Dropout": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return Dropout(leaf(rt, in, 3, 5), 0.5, true), []DType{in}
	},
	"Add": func(rt *Runtime, in DType) (*Tensor, []DType) { // the residual stream: float32 plus a block's output
		return Add(leaf(rt, F32, 3, 5), leaf(rt, in, 3, 5)), []DType{F32, in}
	},
	"Mul": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return Mul(leaf(rt, in, 3, 5), leaf(rt, in, 3, 5)), []DType{in, in}
	},
	"Scale":    func(rt *Runtime, in DType) (*Tensor, []DType) { return Scale(leaf(rt, in, 3, 5), 0.5), []DType{in} },
	"Pow":      func(rt *Runtime, in DType) (*Tensor, []DType) { return Pow(leaf(rt, in, 3, 5), 2), []DType{in} },
	"MeanLast": func(rt *Runtime, in DType) (*Tensor, []DType) { return MeanLast(leaf(rt, in, 3, 5)), []DType{in} },
	"AddScalar": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return AddScalar(leaf(rt, in, 3, 5), 1e-6), []DType{in}
	},
	"Rsqrt": func(rt *Runtime, in DType) (*Tensor, []DType) { return Rsqrt(leaf(rt, in, 3, 5)), []DType{in} },
	"Neg":   func(rt *Runtime, in DType) (*Tensor, []DType) { return Neg(leaf(rt, in, 3, 5)), []DType{in} },
	"SiLU":  func(rt *Runtime, in DType) (*Tensor, []DType) { return SiLU(leaf(rt, in, 3, 5)), []DType{in} },
	"Cos":   func(rt *Runtime, in DType) (*Tensor, []DType) { return Cos(leaf(rt, in, 3, 5)), []DType{in} },
	"Sin":   func(rt *Runtime, in DType) (*Tensor, []DType) { return Sin(leaf(rt, in, 3, 5)), []DType{in} },
	"Cat": func(rt *Runtime, in DType) (*Tensor, []DType) { // rotary's halves, and a float32 with a 16-bit one
		return Cat([]*Tensor{leaf(rt, in, 3, 2), leaf(rt, F32, 3, 2)}, -1), []DType{in, F32}
	},
	"Tanh":     func(rt *Runtime, in DType) (*Tensor, []DType) { return Tanh(leaf(rt, in, 3, 5)), []DType{in} },
	"GELUTanh": func(rt *Runtime, in DType) (*Tensor, []DType) { return GELUTanh(leaf(rt, in, 3, 5)), []DType{in} },
	"Sigmoid":  func(rt *Runtime, in DType) (*Tensor, []DType) { return Sigmoid(leaf(rt, in, 3, 5)), []DType{in} },
	"TopK": func(rt *Runtime, in DType) (*Tensor, []DType) {
		v, _ := TopK(leaf(rt, in, 3, 5), 2)
		return v, []DType{in}
	},
	"SumLast": func(rt *Runtime, in DType) (*Tensor, []DType) { return SumLast(leaf(rt, in, 3, 5)), []DType{in} },
	"Div_": func(rt *Runtime, in DType) (*Tensor, []DType) { // the router's top-k weights over their sum
		x := Neg(leaf(rt, in, 3, 5))
		return Div_(x, leaf(rt, in, 3, 1)), []DType{in, in}
	},
	"IndexRows": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return IndexRows(leaf(rt, in, 4, 5), indices(rt, 3)), []DType{in}
	},
	"IndexPairs": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return IndexPairs(leaf(rt, in, 4, 2), indices(rt, 3), indices(rt, 3)), []DType{in}
	},
	"IndexAdd_": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return IndexAdd_(rt.Zeros(in, []int{4, 5}, "zeros", snapshot.CategoryInput), indices(rt, 3), leaf(rt, in, 3, 5)), []DType{in}
	},
	"MeanRows": func(rt *Runtime, in DType) (*Tensor, []DType) { return MeanRows(leaf(rt, in, 3, 5)), []DType{in} },
	"Rsub":     func(rt *Runtime, in DType) (*Tensor, []DType) { return Rsub(leaf(rt, in, 3, 5), 1), []DType{in} },
	"MaskedFill": func(rt *Runtime, in DType) (*Tensor, []DType) {
		return MaskedFill(leaf(rt, in, 3, 5), rt.Zeros(Bool, []int{3, 5}, "mask", snapshot.CategoryInput), 0), []DType{in}
	},
}

// savedBy lists what the graph behind t saves, as "Node slot dtype", sorted, leaves and their
// AccumulateGrad nodes left out.
func savedBy(t *Tensor) []string {
	var out []string
	seen := map[*Node]bool{}
	queue := []*Node{t.gradFn}
	for len(queue) > 0 {
		n := queue[0]
		queue = queue[1:]
		if n == nil || seen[n] || n.leaf != nil {
			continue
		}
		seen[n] = true
		for _, s := range n.saved {
			out = append(out, fmt.Sprintf("%s %s %v", n.name, s.owner.slot, s.dtype))
		}
		for _, e := range n.next {
			queue = append(queue, e.node)
		}
	}
	slices.Sort(out)
	return out
}

// TestAutocastPolicyIsWhatTheOpsDo runs every op of AutocastPolicy under autocast to float16 and bfloat16,
// on 16-bit and on float32 inputs, and checks the dtype of its output and what its backward saves, in which
// dtype, against its row: the table, and docs/autocast.md generated from it, say what the code does. Every op
// of the table must have a case here.
func TestAutocastPolicyIsWhatTheOpsDo(t *testing.T) {
	for _, rule := range AutocastPolicy {
		build, ok := policyCases[rule.Func]
		if !ok {
			t.Errorf("no case runs %s (%s)", rule.Func, rule.Op)
			continue
		}
		for _, ac := range []DType{F16, BF16} {
			for _, in := range []DType{ac, F32} {
				t.Run(fmt.Sprintf("%s/%v/%v input", rule.Func, ac, in), func(t *testing.T) {
					rt := newMeta(t, 1<<30)
					var out *Tensor
					var inputs []DType
					rt.Autocast(ac, func() { out, inputs = build(rt, in) })
					if want := rule.Output.Resolve(ac, inputs...); out.DType() != want {
						t.Errorf("output %v, table says %v (%v)", out.DType(), want, rule.Output)
					}
					var want []string
					for _, s := range rule.Saved {
						want = append(want, fmt.Sprintf("%s %s %v", s.Node, s.Slot, s.DType.Resolve(ac, inputs...)))
					}
					slices.Sort(want)
					if got := savedBy(out); !slices.Equal(got, want) {
						t.Errorf("saved for backward:\n  %s\ntable says:\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
					}
				})
			}
		}
	}
	for name := range policyCases {
		if !slices.ContainsFunc(AutocastPolicy, func(r *AutocastRule) bool { return r.Func == name }) {
			t.Errorf("%s has a case but no row in AutocastPolicy", name)
		}
	}
}
