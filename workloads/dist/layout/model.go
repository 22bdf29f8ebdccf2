package layout

import "fmt"

// Model is the shape of a GPT/Llama-style decoder: the arguments Megatron-LM's estimate reads
// (--num-layers, --hidden-size, --num-attention-heads, --num-query-groups, --kv-channels,
// --ffn-hidden-size, --seq-length, --micro-batch-size, the tokenizer's vocabulary, --swiglu,
// --normalization, --untie-embeddings-and-output-weights).
type Model struct {
	Layers      int64
	Hidden      int64
	Heads       int64
	QueryGroups int64 // key/value heads for grouped-query attention; 0 means Heads (multi-head attention)
	KVChannels  int64 // width of one head; 0 means Hidden/Heads, Megatron's default
	FFN         int64 // the MLP's inner width (for a gated MLP, the width of each of its two inputs)
	Vocab       int64 // the tokenizer's vocabulary, before Megatron pads it (PaddedVocab)
	Seq         int64 // sequence length of one sample
	MicroBatch  int64 // samples in one micro-batch

	GatedMLP         bool // SwiGLU: three h x FFN matrices instead of two
	RMSNorm          bool // RMSNorm has a weight only; LayerNorm a weight and a bias
	UntiedEmbeddings bool // a separate output layer instead of reusing the word embeddings

	// ActivationBytes is the size of an activation element (2 for bf16 or fp16, Megatron's and the
	// paper's assumption); 0 means 2. Dropout masks are one byte whatever it is.
	ActivationBytes int64
}

func (m Model) queryGroups() int64 {
	if m.QueryGroups == 0 {
		return m.Heads
	}
	return m.QueryGroups
}

func (m Model) kvChannels() int64 {
	if m.KVChannels == 0 {
		return m.Hidden / m.Heads
	}
	return m.KVChannels
}

func (m Model) activationBytes() int64 {
	if m.ActivationBytes == 0 {
		return 2
	}
	return m.ActivationBytes
}

func (m Model) normParams() int64 {
	if m.RMSNorm {
		return 1
	}
	return 2
}

// PaddedVocab is the vocabulary Megatron builds the embedding and output layer with: rounded up to a
// multiple of 128 times the TP size, so that every TP rank holds an equal, aligned slice
// (megatron/training/vocab_utils.py, _calculate_padded_vocab_size_cached, --make-vocab-size-divisible-by 128).
func (m Model) PaddedVocab(tp int) int64 {
	multiple := 128 * int64(tp)
	return (m.Vocab + multiple - 1) / multiple * multiple
}

// attentionParams are one layer's Q, K, V and output projections, without biases (Megatron's
// self_attn_term): h*(a*kv) for Q and for the output, h*(g*kv) for K and for V.
func (m Model) attentionParams() int64 {
	return 2 * m.Hidden * m.kvChannels() * (m.Heads + m.queryGroups())
}

// mlpParams are one layer's MLP matrices without biases: two h x FFN matrices, three when gated
// (Megatron's dense_mlp_params, 2*h*ffn*3/2 under --swiglu).
func (m Model) mlpParams() int64 {
	if m.GatedMLP {
		return 3 * m.Hidden * m.FFN
	}
	return 2 * m.Hidden * m.FFN
}

// validate reports the first shape that cannot describe a model.
func (m Model) validate() error {
	for _, f := range []struct {
		name string
		v    int64
	}{{"layers", m.Layers}, {"hidden", m.Hidden}, {"heads", m.Heads}, {"ffn", m.FFN}, {"vocab", m.Vocab},
		{"seq", m.Seq}, {"micro-batch", m.MicroBatch}} {
		if f.v <= 0 {
			return fmt.Errorf("model %s is %d; it must be positive", f.name, f.v)
		}
	}
	switch {
	case m.QueryGroups < 0 || m.KVChannels < 0 || m.ActivationBytes < 0:
		return fmt.Errorf("model query groups, kv channels and activation bytes must not be negative")
	case m.KVChannels == 0 && m.Hidden%m.Heads != 0:
		return fmt.Errorf("model hidden %d is not a multiple of heads %d; give the kv channels", m.Hidden, m.Heads)
	case m.Heads%m.queryGroups() != 0:
		return fmt.Errorf("model heads %d is not a multiple of query groups %d", m.Heads, m.queryGroups())
	}
	return nil
}
