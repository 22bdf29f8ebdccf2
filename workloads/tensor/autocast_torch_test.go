package tensor

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
)

// cpuAutocast is what testdata/cpu_autocast.py measures with PyTorch's CPU autocast.
type cpuAutocast struct {
	Version   string
	Linear    string
	Casts     map[string][][]int
	Recompute map[string][]string
}

var torchNames = map[DType]string{F32: "float32", F16: "float16", BF16: "bfloat16"}

// castShapes returns the shapes of the casts to bfloat16 in a log of allocation labels.
func castShapes(labels []string) [][]int {
	var out [][]int
	for _, l := range labels {
		if !strings.HasSuffix(l, " to.bf16") {
			continue
		}
		dims := strings.Split(l[strings.IndexByte(l, '[')+1:strings.IndexByte(l, ']')], ",")
		shape := make([]int, len(dims))
		for i, d := range dims {
			shape[i], _ = strconv.Atoi(d)
		}
		out = append(out, shape)
	}
	return out
}

// TestAutocastMatchesPyTorchCPU compares, where PyTorch's CPU autocast follows the same rule as CUDA's, what
// the runtime does with what python3-torch does:
//   - the weight-cast cache (cached_cast, aten/src/ATen/autocast_mode.cpp): two linears on one weight and
//     bias cast the weight and bias once, with grad on and under no_grad alike, and every time when the
//     weight does not require grad; the order of the casts is PyTorch's too;
//   - checkpoint re-entering autocast for the recompute (CheckpointFunction.backward,
//     torch/utils/checkpoint.py): the checkpointed linear's output has the forward's dtype in the recompute,
//     bfloat16 when the forward ran under autocast, float32 when it did not, even when backward runs under
//     autocast.
func TestAutocastMatchesPyTorchCPU(t *testing.T) {
	var want cpuAutocast
	torchtest.RunFile(t, "testdata/cpu_autocast.py", &want)
	if want.Linear != "bfloat16" {
		t.Fatalf("PyTorch %s: linear under CPU autocast gives %s; the comparison needs it in the lower-precision list", want.Version, want.Linear)
	}

	casts := func(grad, weightRequiresGrad bool) [][]int {
		rt, log := newLogged(device.Meta)
		w := rt.Zeros(F32, []int{64, 32}, "w", snapshot.CategoryParameter).SetRequiresGrad(weightRequiresGrad)
		b := rt.Zeros(F32, []int{64}, "b", snapshot.CategoryParameter).SetRequiresGrad(weightRequiresGrad)
		x := rt.Zeros(F32, []int{16, 32}, "x", snapshot.CategoryInput)
		log.take()
		prev := rt.SetGradEnabled(grad)
		rt.Autocast(BF16, func() {
			Linear(x, w, b).Release()
			Linear(x, w, b).Release()
		})
		rt.SetGradEnabled(prev)
		return castShapes(log.take())
	}
	for name, args := range map[string][2]bool{"grad": {true, true}, "no_grad": {false, true}, "no_grad, frozen weight": {false, false}} {
		if got := casts(args[0], args[1]); !slices.EqualFunc(got, want.Casts[name], slices.Equal) {
			t.Errorf("%s: casts of shapes %v, PyTorch %s %v", name, got, want.Version, want.Casts[name])
		}
	}

	recompute := func(forward, backward DType) []string {
		rt := newMeta(t, 1<<30)
		w := rt.Zeros(F32, []int{6, 8}, "w", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("w")
		b := rt.Zeros(F32, []int{6}, "b", snapshot.CategoryParameter).SetRequiresGrad(true).SetName("b")
		x := rt.Zeros(F32, []int{4, 8}, "x", snapshot.CategoryInput).SetRequiresGrad(true)
		var seen []string
		f := func(h *Tensor) *Tensor {
			y := Linear(h, w, b)
			defer y.Release()
			seen = append(seen, torchNames[y.DType()])
			return ReLU(y)
		}
		var out *Tensor
		within(rt, forward, func() { out = Checkpoint(f, x) })
		within(rt, backward, func() {
			o := ToDType(out, F32)
			s := Sum(o)
			s.Backward(false)
			s.Release()
			o.Release()
		})
		out.Release()
		return seen
	}
	for name, args := range map[string][2]DType{"autocast": {BF16, F32}, "off, backward under autocast": {F32, BF16}} {
		if got := recompute(args[0], args[1]); !slices.Equal(got, want.Recompute[name]) {
			t.Errorf("%s: the checkpointed linear gave %v (forward, recompute), PyTorch %s %v", name, got, want.Version, want.Recompute[name])
		}
	}
}

// within runs f under autocast to dtype, or as it is for F32.
func within(rt *Runtime, dtype DType, f func()) {
	if dtype == F32 {
		f()
		return
	}
	rt.Autocast(dtype, f)
}
