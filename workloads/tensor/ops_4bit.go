package tensor

import (
	"math"
	"slices"
	"sort"

	"github.com/oomdbg/oomdbg/snapshot"
)

// 4-bit weights as bitsandbytes stores and multiplies them for QLoRA (bitsandbytes/functional.py
// quantize_4bit and dequantize_4bit, autograd/_functions.py MatMul4Bit, nn/modules.py Linear4bit).

// The constants of bitsandbytes' NF4 storage.
const (
	// Blocksize4Bit is quantize_4bit's default blocksize: one absmax per 64 weights.
	Blocksize4Bit = 64
	// BlocksizeNested is the blocksize of the double quantization of the absmax values (compress_statistics:
	// quantize_blockwise(absmax - offset, blocksize=256)).
	BlocksizeNested = 256
)

// nf4Code is bitsandbytes' NF4 table (get_4bit_type("nf4")): the 16 quantiles of N(0, 1) an NF4 index
// stands for, normalised to [-1, 1].
var nf4Code = [16]float32{-1.0, -0.6961928009986877, -0.5250730514526367, -0.39491748809814453, -0.28444138169288635,
	-0.18477343022823334, -0.09105003625154495, 0.0, 0.07958029955625534, 0.16093020141124725, 0.24611230194568634,
	0.33791524171829224, 0.44070982933044434, 0.5626170039176941, 0.7229568362236023, 1.0}

// dynamicCode is bitsandbytes' signed 8-bit dynamic map (create_dynamic_map(signed=True)), the code the
// absmax values are quantized with, and the first Adam moment of its 8-bit optimizers.
var dynamicCode = dynamicMap(true)

// unsignedDynamicCode is create_dynamic_map(signed=False), the second Adam moment's code.
var unsignedDynamicCode = dynamicMap(false)

// dynamicMap is create_dynamic_map(signed, max_exponent_bits=7, total_bits=8): for each of 7 decades
// 10^(i-6), the midpoints of linspace(0.1, 1, n) with n = 2^i + 1 (signed, with their negatives) or 2^(i+1)
// + 1 (unsigned), then 0 and 1, sorted: 256 entries.
func dynamicMap(signed bool) [256]float32 {
	var data []float32
	for i := range 7 {
		n := 1<<(i+1) + 1
		if signed {
			n = 1<<i + 1
		}
		scale := math.Pow(10, float64(i-6))
		for j := range n - 1 { // the means of neighbouring boundaries of linspace(0.1, 1, n)
			lo := float32(0.1 + 0.9*float64(j)/float64(n-1))
			hi := float32(0.1 + 0.9*float64(j+1)/float64(n-1))
			m := float32(scale * float64((lo+hi)/2))
			data = append(data, m)
			if signed {
				data = append(data, -m)
			}
		}
	}
	data = append(data, 0, 1)
	for len(data) < 256 {
		data = append(data, 0)
	}
	sort.Slice(data, func(a, b int) bool { return data[a] < data[b] })
	var out [256]float32
	copy(out[:], data)
	return out
}

// Quant4 is one weight stored in 4 bits (Params4bit with its QuantState): the packed NF4 indices, two per
// byte, and the statistics to undo the quantization, compressed when bnb_4bit_use_double_quant asks.
type Quant4 struct {
	// Packed is the weight, two 4-bit indices a byte, in Storage's dtype (bnb_4bit_quant_storage): uint8
	// ((n+1)/2, 1), or the same bytes as (n+1)/4 bfloat16 or (n+1)/8 float32 elements.
	Packed *Tensor
	// Absmax is each block's absmax: uint8 codes of the nested quantization with double quantization, the
	// float32 values without.
	Absmax  *Tensor
	Absmax2 *Tensor // float32 (ceil(blocks/256)): the absmax of each 256 absmax values (double quantization)
	Code2   *Tensor // float32 (256): the dynamic code, a copy per weight (double quantization)
	Code    *Tensor // float32 (16): the NF4 table, made per weight by get_4bit_type
	Offset  *Tensor // float32 scalar: the mean absmax subtracted before the nested quantization
	Shape   []int   // the weight's (out, in)
	DType   DType   // quant_state.dtype: what dequantization produces
	// indices holds the packed indices on a computing device when Storage is not uint8 (the device tensor
	// has the bytes, a slice of this length does not fit its elements).
	indices []float32
}

// Quant4Options are the BitsAndBytesConfig settings that change what a 4-bit weight stores.
type Quant4Options struct {
	// DoubleQuant quantizes the absmax values again (bnb_4bit_use_double_quant, compress_statistics).
	DoubleQuant bool
	// Storage is the packed weight's dtype (bnb_4bit_quant_storage): U8 (bitsandbytes' default), BF16, F16 or
	// F32.
	Storage DType
	// Half says the weight is quantized from a float16 copy, so that the quant state's dtype, and each
	// dequantization's, is float16 (Params4bit.cuda's .half() before bitsandbytes 0.43.0,
	// versions.QuantizesInOwnDType; Lightning's BitsandbytesPrecision always). The quantizing functions take
	// the dtype they are given: the caller that loads the weight makes it float16 (nn's Linear4bit).
	Half bool
}

// DefaultQuant4 is the QLoRA recipe's: NF4 with double quantization, stored in uint8.
var DefaultQuant4 = Quant4Options{DoubleQuant: true, Storage: U8}

// Tensors returns the tensors of the stored weight, the packed weight first (nil where the options keep
// none).
func (q *Quant4) Tensors() []*Tensor {
	return []*Tensor{q.Packed, q.Absmax, q.Absmax2, q.Code2, q.Code, q.Offset}
}

// Release frees the stored weight.
func (q *Quant4) Release() { releaseAll(q.Tensors()) }

// Quantize4Bit stores w as quantize_4bit(w, blocksize=64, compress_statistics=True, quant_type="nf4") does
// (Quantize4BitWith with DefaultQuant4).
func Quantize4Bit(w *Tensor, category snapshot.Category) *Quant4 {
	return Quantize4BitWith(w, category, DefaultQuant4)
}

// Quantize4BitWith stores w as bitsandbytes' quantize_4bit(w, blocksize=64, compress_statistics,
// quant_type="nf4", quant_storage) does, allocating what it allocates in its order: the packed weight (its
// bytes in the storage dtype: ((n+1)//(2*itemsize), 1) elements) and the float32 absmax of every 64 values,
// the NF4 table; with double quantization the absmax's mean (the offset), the absmax less the offset, then
// its nested quantization (uint8 per value, a float32 absmax per 256, a copy of the dynamic code), the float32
// absmax values freed; without it the float32 absmax is the state's. The new tensors are tagged category
// (parameter, for a model's weights).
func Quantize4BitWith(w *Tensor, category snapshot.Category, o Quant4Options) *Quant4 {
	w.check()
	if w.NDim() != 2 {
		errShape("Quantize4Bit", "weight of shape %v is not 2-D", w.shape)
	}
	var values []float32
	if w.rt.dev.Computes() {
		values = w.host()
	}
	return quantize4Bit(w.rt, values, w.shape, w.dtype, category, o)
}

// Quantize4BitValues stores a (out, in) weight of dtype whose values are on the host (nil on a device that
// computes nothing) as Quantize4BitWith does, without the weight on the device first: a checkpoint already
// quantized, loaded as it is stored.
func Quantize4BitValues(rt *Runtime, values []float32, shape []int, dtype DType, category snapshot.Category, o Quant4Options) *Quant4 {
	if len(shape) != 2 || rt.dev.Computes() && len(values) != numel(shape) {
		errShape("Quantize4Bit", "weight of shape %v with %d values", shape, len(values))
	}
	return quantize4Bit(rt, values, shape, dtype, category, o)
}

func quantize4Bit(rt *Runtime, values []float32, shape []int, dtype DType, category snapshot.Category, o Quant4Options) *Quant4 {
	n := numel(shape)
	blocks := ceilDiv(n, Blocksize4Bit)
	prev := rt.SetCategory(category)
	defer rt.SetCategory(prev)
	q := &Quant4{Shape: slices.Clone(shape), DType: dtype}
	q.Packed = rt.Empty(o.Storage, []int{(n + 1) / (2 * o.Storage.Size()), 1}, "weight.4bit")
	absmax := rt.Empty(F32, []int{blocks}, "quant.absmax_f32")
	q.Code = rt.Empty(F32, []int{16}, "quant.code_nf4")
	var centred *Tensor
	if o.DoubleQuant {
		q.Offset = rt.Empty(F32, nil, "quant.offset")
		centred = rt.Empty(F32, []int{blocks}, "quant.absmax_centred")
		q.Absmax = rt.Empty(U8, []int{blocks}, "quant.absmax")
		q.Absmax2 = rt.Empty(F32, []int{ceilDiv(blocks, BlocksizeNested)}, "quant.absmax2")
		q.Code2 = rt.Empty(F32, []int{256}, "quant.code_dynamic")
	} else {
		q.Absmax = absmax.Ref()
	}
	if rt.dev.Computes() {
		copy(q.Code.data(), nf4Code[:])
		codes := q.Packed.data()
		if o.Storage != U8 {
			q.indices = make([]float32, (n+1)/2)
			codes = q.indices
		}
		quantizeBlocks(values, nf4Code[:], Blocksize4Bit, codes, absmax.data(), true)
		if o.DoubleQuant {
			copy(q.Code2.data(), dynamicCode[:])
			var mean float64
			for _, a := range absmax.data() {
				mean += float64(a)
			}
			off := float32(mean / float64(blocks))
			q.Offset.data()[0] = off
			for i, a := range absmax.data() {
				centred.data()[i] = a - off
			}
			quantizeBlocks(centred.data(), dynamicCode[:], BlocksizeNested, q.Absmax.data(), q.Absmax2.data(), false)
		}
	}
	absmax.Release()
	if centred != nil {
		centred.Release()
	}
	return q
}

// nested reports whether the absmax values are quantized again.
func (q *Quant4) nested() bool { return q.Absmax2 != nil }

// codes returns the packed indices on a computing device.
func (q *Quant4) codes() []float32 {
	if q.indices != nil {
		return q.indices
	}
	return q.Packed.data()
}

// quantizeBlocks maps each value, divided by its block's absmax, to the nearest entry of code, writing the
// indices (two a byte when packed, high nibble first) and the absmax of each block.
func quantizeBlocks(x, code []float32, blocksize int, out, absmax []float32, packed bool) {
	for b := range absmax {
		lo, hi := b*blocksize, min((b+1)*blocksize, len(x))
		var m float32
		for _, v := range x[lo:hi] {
			m = max(m, float32(math.Abs(float64(v))))
		}
		absmax[b] = m
		for i := lo; i < hi; i++ {
			v := float32(0)
			if m > 0 {
				v = x[i] / m
			}
			k := nearest(code, v)
			if !packed {
				out[i] = float32(k)
				continue
			}
			if i%2 == 0 {
				out[i/2] = float32(k << 4)
			} else {
				out[i/2] += float32(k)
			}
		}
	}
}

// nearest returns the index of the entry of the sorted code closest to v.
func nearest(code []float32, v float32) int {
	i := sort.Search(len(code), func(i int) bool { return code[i] >= v })
	switch {
	case i == 0:
		return 0
	case i == len(code):
		return len(code) - 1
	case v-code[i-1] <= code[i]-v:
		return i - 1
	}
	return i
}

// dequantize is dequantize_4bit: with double quantization, the absmax values dequantized into a float32
// temporary (and a second when extraAbsmax: absmax_dq + offset), then the weight in q.DType; without it, the
// weight alone. It returns the temporaries and the weight; the caller frees them.
func (q *Quant4) dequantize(extraAbsmax bool) (absmax []*Tensor, w *Tensor) {
	rt := q.Packed.rt
	blocks := q.Absmax.Numel()
	a := q.Absmax
	if q.nested() {
		a = rt.Empty(F32, []int{blocks}, "dequant.absmax")
		absmax = []*Tensor{a}
		if extraAbsmax { // absmax = absmax_dq + offset: a second float32 array
			a2 := rt.Empty(F32, []int{blocks}, "dequant.absmax")
			absmax = append(absmax, a2)
			a = a2
		}
	}
	w = rt.Empty(q.DType, q.Shape, "dequant.weight")
	if rt.dev.Computes() {
		ad := a.data()
		if q.nested() {
			codes, a2 := q.Absmax.data(), q.Absmax2.data()
			off := q.Offset.data()[0]
			for i := range ad {
				ad[i] = dynamicCode[int(codes[i])]*a2[i/BlocksizeNested] + off
			}
		}
		wd, p := w.data(), q.codes()
		for i := range wd {
			b := int(p[i/2])
			k := b >> 4
			if i%2 == 1 {
				k = b & 15
			}
			wd[i] = nf4Code[k] * ad[i/Blocksize4Bit]
		}
		w.round()
	}
	return absmax, w
}

// MatMul4Bit is bitsandbytes' matmul_4bit(x, weight, quant_state, bias) for training: x @ W.T + bias with W
// stored in 4 bits. Its forward (MatMul4Bit.forward, the dequantize-then-linear path gemm_4bit takes for
// more than 1536 rows, and the only path before 2026) dequantizes the absmax values and the weight into
// temporaries (the absmax values freed as dequantize_4bit returns), converts the weight to x's dtype (a
// second weight-sized temporary when they differ, as a float16 quant state makes them), runs F.linear (under
// autocast if it is on) and frees them; as a custom autograd Function it saves no tensor (ctx.tensors keeps
// only the packed weight, a parameter). Its backward dequantizes the weight again and multiplies: grad_x =
// grad @ W. The weight gets no gradient; the output requires grad only when x does. Before bitsandbytes
// 0.43.2 its forward also kept x in ctx.tensors = (A, B), unread, until the graph goes
// (versions.MatMul4BitDropsInput).
func MatMul4Bit(x *Tensor, q *Quant4, bias *Tensor) *Tensor {
	x.check()
	rt := x.rt
	var out *Tensor
	rt.NoGrad(func() {
		absmax, w := q.dequantize(true)
		releaseAll(absmax)        // dequantize_4bit's locals
		wc := ToDType(w, x.dtype) // .to(A.dtype): a copy when the state's dtype is not the input's
		w.Release()
		out = Linear(x, wc, bias)
		wc.Release()
	})
	if rt.needsGrad(x, bias) {
		var biasDType DType
		if bias != nil {
			biasDType = bias.dtype
		}
		node := rt.node("MatMul4BitBackward", []*Tensor{x, bias}, []*Tensor{out}, nil)
		q := q.heldBy(node)
		if x.requiresGrad && rt.versions.MatMul4BitKeepsInput() {
			node.keepAttr("ctx.tensors", x) // ctx.tensors = (A, B): bitsandbytes before 0.43.2
		}
		node.apply = func(n *Node, g []*Tensor, needs []bool) []*Tensor {
			grads := make([]*Tensor, 2)
			if needs[1] { // grad_output.sum(0, dtype=bias.dtype)
				s := n.rt.sumTo(g[0], []int{q.Shape[0]}, "bias.grad")
				grads[1] = ToDType(s, biasDType)
				s.Release()
			}
			if needs[0] {
				absmax, w := q.dequantize(false)
				releaseAll(absmax)
				wc := ToDType(w, g[0].dtype) // .to(grad_output.dtype)
				w.Release()
				grads[0] = Matmul(g[0], wc)
				wc.Release()
			}
			return grads
		}
	}
	return out
}

// heldBy returns q with its tensors held by node (ctx.tensors and ctx.state of MatMul4Bit).
func (q *Quant4) heldBy(n *Node) *Quant4 {
	c := *q
	for _, p := range []**Tensor{&c.Packed, &c.Absmax, &c.Absmax2, &c.Code2, &c.Code, &c.Offset} {
		if *p == nil {
			continue
		}
		n.hold("ctx.state", *p)
		*p = n.kept[len(n.kept)-1]
	}
	return &c
}

func ceilDiv(a, b int) int { return (a + b - 1) / b }

// Requantize8_ rounds x in place to what bitsandbytes' blockwise 8-bit optimizer state holds: each block of
// blocksize values as the nearest entry of the signed (or unsigned) dynamic code times the block's absmax,
// which it writes into absmax. It allocates nothing.
func Requantize8_(x, absmax *Tensor, signed bool, blocksize int) {
	if !x.rt.dev.Computes() {
		return
	}
	code := unsignedDynamicCode[:]
	if signed {
		code = dynamicCode[:]
	}
	d, a := x.data(), absmax.data()
	idx := make([]float32, len(d))
	quantizeBlocks(d, code, blocksize, idx, a, false)
	for i := range d {
		d[i] = code[int(idx[i])] * a[i/blocksize]
	}
}
