package nn

import (
	"github.com/oomdbg/oomdbg/allocator"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// TestOldBitsandbytesDequantizesHalf holds Linear4bit to bitsandbytes' sources on a bfloat16 weight.
// Before 0.43.0, Params4bit.cuda quantizes self.data.contiguous().half(), so the quant state is float16, and
// MatMul4Bit's F.linear(A, F.dequantize_4bit(B, state).to(A.dtype).t()) holds the float16 weight and its
// bfloat16 copy together: 4*out*in bytes above the start of the forward, more than the output's
// 2*rows*out. From 0.43.0 (#970) the state keeps the weight's dtype and .to copies nothing: the dequantized
// weight and the output, 2*out*in + 2*rows*out. The backward's
// F.dequantize_4bit(B, ctx.state).to(grad_output.dtype) does the same.
func TestOldBitsandbytesDequantizesHalf(t *testing.T) {
	const out, in, rows = 1024, 512, 4 // every size a multiple of the allocator's 512 bytes
	weight := int64(out * in * 2)
	output := int64(rows * out * 2)
	for _, tc := range []struct {
		half                 bool
		state                tensor.DType
		forward, backwardMin int64
	}{
		{half: true, state: tensor.F16, forward: 2 * weight, backwardMin: 2 * weight},
		{half: false, state: tensor.BF16, forward: weight + output, backwardMin: weight},
	} {
		rt := tensor.NewRuntime(device.NewSimulated(device.Meta, 0, 8<<30, 0, allocator.DefaultConfig()), nil, 1)
		o := tensor.Quant4Options{Storage: tensor.U8, Half: tc.half}
		l := newLinear4bitLoaded(rt, "proj", in, out, false, tensor.BF16, 0.02, o, true)
		if l.Q.DType != tc.state {
			t.Errorf("half %v: quant state %v, want %v", tc.half, l.Q.DType, tc.state)
		}
		x := rt.Zeros(tensor.BF16, []int{rows, in}, "x", snapshot.CategoryInput).SetRequiresGrad(true)
		stats := func() (int64, int64) {
			s := rt.Device().Allocator().Stats().AllocatedBytes.All()
			return s.Current, s.Peak
		}
		base, _ := stats()
		rt.Device().Allocator().ResetPeakStats()
		y := l.Forward(x)
		if _, peak := stats(); peak-base != tc.forward {
			t.Errorf("half %v: the forward peaked %d bytes above its start, want %d", tc.half, peak-base, tc.forward)
		}
		s := tensor.Sum(y)
		before, _ := stats()
		rt.Device().Allocator().ResetPeakStats()
		s.Backward(false)
		if _, peak := stats(); peak-before < tc.backwardMin || !tc.half && peak-before >= 2*weight {
			t.Errorf("half %v: the backward peaked %d bytes above its start, want at least %d (and under %d without the copy)",
				tc.half, peak-before, tc.backwardMin, 2*weight)
		}
		s.Release()
		y.Release()
		x.Release()
	}
}
