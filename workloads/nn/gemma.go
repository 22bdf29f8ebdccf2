package nn

import (
	"math"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// What Gemma 2 and 3 change in the decoder (models/gemma2 and gemma3 of transformers 4.51): Gemma's RMSNorm,
// which computes in float32 and scales by 1 + weight (its weight starts at zero); the embeddings scaled by
// sqrt(hidden_size); a norm after the attention and after the MLP as well as before each; GeGLU, gelu with the
// tanh approximation; scores scaled by query_pre_attn_scalar; Gemma 2's soft-capping of the attention scores
// and of the final logits (tanh, which saves its result: a tensor of the scores' or the logits' size); and
// sliding-window attention on every other layer (Gemma 2) or all but every sliding_window_pattern-th
// (Gemma 3, with a rotary embedding of its own). In eager attention a sliding layer rebuilds the model's
// (batch, 1, seq, seq) mask: a bool copy of its full size, a new mask and an indexed copy of it, held while
// the layer runs; the scores it masks are the same size as a global layer's, so the window saves no memory.
// Flash attention (flash_attention_2) takes the window and the soft-cap inside the kernel and no mask.

// GemmaRMSNorm is Gemma's RMSNorm (Gemma2RMSNorm, Gemma3RMSNorm): x in float32 normalised, times 1 + weight in
// float32, converted back to x's dtype.
type GemmaRMSNorm struct {
	base
	Weight *Parameter
	Eps    float32
}

func newGemmaRMSNorm(rt *tensor.Runtime, name string, d int, eps float32, dtype tensor.DType) *GemmaRMSNorm {
	if eps == 0 {
		eps = 1e-6
	}
	return &GemmaRMSNorm{base: base{rt, name}, Weight: constParameter(rt, join(name, "weight"), dtype, []int{d}, 0), Eps: eps}
}

// Parameters returns the norm's weight.
func (n *GemmaRMSNorm) Parameters() []*Parameter { return []*Parameter{n.Weight} }

// Forward is Gemma2RMSNorm.forward: output = _norm(x.float()), x * rsqrt(x.pow(2).mean(-1, keepdim=True) +
// eps) (pow and the product save the float32 input, rsqrt its result); output * (1.0 + weight.float()), which
// saves the float32 normalised input when the weight is trained and 1 + weight; .type_as(x).
func (n *GemmaRMSNorm) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer n.scope()()
	h := tensor.ToDType(x, tensor.F32)
	p := tensor.Pow(h, 2)
	variance := tensor.MeanLast(p)
	p.Release()
	ve := tensor.AddScalar(variance, n.Eps)
	variance.Release()
	r := tensor.Rsqrt(ve)
	ve.Release()
	hn := tensor.Mul(h, r)
	h.Release()
	r.Release()
	wf := tensor.ToDType(n.Weight.Tensor, tensor.F32)
	w1 := tensor.AddScalar(wf, 1)
	wf.Release()
	out := tensor.Mul(hn, w1)
	hn.Release()
	w1.Release()
	res := tensor.ToDType(out, x.DType())
	out.Release()
	return res
}

// gemmaEmbedScale allocates Gemma 3's embed_scale buffer, sqrt(hidden_size) as a float32 scalar
// (Gemma3TextScaledWordEmbedding).
func gemmaEmbedScale(rt *tensor.Runtime, d int) *tensor.Tensor {
	const name = "model.embed_tokens.embed_scale"
	defer rt.Scope("model.embed_tokens")()
	return rt.FromValues(tensor.F32, nil, []float32{float32(math.Sqrt(float64(d)))}, name, snapshot.CategoryParameter).SetName(name)
}

// scaleEmbeddings is Gemma3TextScaledWordEmbedding's forward after the lookup: embeddings *
// embed_scale.to(weight.dtype). The product saves the scale (a new 0-d tensor with 16-bit weights) when the
// embeddings require grad. It takes embeds' reference.
func (m *Decoder) scaleEmbeddings(embeds *tensor.Tensor) *tensor.Tensor {
	defer m.rt.Scope("model.embed_tokens")()
	sc := tensor.ToDType(m.EmbedScale, m.Embed.Weight.Tensor.DType())
	out := tensor.Mul(embeds, sc)
	sc.Release()
	embeds.Release()
	return out
}

// normalize is Gemma2Model's hidden_states * torch.tensor(hidden_size**0.5, dtype=hidden_states.dtype). The
// normalizer is made without a device, so on a GPU it is a host scalar: no device memory, and what autograd
// saves of it is on the host. Its value is rounded to the hidden states' dtype (bfloat16 makes sqrt(3584)
// 60.0). It takes x's reference.
func (m *Decoder) normalize(x *tensor.Tensor) *tensor.Tensor {
	v := []float32{float32(math.Sqrt(float64(m.Config.DModel)))}
	switch x.DType() {
	case tensor.BF16:
		device.RoundBF16(v)
	case tensor.F16:
		device.RoundF16(v)
	}
	out := tensor.Scale(x, v[0])
	x.Release()
	return out
}
