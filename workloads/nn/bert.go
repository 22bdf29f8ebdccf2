package nn

import (
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// BERT encoders as transformers 4.51 writes them (models/bert): BertForMaskedLM and
// BertForSequenceClassification. BertEmbeddings sums the word, position and token type embeddings (the
// positions and token types are views of buffers), then LayerNorm and dropout. Each BertLayer is post-norm:
// self-attention (query, key, value; the scores divided by sqrt(head size), the extended padding mask added,
// softmax, dropout, the product with the values) and attention.output (dense, dropout, LayerNorm of the sum
// with the input), then intermediate (dense, exact gelu) and output (dense, dropout, LayerNorm of the sum).
// The padding mask is attention_mask[:, None, None, :] in the parameters' dtype, (1 - mask) * min: one row
// per sample, added to every head's scores. With sdpa (--attention flash) a batch without padding runs the
// flash kernel and no mask; a padded one expands the mask to (batch, 1, seq, seq) in the embeddings' dtype,
// which the memory-efficient kernel reads and saves. The masked LM head is transform (dense, gelu,
// LayerNorm) and a decoder tied to the word embeddings with a bias of its own, over every position; the
// classifier reads the pooler's tanh of the first token's dense projection, after dropout.

// The tasks a Bert trains.
const (
	TaskMLM      = "mlm"      // BertForMaskedLM
	TaskClassify = "classify" // BertForSequenceClassification
)

// BertProjections are the short names of a BERT layer's linear layers LoRA may adapt: q, k and v
// (attention.self.query, key, value), o (attention.output.dense), up (intermediate.dense) and down
// (output.dense).
var BertProjections = []string{"q", "k", "v", "o", "up", "down"}

// BertConfig shapes a BERT encoder (BertConfig's fields that decide memory) and its task.
type BertConfig struct {
	Vocab, DModel, Layers, Heads, FFN int
	MaxPositions, TypeVocab           int // max_position_embeddings, type_vocab_size
	Task                              string
	Labels                            int     // num_labels (classify)
	NormEps                           float32 // layer_norm_eps
	// HiddenDropout is hidden_dropout_prob (embeddings, each block's output, the classifier's input);
	// AttnDropout attention_probs_dropout_prob.
	HiddenDropout, AttnDropout float32
	Attention                  string // "naive" (eager) or "flash" (sdpa)
	DType                      tensor.DType
	Adapter                    *LoRAConfig
	QLoRA                      bool
	Quant                      *tensor.Quant4Options // how QLoRA stores the base (tensor.DefaultQuant4 when nil)
	Built                      func(l Module)
}

// Bert is BertForMaskedLM or BertForSequenceClassification.
type Bert struct {
	base
	Config                    BertConfig
	Word, Position, TokenType *Embedding
	EmbedNorm                 *LayerNorm
	Layers                    []*BertLayer
	// Pooler, Classifier (classify): under LoRA, Classifier is peft's trained copy (modules_to_save) and
	// FrozenClassifier the original beside it.
	Pooler                       Projection
	Classifier, FrozenClassifier *Linear
	// Transform, TransformNorm, DecoderBias (mlm): the decoder's weight is the word embeddings'.
	Transform     Projection
	TransformNorm *LayerNorm
	DecoderBias   *Parameter
	// PositionIDs and TokenTypeIDs are the embeddings' buffers.
	PositionIDs, TokenTypeIDs *tensor.Tensor
	Training                  bool

	// Checkpoint, InputRequiresGrad and AfterLayer are Llama's.
	Checkpoint        func(i int) bool
	InputRequiresGrad bool
	AfterLayer        func(l *BertLayer, out *tensor.Tensor)
	mask              *tensor.Tensor // the batch's attention_mask, (batch, seq) int64
	lengths           []int          // each sample's tokens, nil when none is padded
}

// BertLayer is one encoder layer.
type BertLayer struct {
	base
	Query, Key, Value, AttnOut Projection
	AttnNorm                   *LayerNorm
	Intermediate, Output       Projection
	OutNorm                    *LayerNorm
	model                      *Bert
}

// NewBert allocates a BERT model on rt's device, initialised as BertPreTrainedModel._init_weights does, with
// LoRA and QLoRA as NewLlama has them (the base's linear layers 4-bit, the task's head left in 16 bits as
// from_pretrained leaves the last module).
func NewBert(rt *tensor.Runtime, cfg BertConfig) (*Bert, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	m := &Bert{base: base{rt, ""}, Config: cfg, Training: true}
	b := &decoderBuilder{rt: rt, cfg: &DecoderConfig{LlamaConfig: LlamaConfig{DType: cfg.DType, Adapter: cfg.Adapter, QLoRA: cfg.QLoRA, Quant: cfg.Quant}},
		training: &m.Training}
	emb := func(name string, n int) *Embedding {
		return &Embedding{base: base{rt, name}, Weight: b.normal(join(name, "weight"), []int{n, cfg.DModel})}
	}
	m.Word = emb("bert.embeddings.word_embeddings", cfg.Vocab)
	m.Position = emb("bert.embeddings.position_embeddings", cfg.MaxPositions)
	m.TokenType = emb("bert.embeddings.token_type_embeddings", cfg.TypeVocab)
	m.EmbedNorm = NewLayerNorm(rt, "bert.embeddings.LayerNorm", cfg.DModel, true, cfg.DType)
	m.PositionIDs, m.TokenTypeIDs = bertBuffers(rt, cfg.MaxPositions)
	d := cfg.DModel
	for i := range cfg.Layers {
		name := fmt.Sprintf("bert.encoder.layer.%d", i)
		l := &BertLayer{base: base{rt, name}, model: m}
		l.Query = b.linear(join(name, "attention.self.query"), "q", d, d, true)
		l.Key = b.linear(join(name, "attention.self.key"), "k", d, d, true)
		l.Value = b.linear(join(name, "attention.self.value"), "v", d, d, true)
		l.AttnOut = b.linear(join(name, "attention.output.dense"), "o", d, d, true)
		l.AttnNorm = NewLayerNorm(rt, join(name, "attention.output.LayerNorm"), d, true, cfg.DType)
		l.Intermediate = b.linear(join(name, "intermediate.dense"), "up", d, cfg.FFN, true)
		l.Output = b.linear(join(name, "output.dense"), "down", cfg.FFN, d, true)
		l.OutNorm = NewLayerNorm(rt, join(name, "output.LayerNorm"), d, true, cfg.DType)
		m.Layers = append(m.Layers, l)
		if cfg.Built != nil {
			cfg.Built(l)
		}
	}
	head := &decoderBuilder{rt: rt, cfg: &DecoderConfig{LlamaConfig: LlamaConfig{DType: cfg.DType}}, training: &m.Training}
	if cfg.Task == TaskClassify {
		m.Pooler = b.linear("bert.pooler.dense", "", d, d, true)
		m.Classifier = head.linear("classifier", "", d, cfg.Labels, true).(*Linear)
	} else {
		m.Transform = head.linear("cls.predictions.transform.dense", "", d, d, true)
		m.TransformNorm = NewLayerNorm(rt, "cls.predictions.transform.LayerNorm", d, true, cfg.DType)
		m.DecoderBias = constParameter(rt, "cls.predictions.bias", cfg.DType, []int{cfg.Vocab}, 0)
	}
	if cfg.Adapter != nil {
		for _, p := range m.Parameters() {
			if !isAdapter(p.Name) {
				p.Tensor.SetRequiresGrad(false)
			}
		}
		if m.Classifier != nil { // peft's SEQ_CLS task trains a copy of the classifier (modules_to_save)
			m.FrozenClassifier = m.Classifier
			m.Classifier = head.linear("classifier.modules_to_save.default", "", d, cfg.Labels, true).(*Linear)
		}
	}
	for _, l := range []*LayerNorm{m.EmbedNorm, m.TransformNorm} {
		if l != nil {
			l.Eps = cfg.NormEps
		}
	}
	for _, l := range m.Layers {
		l.AttnNorm.Eps, l.OutNorm.Eps = cfg.NormEps, cfg.NormEps
	}
	return m, nil
}

func (c BertConfig) validate() error {
	switch {
	case c.Vocab <= 1 || c.DModel <= 0 || c.Layers <= 0 || c.Heads <= 0 || c.FFN <= 0 || c.MaxPositions <= 0 || c.TypeVocab <= 0:
		return fmt.Errorf("bert needs vocab > 1 and d_model, layers, heads, ffn, max positions and type vocab > 0 (got %d, %d, %d, %d, %d, %d, %d)",
			c.Vocab, c.DModel, c.Layers, c.Heads, c.FFN, c.MaxPositions, c.TypeVocab)
	case c.DModel%c.Heads != 0:
		return fmt.Errorf("hidden_size %d is not a multiple of %d heads", c.DModel, c.Heads)
	case c.Task != TaskMLM && c.Task != TaskClassify:
		return fmt.Errorf("unknown task %q (want mlm or classify)", c.Task)
	case c.Task == TaskClassify && c.Labels < 1:
		return fmt.Errorf("classification needs labels >= 1")
	case c.Attention != "naive" && c.Attention != "flash":
		return fmt.Errorf("unknown attention %q (want naive or flash)", c.Attention)
	case c.QLoRA && c.Adapter == nil:
		return fmt.Errorf("qlora needs a lora adapter")
	}
	return c.Adapter.onlyOf("bert", BertProjections)
}

// bertBuffers allocates BertEmbeddings' buffers: position_ids, arange(max positions) viewed (1, max), and
// token_type_ids, zeros of that shape.
func bertBuffers(rt *tensor.Runtime, maxPos int) (positions, types *tensor.Tensor) {
	defer rt.Scope("bert.embeddings")()
	v := make([]float32, maxPos)
	for i := range v {
		v[i] = float32(i)
	}
	positions = rt.FromValues(tensor.I64, []int{1, maxPos}, v, "bert.embeddings.position_ids", snapshot.CategoryParameter).
		SetName("bert.embeddings.position_ids")
	types = rt.Zeros(tensor.I64, []int{1, maxPos}, "bert.embeddings.token_type_ids", snapshot.CategoryParameter).
		SetName("bert.embeddings.token_type_ids")
	return positions, types
}

// UseAttentionMask hands the model the batch's attention_mask, as a padding collator puts it on the device
// with the inputs (ones for tokens, zeros for padding); lengths says each sample's tokens (nil: none padded).
// The model holds a reference until the next call.
func (m *Bert) UseAttentionMask(mask *tensor.Tensor, lengths []int) {
	if m.mask != nil {
		m.mask.Release()
	}
	m.mask, m.lengths = mask.Ref(), lengths
}

// Parameters returns the model's parameters in HF's order, the tied decoder weight once.
func (m *Bert) Parameters() []*Parameter {
	ps := append(append(m.Word.Parameters(), m.Position.Parameters()...), m.TokenType.Parameters()...)
	ps = append(ps, m.EmbedNorm.Parameters()...)
	for _, l := range m.Layers {
		ps = append(ps, l.Parameters()...)
	}
	if m.Pooler != nil {
		ps = append(ps, m.Pooler.Parameters()...)
	}
	if m.FrozenClassifier != nil {
		ps = append(ps, m.FrozenClassifier.Parameters()...)
	}
	if m.Classifier != nil {
		ps = append(ps, m.Classifier.Parameters()...)
	}
	if m.Transform != nil {
		ps = append(append(append(ps, m.DecoderBias), m.Transform.Parameters()...), m.TransformNorm.Parameters()...)
	}
	return ps
}

// Parameters returns the layer's parameters.
func (l *BertLayer) Parameters() []*Parameter {
	var ps []*Parameter
	for _, p := range []Projection{l.Query, l.Key, l.Value, l.AttnOut} {
		ps = append(ps, p.Parameters()...)
	}
	ps = append(ps, l.AttnNorm.Parameters()...)
	ps = append(append(ps, l.Intermediate.Parameters()...), l.Output.Parameters()...)
	return append(ps, l.OutNorm.Parameters()...)
}

// Release frees the model's parameters, buffers and quantization state, and the mask it holds.
func (m *Bert) Release() {
	for _, l := range m.Layers {
		for _, p := range []Projection{l.Query, l.Key, l.Value, l.AttnOut, l.Intermediate, l.Output} {
			if r, ok := p.(interface{ releaseState() }); ok {
				r.releaseState()
			}
		}
	}
	if r, ok := m.Pooler.(interface{ releaseState() }); ok {
		r.releaseState()
	}
	ReleaseParameters(m)
	m.PositionIDs.Release()
	m.TokenTypeIDs.Release()
	if m.mask != nil {
		m.mask.Release()
		m.mask = nil
	}
}

// Loss returns the task's loss; the logits are freed as soon as it is computed.
func (m *Bert) Loss(idx, labels *tensor.Tensor) *tensor.Tensor {
	logits, loss := m.ForwardLoss(idx, labels)
	logits.Release()
	return loss
}

// ForwardLoss is the task model's forward(input_ids, attention_mask, labels): the encoder, then the MLM
// head's scores over every position and CrossEntropyLoss against the labels (batch, seq), or the pooled
// first token, dropout, the classifier and CrossEntropyLoss against the labels (batch). Without a mask from
// UseAttentionMask every token counts.
func (m *Bert) ForwardLoss(idx, labels *tensor.Tensor) (logits, loss *tensor.Tensor) {
	cfg := m.Config
	seq := m.encode(idx)
	var scores *tensor.Tensor
	if cfg.Task == TaskMLM {
		scores = m.mlmHead(seq)
	} else {
		scores = m.classify(seq)
	}
	seq.Release()
	flat := scores.View(-1, scores.Dim(-1)) // prediction_scores.view(-1, vocab_size)
	tflat := labels.View(-1)
	loss = tensor.CrossEntropy(flat, tflat)
	flat.Release()
	tflat.Release()
	return scores, loss
}

// mlmHead is BertOnlyMLMHead: transform (dense, gelu, LayerNorm) and the decoder, the word embeddings'
// weight with its own bias.
func (m *Bert) mlmHead(seq *tensor.Tensor) *tensor.Tensor {
	defer m.rt.Scope("cls.predictions")()
	h := m.Transform.Forward(seq)
	leave := m.rt.Scope("cls.predictions.transform")
	a := tensor.GELU(h)
	leave()
	h.Release()
	n := m.TransformNorm.Forward(a)
	a.Release()
	leave = m.rt.Scope("cls.predictions.decoder")
	out := tensor.Linear(n, m.Word.Weight.Tensor, m.DecoderBias.Tensor)
	leave()
	n.Release()
	return out
}

// classify is BertPooler (tanh of the dense projection of the first token), dropout and the classifier.
func (m *Bert) classify(seq *tensor.Tensor) *tensor.Tensor {
	rt := m.rt
	leave := rt.Scope("bert.pooler")
	first := seq.Narrow(1, 0, 1)
	ft := first.View(first.Dim(0), first.Dim(2)) // hidden_states[:, 0]
	first.Release()
	pd := m.Pooler.Forward(ft)
	ft.Release()
	pooled := tensor.Tanh(pd)
	pd.Release()
	leave()
	leave = rt.Scope("dropout")
	dropped := tensor.Dropout(pooled, m.Config.HiddenDropout, m.Training)
	leave()
	pooled.Release()
	out := m.Classifier.Forward(dropped)
	dropped.Release()
	return out
}

// encode is BertModel.forward without the pooler: the embeddings, the extended mask, the layers (under
// reentrant checkpointing: the hidden states and the mask saved).
func (m *Bert) encode(idx *tensor.Tensor) *tensor.Tensor {
	emb := m.embeddings(idx)
	mask := m.extendedMask(idx.Dim(0), idx.Dim(1), emb.DType())
	x := emb
	for i, l := range m.Layers {
		var y *tensor.Tensor
		if m.Checkpoint != nil && m.Checkpoint(i) && m.Training {
			inputs := []*tensor.Tensor{x, mask}
			if mask == nil {
				inputs = inputs[:1]
			}
			y = tensor.CheckpointInputs(func(in, _ []*tensor.Tensor) *tensor.Tensor {
				mk := mask
				if mask != nil {
					mk = in[1]
				}
				return l.forward(in[0], mk)
			}, inputs)
		} else {
			y = l.forward(x, mask)
		}
		x.Release()
		x = y
		if m.AfterLayer != nil {
			m.AfterLayer(l, x)
		}
	}
	if mask != nil {
		mask.Release()
	}
	return x
}

// embeddings is BertEmbeddings.forward: word + token type embeddings, += position embeddings (in place),
// LayerNorm, dropout. The positions and token types are views of the buffers.
func (m *Bert) embeddings(idx *tensor.Tensor) *tensor.Tensor {
	rt := m.rt
	defer rt.Scope("bert.embeddings")()
	b, t := idx.Dim(0), idx.Dim(1)
	pos := m.PositionIDs.Narrow(1, 0, t)
	tt := m.TokenTypeIDs.Narrow(1, 0, t)
	types := tt.Expand(b, t)
	tt.Release()
	words := m.Word.Forward(idx)
	if m.InputRequiresGrad && !words.RequiresGrad() { // enable_input_require_grads on word_embeddings
		words.SetRequiresGrad(true)
	}
	tte := m.TokenType.Forward(types)
	types.Release()
	sum := tensor.Add(words, tte)
	words.Release()
	tte.Release()
	pe := m.Position.Forward(pos)
	pos.Release()
	sum2 := tensor.Add_(sum, pe) // embeddings += position_embeddings
	sum.Release()
	pe.Release()
	n := m.EmbedNorm.Forward(sum2)
	sum2.Release()
	out := tensor.Dropout(n, m.Config.HiddenDropout, m.Training)
	n.Release()
	return out
}

// extendedMask is the mask the layers add to the scores: eager attention's get_extended_attention_mask,
// attention_mask[:, None, None, :].to(dtype), (1.0 - mask) * min, (batch, 1, 1, seq); sdpa's
// _prepare_4d_attention_mask_for_sdpa, nothing when no token is padding, else the mask expanded to (batch, 1,
// seq, seq) in dtype, inverted and filled with min. Without a mask from UseAttentionMask, HF's default ones.
func (m *Bert) extendedMask(b, t int, dtype tensor.DType) *tensor.Tensor {
	rt := m.rt
	mask := m.mask
	if mask == nil { // attention_mask = torch.ones(((batch_size, seq_length)))
		mask = rt.FullLike(tensor.F32, []int{b, t}, 1, "attention_mask")
		defer mask.Release()
	}
	if m.Config.Attention == "flash" {
		if m.lengths == nil {
			return nil
		}
		v := mask.View(b, 1, 1, t)
		e := v.Expand(b, 1, t, t)
		v.Release()
		f := tensor.ToDType(e, dtype) // materialises (batch, 1, seq, seq)
		e.Release()
		inv := tensor.Rsub(f, 1)
		f.Release()
		bm := tensor.ToDType(inv, tensor.Bool)
		out := tensor.MaskedFill(inv, bm, tensor.MinFinite(dtype))
		inv.Release()
		bm.Release()
		return out
	}
	pdt := m.Word.Weight.Tensor.DType() // self.dtype: the parameters'
	v := mask.View(b, 1, 1, t)
	f := tensor.ToDType(v, pdt)
	v.Release()
	inv := tensor.Rsub(f, 1)
	f.Release()
	out := tensor.Scale(inv, tensor.MinFinite(pdt))
	inv.Release()
	return out
}

// forward is BertLayer.forward: attention (self-attention and its output block), then the feed-forward
// chunk (intermediate and output).
func (l *BertLayer) forward(x, mask *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	ctx := l.selfAttention(x, mask)
	a := l.block(ctx, x, l.AttnOut, l.AttnNorm, "attention.output")
	ctx.Release()
	leave := l.rt.Scope(join(l.name, "intermediate"))
	h := l.Intermediate.Forward(a)
	g := tensor.GELU(h)
	h.Release()
	leave()
	out := l.block(g, a, l.Output, l.OutNorm, "output")
	g.Release()
	a.Release()
	return out
}

// block is BertSelfOutput and BertOutput: LayerNorm(dropout(dense(h)) + input).
func (l *BertLayer) block(h, input *tensor.Tensor, dense Projection, norm *LayerNorm, name string) *tensor.Tensor {
	defer l.rt.Scope(join(l.name, name))()
	d := dense.Forward(h)
	dd := tensor.Dropout(d, l.model.Config.HiddenDropout, l.model.Training)
	d.Release()
	s := tensor.Add(dd, input)
	dd.Release()
	out := norm.Forward(s)
	s.Release()
	return out
}

// selfAttention is BertSelfAttention (eager) or BertSdpaSelfAttention: the projections viewed as (batch,
// heads, seq, head size), then the scores, mask, softmax, dropout and values, and the heads merged.
func (l *BertLayer) selfAttention(x, mask *tensor.Tensor) *tensor.Tensor {
	defer l.rt.Scope(join(l.name, "attention.self"))()
	cfg := l.model.Config
	b, t := x.Dim(0), x.Dim(1)
	hd := cfg.DModel / cfg.Heads
	heads := func(y *tensor.Tensor) *tensor.Tensor { // transpose_for_scores
		v := y.View(b, t, cfg.Heads, hd)
		y.Release()
		p := v.Transpose(1, 2)
		v.Release()
		return p
	}
	p := cfg.AttnDropout
	if !l.model.Training {
		p = 0
	}
	mq := l.Query.Forward(x)
	k, v := heads(l.Key.Forward(x)), heads(l.Value.Forward(x))
	q := heads(mq)
	var ctx *tensor.Tensor // (batch, seq, heads, head size)
	if cfg.Attention == "flash" {
		opts := tensor.AttentionOptions{Dropout: p, Training: l.model.Training}
		var o *tensor.Tensor
		if mask != nil {
			opts.KeyLens, opts.Bias = l.model.lengths, mask
			o = tensor.EfficientAttentionWith(q, k, v, opts)
		} else {
			o = tensor.FlashAttentionWith(q, k, v, opts)
		}
		ctx = o.Transpose(1, 2)
		o.Release()
	} else {
		ctx = eagerBertAttention(q, k, v, mask, float32(1/math.Sqrt(float64(hd))), p, l.model.Training)
	}
	q.Release()
	k.Release()
	v.Release()
	out := ctx.Reshape(b, t, cfg.DModel)
	ctx.Release()
	return out
}

// eagerBertAttention is BertSelfAttention.forward's attention: matmul(q, k^T) / sqrt(head size) (a division
// that saves nothing), + mask, softmax (float32 under autocast), dropout, matmul with v, permuted to (batch,
// seq, heads, head size) and made contiguous.
func eagerBertAttention(q, k, v, mask *tensor.Tensor, scale, p float32, training bool) *tensor.Tensor {
	kt := k.Transpose(-1, -2)
	mm := tensor.Matmul(q, kt)
	kt.Release()
	s := tensor.Scale(mm, scale)
	mm.Release()
	if mask != nil {
		sm := tensor.Add(s, mask)
		s.Release()
		s = sm
	}
	probs := tensor.Softmax(s)
	s.Release()
	dropped := tensor.Dropout(probs, p, training)
	probs.Release()
	o := tensor.Matmul(dropped, v)
	dropped.Release()
	ot := o.Transpose(1, 2)
	o.Release()
	out := ot.Contiguous()
	ot.Release()
	return out
}
