package nn

import (
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Linear4bit is bitsandbytes' nn.Linear4bit with quant_type nf4 (bnb_4bit_quant_type="nf4"), with or
// without double quantization and in the quant storage its options say: the weight a Params4bit, frozen, the
// bias (if any) kept in 16 bits, and the computation in bnb_4bit_compute_dtype (bfloat16).
type Linear4bit struct {
	base
	Q            *tensor.Quant4
	Weight, Bias *Parameter
	ComputeDType tensor.DType
}

// newLinear4bit loads a (out, in) weight in dtype, as from_pretrained reads a checkpoint shard, and
// quantizes it at once (Params4bit._quantize), freeing the 16-bit copy.
func newLinear4bit(rt *tensor.Runtime, name string, in, out int, bias bool, dtype tensor.DType, std float32, o tensor.Quant4Options) *Linear4bit {
	return newLinear4bitLoaded(rt, name, in, out, bias, dtype, std, o, true)
}

// newLinear4bitLoaded makes a Linear4bit whose weight is loaded in dtype and quantized on the device
// (onDevice: Params4bit._quantize, w = self.data.contiguous().to(device), quantize_4bit(w), the 16-bit copy
// freed), or made in its stored form at once, as a checkpoint already quantized loads. With o.Half the
// weight reaches the device as float16 (Params4bit.cuda's self.data.contiguous().half().cuda(device) before
// bitsandbytes 0.43.0), so its quant state is float16; the bias stays in dtype.
func newLinear4bitLoaded(rt *tensor.Runtime, name string, in, out int, bias bool, dtype tensor.DType, std float32, o tensor.Quant4Options, onDevice bool) *Linear4bit {
	l := &Linear4bit{base: base{rt, name}, ComputeDType: tensor.BF16}
	wdtype := dtype
	if o.Half {
		wdtype = tensor.F16
	}
	leave := rt.Scope(name)
	if onDevice {
		w := rt.Randn(wdtype, []int{out, in}, std, join(name, "weight"), snapshot.CategoryParameter)
		l.Q = tensor.Quantize4BitWith(w, snapshot.CategoryParameter, o)
		w.Release()
	} else {
		var values []float32
		if rt.Device().Computes() {
			values = make([]float32, out*in)
			for i := range values {
				values[i] = float32(rt.Rand().NormFloat64()) * std
			}
		}
		l.Q = tensor.Quantize4BitValues(rt, values, []int{out, in}, wdtype, snapshot.CategoryParameter, o)
	}
	leave()
	wn := join(name, "weight")
	l.Weight = &Parameter{Name: wn, Tensor: l.Q.Packed.SetName(wn), Packed4Bit: true}
	for i, t := range l.Q.Tensors()[1:] {
		if t != nil {
			t.SetName(wn + ".quant_state." + [...]string{"absmax", "state2.absmax", "state2.code", "code", "offset"}[i])
		}
	}
	if bias {
		l.Bias = constParameter(rt, join(name, "bias"), dtype, []int{out}, 0)
		l.Bias.Tensor.SetRequiresGrad(false)
	}
	return l
}

// Parameters returns the packed weight (it counts as two parameters a byte) and the bias.
func (l *Linear4bit) Parameters() []*Parameter {
	if l.Bias == nil {
		return []*Parameter{l.Weight}
	}
	return []*Parameter{l.Weight, l.Bias}
}

// releaseState frees the quantization state (the packed weight goes with the parameters).
func (l *Linear4bit) releaseState() {
	for _, t := range l.Q.Tensors()[1:] {
		t.Release()
	}
}

// Forward is Linear4bit.forward: x converted to the compute dtype, matmul_4bit, and the result converted
// back to x's dtype.
func (l *Linear4bit) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	inDType := x.DType()
	xc := tensor.ToDType(x, l.ComputeDType)
	var b *tensor.Tensor
	if l.Bias != nil {
		b = tensor.ToDType(l.Bias.Tensor, l.ComputeDType)
		defer b.Release()
	}
	y := tensor.MatMul4Bit(xc, l.Q, b)
	xc.Release()
	out := tensor.ToDType(y, inDType)
	y.Release()
	return out
}
