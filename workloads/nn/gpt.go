package nn

import (
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// GPTConfig shapes a GPT decoder (nanoGPT's GPTConfig).
type GPTConfig struct {
	BlockSize int     // context length (maximum sequence)
	Vocab     int     // vocabulary size
	Layers    int     // transformer blocks
	Heads     int     // attention heads
	DModel    int     // embedding width (n_embd)
	Dropout   float32 // dropout probability everywhere
	Bias      bool    // biases in Linear and LayerNorm layers (GPT-2: true)
	// Attention is "naive" (scores materialised: nanoGPT without flash) or "flash"
	// (F.scaled_dot_product_attention's memory-efficient kernels).
	Attention string
	DType     tensor.DType
	// Built, when set, is called with each transformer block as soon as its parameters exist (a data-parallel
	// strategy shards it at once, so the whole model is never on the device).
	Built func(b Module)
}

// GPT is nanoGPT's model, module for module: token and position embeddings, dropout, Layers pre-LayerNorm
// blocks of causal self-attention and MLP, a final LayerNorm and the LM head, whose weight is tied to the
// token embedding. Module names are nanoGPT's ("transformer.h.3.attn.c_attn").
type GPT struct {
	base
	Config   GPTConfig
	WTE, WPE *Embedding
	Drop     *Dropout
	Blocks   []*Block
	LNF      *LayerNorm
	// LMHead shares its weight with WTE; it has no parameter of its own.
	LMHead *Linear

	// AfterBlock, when set, is called with each block's output, like a forward hook on every block.
	AfterBlock func(b *Block, out *tensor.Tensor)
	// Checkpoint, when set, runs a block through activation checkpointing when it returns true.
	Checkpoint func(i int) bool
	// CheckpointAttention runs every block's attention (not its MLP) through activation checkpointing:
	// selective checkpointing of the part whose activations grow with the square of the sequence.
	CheckpointAttention bool

	Training bool
}

// Block is one transformer block: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
type Block struct {
	base
	LN1  *LayerNorm
	Attn *CausalSelfAttention
	LN2  *LayerNorm
	MLP  *GPTMLP

	checkpointAttn *bool // the model's CheckpointAttention
}

// CausalSelfAttention is nanoGPT's attention: one qkv projection, head split, attention, merge, projection.
type CausalSelfAttention struct {
	base
	CAttn, CProj              *Linear
	AttnDropout, ResidDropout *Dropout
	Mask                      *tensor.Tensor // the causal-mask buffer (naive attention only)
	heads                     int
	flash                     bool
	dropout                   float32
	training                  *bool

	// AfterQKV, when set, is called with the qkv projection (self.c_attn(x)) as soon as it is computed, like
	// a forward hook on c_attn. It borrows the tensor.
	AfterQKV func(a *CausalSelfAttention, qkv *tensor.Tensor)
}

// GPTMLP is the block's feed-forward: Linear(d, 4d), GELU, Linear(4d, d), dropout.
type GPTMLP struct {
	base
	CFC   *Linear
	GELU  *GELU
	CProj *Linear
	Drop  *Dropout
}

// NewGPT allocates a GPT's parameters (and buffers) on rt's device, initialised as nanoGPT does: normal(0,
// 0.02) weights, zero biases, and residual projections scaled by 1/sqrt(2 x layers).
func NewGPT(rt *tensor.Runtime, cfg GPTConfig) (*GPT, error) {
	if cfg.DModel%cfg.Heads != 0 {
		return nil, fmt.Errorf("d_model %d is not divisible by %d heads", cfg.DModel, cfg.Heads)
	}
	if cfg.Attention != "naive" && cfg.Attention != "flash" {
		return nil, fmt.Errorf("unknown attention %q (want naive or flash)", cfg.Attention)
	}
	g := &GPT{base: base{rt, ""}, Config: cfg, Training: true}
	d := cfg.DModel
	normal := func(name string, shape []int, std float32) *Parameter {
		defer rt.Scope(owner(name))()
		t := rt.Randn(cfg.DType, shape, std, name, snapshot.CategoryParameter)
		return &Parameter{Name: name, Tensor: t.SetRequiresGrad(true).SetName(name)}
	}
	zeros := func(name string, n int) *Parameter { return constParameter(rt, name, cfg.DType, []int{n}, 0) }
	linear := func(name string, in, out int, std float32) *Linear {
		l := &Linear{base: base{rt, name}, Weight: normal(join(name, "weight"), []int{out, in}, std)}
		if cfg.Bias {
			l.Bias = zeros(join(name, "bias"), out)
		}
		return l
	}
	projStd := float32(0.02 / math.Sqrt(2*float64(cfg.Layers)))

	g.WTE = &Embedding{base: base{rt, "transformer.wte"}, Weight: normal("transformer.wte.weight", []int{cfg.Vocab, d}, 0.02)}
	g.WPE = &Embedding{base: base{rt, "transformer.wpe"}, Weight: normal("transformer.wpe.weight", []int{cfg.BlockSize, d}, 0.02)}
	g.Drop = NewDropout(rt, "transformer.drop", cfg.Dropout, &g.Training)
	for i := range cfg.Layers {
		name := fmt.Sprintf("transformer.h.%d", i)
		b := &Block{base: base{rt, name}, checkpointAttn: &g.CheckpointAttention}
		b.LN1 = NewLayerNorm(rt, join(name, "ln_1"), d, cfg.Bias, cfg.DType)
		an := join(name, "attn")
		b.Attn = &CausalSelfAttention{base: base{rt, an}, heads: cfg.Heads, flash: cfg.Attention == "flash",
			dropout: cfg.Dropout, training: &g.Training}
		b.Attn.CAttn = linear(join(an, "c_attn"), d, 3*d, 0.02)
		b.Attn.CProj = linear(join(an, "c_proj"), d, d, projStd)
		b.Attn.AttnDropout = NewDropout(rt, join(an, "attn_dropout"), cfg.Dropout, &g.Training)
		b.Attn.ResidDropout = NewDropout(rt, join(an, "resid_dropout"), cfg.Dropout, &g.Training)
		if !b.Attn.flash { // register_buffer("bias", torch.tril(torch.ones(T, T)).view(1, 1, T, T))
			leave := rt.Scope(an)
			m := rt.Tril(cfg.BlockSize, join(an, "bias"), snapshot.CategoryParameter)
			leave()
			b.Attn.Mask = m.View(1, 1, cfg.BlockSize, cfg.BlockSize).SetName(join(an, "bias"))
			m.Release()
		}
		b.LN2 = NewLayerNorm(rt, join(name, "ln_2"), d, cfg.Bias, cfg.DType)
		mn := join(name, "mlp")
		b.MLP = &GPTMLP{base: base{rt, mn}}
		b.MLP.CFC = linear(join(mn, "c_fc"), d, 4*d, 0.02)
		b.MLP.GELU = NewGELU(rt, join(mn, "gelu"))
		b.MLP.CProj = linear(join(mn, "c_proj"), 4*d, d, projStd)
		b.MLP.Drop = NewDropout(rt, join(mn, "dropout"), cfg.Dropout, &g.Training)
		g.Blocks = append(g.Blocks, b)
		if cfg.Built != nil {
			cfg.Built(b)
		}
	}
	g.LNF = NewLayerNorm(rt, "transformer.ln_f", d, cfg.Bias, cfg.DType)
	g.LMHead = &Linear{base: base{rt, "lm_head"}, Weight: g.WTE.Weight} // weight tying
	return g, nil
}

// Parameters returns the parameters in nanoGPT's order, the tied LM head weight once (as wte).
func (g *GPT) Parameters() []*Parameter {
	ps := append(g.WTE.Parameters(), g.WPE.Parameters()...)
	for _, b := range g.Blocks {
		ps = append(ps, b.Parameters()...)
	}
	return append(ps, g.LNF.Parameters()...)
}

// Release frees the model's parameters and buffers.
func (g *GPT) Release() {
	ReleaseParameters(g)
	for _, b := range g.Blocks {
		b.Attn.Mask.Release()
	}
}

// Parameters returns the block's parameters.
func (b *Block) Parameters() []*Parameter {
	ps := b.LN1.Parameters()
	ps = append(ps, b.Attn.CAttn.Parameters()...)
	ps = append(ps, b.Attn.CProj.Parameters()...)
	ps = append(ps, b.LN2.Parameters()...)
	ps = append(ps, b.MLP.CFC.Parameters()...)
	return append(ps, b.MLP.CProj.Parameters()...)
}

// Loss returns the mean cross-entropy of the model's next-token predictions for idx (batch, seq) against
// targets (batch, seq); the logits are freed as soon as it is computed.
func (g *GPT) Loss(idx, targets *tensor.Tensor) *tensor.Tensor {
	logits, loss := g.ForwardLoss(idx, targets)
	logits.Release()
	return loss
}

// ForwardLoss is nanoGPT's forward(idx, targets): it returns the logits (batch, seq, vocab) and the mean
// cross-entropy of the next-token predictions against targets. The caller owns both: a training loop that
// keeps the logits (nanoGPT's logits, loss = model(X, Y)) keeps them alive through backward.
func (g *GPT) ForwardLoss(idx, targets *tensor.Tensor) (logits, loss *tensor.Tensor) {
	rt := g.rt
	t := idx.Dim(1)
	if t > g.Config.BlockSize {
		panic(fmt.Errorf("sequence of length %d is longer than the block size %d", t, g.Config.BlockSize))
	}
	pos := rt.Arange(t, "pos")
	tok := g.WTE.Forward(idx)
	pe := g.WPE.Forward(pos)
	pos.Release()
	sum := tensor.Add(tok, pe)
	tok.Release()
	pe.Release()
	x := g.Drop.Forward(sum)
	sum.Release()
	for i, b := range g.Blocks {
		var y *tensor.Tensor
		if g.Checkpoint != nil && g.Checkpoint(i) {
			y = tensor.Checkpoint(func(in *tensor.Tensor) *tensor.Tensor { return b.Forward(in) }, x)
		} else {
			y = b.Forward(x)
		}
		x.Release()
		x = y
		if g.AfterBlock != nil {
			g.AfterBlock(b, x)
		}
	}
	h := g.LNF.Forward(x)
	x.Release()
	logits = g.LMHead.Forward(h)
	h.Release()
	flat := logits.View(-1, logits.Dim(-1))
	defer flat.Release()
	tflat := targets.View(-1)
	defer tflat.Release()
	return logits, tensor.CrossEntropy(flat, tflat)
}

// Forward applies the block.
func (b *Block) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer b.scope()()
	h := b.LN1.Forward(x)
	var a *tensor.Tensor
	if *b.checkpointAttn {
		a = tensor.Checkpoint(b.Attn.Forward, h)
	} else {
		a = b.Attn.Forward(h)
	}
	h.Release()
	x1 := tensor.Add(x, a)
	a.Release()
	h2 := b.LN2.Forward(x1)
	m := b.MLP.Forward(h2)
	h2.Release()
	x2 := tensor.Add(x1, m)
	x1.Release()
	m.Release()
	return x2
}

// Forward applies causal self-attention to x (batch, seq, d_model).
func (a *CausalSelfAttention) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer a.scope()()
	bsz, t, c := x.Dim(0), x.Dim(1), x.Dim(2)
	hs := c / a.heads
	qkv := a.CAttn.Forward(x)
	if a.AfterQKV != nil {
		a.AfterQKV(a, qkv)
	}
	parts := qkv.Split(c, 2)
	qkv.Release()
	heads := func(p *tensor.Tensor) *tensor.Tensor { // (B, T, C) -> (B, nh, T, hs)
		v := p.View(bsz, t, a.heads, hs)
		p.Release()
		tr := v.Transpose(1, 2)
		v.Release()
		return tr
	}
	q, k, v := heads(parts[0]), heads(parts[1]), heads(parts[2])
	var y *tensor.Tensor
	if a.flash {
		y = tensor.ScaledDotProductAttention(q, k, v, true, a.dropout, *a.training)
	} else {
		y = a.naive(q, k, v, t, hs)
	}
	q.Release()
	k.Release()
	v.Release()
	yt := y.Transpose(1, 2)
	y.Release()
	yc := yt.Contiguous()
	yt.Release()
	merged := yc.View(bsz, t, c)
	yc.Release()
	p := a.CProj.Forward(merged)
	merged.Release()
	out := a.ResidDropout.Forward(p)
	p.Release()
	return out
}

// naive is nanoGPT's attention without flash: the (B, nh, T, T) scores, mask, softmax and dropout are each
// materialised.
func (a *CausalSelfAttention) naive(q, k, v *tensor.Tensor, t, hs int) *tensor.Tensor {
	kt := k.Transpose(-2, -1)
	scores := tensor.Matmul(q, kt)
	kt.Release()
	att := tensor.Scale(scores, float32(1/math.Sqrt(float64(hs))))
	scores.Release()
	m1 := a.Mask.Narrow(2, 0, t)
	m2 := m1.Narrow(3, 0, t)
	m1.Release()
	causal := tensor.EqualScalar(m2, 0)
	m2.Release()
	masked := tensor.MaskedFill(att, causal, float32(math.Inf(-1)))
	att.Release()
	causal.Release()
	probs := tensor.Softmax(masked)
	masked.Release()
	dropped := a.AttnDropout.Forward(probs)
	probs.Release()
	y := tensor.Matmul(dropped, v)
	dropped.Release()
	return y
}

// Parameters returns the attention's parameters.
func (a *CausalSelfAttention) Parameters() []*Parameter {
	return append(a.CAttn.Parameters(), a.CProj.Parameters()...)
}

// Forward applies the feed-forward.
func (m *GPTMLP) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer m.scope()()
	h := m.CFC.Forward(x)
	g := m.GELU.Forward(h)
	h.Release()
	p := m.CProj.Forward(g)
	g.Release()
	out := m.Drop.Forward(p)
	p.Release()
	return out
}

// Parameters returns the feed-forward's parameters.
func (m *GPTMLP) Parameters() []*Parameter {
	return append(m.CFC.Parameters(), m.CProj.Parameters()...)
}
