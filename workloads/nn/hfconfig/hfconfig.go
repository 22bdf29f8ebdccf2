// Package hfconfig reads the config.json of a Hugging Face transformers model into the shape oomdbg's
// workloads build, and holds the published configs of well-known models.
//
// It knows the architectures whose modules the runtime mirrors: LlamaForCausalLM, MistralForCausalLM and
// Qwen2ForCausalLM (workloads/nn's Llama family), the decoders written from them (MixtralForCausalLM,
// Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM and the text model of
// Gemma3ForConditionalGeneration, Phi3ForCausalLM), BertForMaskedLM and BertForSequenceClassification, and
// GPT2LMHeadModel (nanoGPT's GPT, which has GPT-2's parameters). Fields a config leaves out take the
// defaults of the architecture's configuration class (configuration_llama.py and its siblings). A
// config.json is input from anywhere: its size, types and values are checked, and every error is one line.
package hfconfig

import (
	"bytes"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
)

// MaxSize is the largest config.json read; published ones are about 1 KB.
const MaxSize = 1 << 20

// Limits on the shape: far above any published model, low enough that no count overflows and no model is
// built that no device could hold the embeddings of.
const (
	maxDim    = 1 << 17 // hidden_size, intermediate_size, head_dim
	maxLayers = 1 << 12
	maxHeads  = 1 << 12
	maxVocab  = 1 << 22
	maxSeq    = 1 << 24
)

// The architectures Parse builds.
const (
	Llama        = "LlamaForCausalLM"
	Mistral      = "MistralForCausalLM"
	Qwen2        = "Qwen2ForCausalLM"
	Mixtral      = "MixtralForCausalLM"
	Qwen2MoE     = "Qwen2MoeForCausalLM"
	Qwen3MoE     = "Qwen3MoeForCausalLM"
	Gemma2       = "Gemma2ForCausalLM"
	Gemma3       = "Gemma3ForCausalLM"
	Gemma3MM     = "Gemma3ForConditionalGeneration" // built as its text model, Gemma3ForCausalLM
	Phi3         = "Phi3ForCausalLM"
	BertMaskedLM = "BertForMaskedLM"
	BertClassify = "BertForSequenceClassification"
	GPT2         = "GPT2LMHeadModel"
	bertPreTrain = "BertForPreTraining" // a pre-training checkpoint's class, read as BertForMaskedLM
)

// Architectures lists the architectures Parse accepts.
var Architectures = []string{Llama, Mistral, Qwen2, Mixtral, Qwen2MoE, Qwen3MoE, Gemma2, Gemma3, Gemma3MM, Phi3,
	BertMaskedLM, BertClassify, GPT2}

// Model is the shape of a model, as the runtime builds it.
type Model struct {
	Architecture string // one of Architectures
	Vocab        int
	DModel       int // hidden_size (n_embd)
	Layers       int // num_hidden_layers (n_layer)
	Heads        int // num_attention_heads (n_head)
	KVHeads      int // num_key_value_heads (Heads for GPT-2 and for Llama configs without it)
	HeadDim      int // head_dim, or DModel / Heads
	FFN          int // intermediate_size (n_inner, 4 x n_embd for GPT-2)
	MaxPositions int // max_position_embeddings (n_positions)
	Tied         bool
	// QKVBias: q/k/v projections with biases (Qwen2); AttentionBias and MLPBias as LlamaConfig's.
	QKVBias, AttentionBias, MLPBias bool
	NormEps                         float64 // rms_norm_eps (layer_norm_epsilon)
	RopeTheta                       float64 // rope_theta (Llama family)
	Dropout                         float64 // attention_dropout (Llama family), resid_pdrop (GPT-2)
	// DType is torch_dtype as the config gives it ("bfloat16", "float16", "float32"), or "".
	DType string
	// The fields of the families beside Llama (families.go).
	Extra
}

// Family is "llama" for the Llama family and the decoders written from it, "bert" for BERT and "gpt" for
// GPT-2.
func (m *Model) Family() string {
	switch m.Architecture {
	case GPT2:
		return "gpt"
	case BertMaskedLM, BertClassify:
		return "bert"
	}
	return "llama"
}

// Parameters returns the model's parameter count, computed from its shape: the embeddings, each layer's
// projections (and biases) and norms, the final norm and an untied LM head (GPT-2: also the position
// embeddings, biases and LayerNorm biases).
func (m *Model) Parameters() int64 {
	d, v, l := int64(m.DModel), int64(m.Vocab), int64(m.Layers)
	if n, ok := m.familyParameters(); ok {
		return n
	}
	if m.Architecture == GPT2 {
		layer := 4*d /* two LayerNorms */ + d*3*d + 3*d + d*d + d + d*int64(m.FFN) + int64(m.FFN) + int64(m.FFN)*d + d
		n := v*d + int64(m.MaxPositions)*d + l*layer + 2*d
		if !m.Tied {
			n += v * d
		}
		return n
	}
	q, kv, f := int64(m.Heads*m.HeadDim), int64(m.KVHeads*m.HeadDim), int64(m.FFN)
	layer := d*q + 2*d*kv + q*d + 3*d*f + 2*d
	if m.QKVBias || m.AttentionBias {
		layer += q + 2*kv
	}
	if m.AttentionBias {
		layer += d
	}
	if m.MLPBias {
		layer += 2*f + d
	}
	n := v*d + l*layer + d
	if !m.Tied {
		n += v * d
	}
	return n
}

// ParseError is a config.json that cannot be built.
type ParseError struct {
	Field string // the offending field, or ""
	Err   error
}

func (e *ParseError) Error() string {
	if e.Field == "" {
		return "config.json: " + e.Err.Error()
	}
	return "config.json: " + e.Field + ": " + e.Err.Error()
}

func (e *ParseError) Unwrap() error { return e.Err }

// ErrUnknownArchitecture is an architecture Parse does not build.
var ErrUnknownArchitecture = errors.New("unknown architecture")

// Read parses a config.json from r, reading at most MaxSize bytes.
func Read(r io.Reader) (*Model, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, &ParseError{Err: err}
	}
	if len(data) > MaxSize {
		return nil, &ParseError{Err: fmt.Errorf("larger than %d bytes: not a model config", MaxSize)}
	}
	return Parse(data)
}

// Parse builds a Model from the bytes of a config.json.
func Parse(data []byte) (*Model, error) {
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&raw); err != nil {
		return nil, &ParseError{Err: fmt.Errorf("not a JSON object: %s", oneLine(err))}
	}
	if raw == nil {
		return nil, &ParseError{Err: errors.New("not a JSON object")}
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, &ParseError{Err: errors.New("trailing data after the JSON object")}
	}
	f := fields{raw: raw}
	arch := f.architecture()
	if f.err != nil {
		return nil, f.err
	}
	var m *Model
	switch arch {
	case Llama, Mistral, Qwen2:
		m = f.llama(arch)
	case Mixtral, Qwen2MoE, Qwen3MoE:
		m = f.moe(arch)
	case Gemma2, Gemma3, Gemma3MM:
		m = f.gemma(arch)
	case Phi3:
		m = f.phi3()
	case BertMaskedLM, BertClassify, bertPreTrain:
		m = f.bert(arch)
	case GPT2:
		m = f.gpt2()
	default:
		return nil, &ParseError{Field: "architectures", Err: fmt.Errorf("%w %q (known: %s; a decoder of Llama's shape runs as "+
			"LlamaForCausalLM from hidden_size, intermediate_size, num_hidden_layers, num_attention_heads, "+
			"num_key_value_heads, head_dim, vocab_size and tie_word_embeddings)", ErrUnknownArchitecture,
			arch, strings.Join(Architectures, ", "))}
	}
	if f.err != nil {
		return nil, f.err
	}
	if err := m.check(); err != nil {
		return nil, err
	}
	return m, nil
}

// fields reads typed values out of a config's JSON object, keeping the first error.
type fields struct {
	raw map[string]json.RawMessage
	err error
}

func (f *fields) fail(field string, err error) {
	if f.err == nil {
		f.err = &ParseError{Field: field, Err: err}
	}
}

// architecture returns architectures[0], or the architecture model_type implies when the list is absent.
func (f *fields) architecture() string {
	if v, ok := f.raw["architectures"]; ok && string(v) != "null" {
		var archs []string
		if err := json.Unmarshal(v, &archs); err != nil || len(archs) == 0 {
			f.fail("architectures", errors.New("want a non-empty list of class names"))
			return ""
		}
		if len(archs) > 1 {
			f.fail("architectures", fmt.Errorf("%d architectures; oomdbg builds one", len(archs)))
		}
		return archs[0]
	}
	types := map[string]string{"llama": Llama, "mistral": Mistral, "qwen2": Qwen2, "gpt2": GPT2, "mixtral": Mixtral,
		"qwen2_moe": Qwen2MoE, "qwen3_moe": Qwen3MoE, "gemma2": Gemma2, "gemma3_text": Gemma3, "gemma3": Gemma3MM,
		"phi3": Phi3, "bert": BertMaskedLM}
	mt := f.str("model_type", "")
	if a, ok := types[mt]; ok {
		return a
	}
	f.fail("architectures", fmt.Errorf("missing, and model_type %q names no known architecture (known: %s)", mt,
		strings.Join(Architectures, ", ")))
	return ""
}

// integer returns the field as an int in [1, limit], def when absent or null.
func (f *fields) integer(name string, def, limit int) int {
	v, ok := f.raw[name]
	if !ok || string(v) == "null" {
		return def
	}
	var x float64
	if err := json.Unmarshal(v, &x); err != nil {
		f.fail(name, fmt.Errorf("want a number, got %s", clip(v)))
		return def
	}
	if x != math.Trunc(x) || x < 1 || x > float64(limit) {
		f.fail(name, fmt.Errorf("want an integer in [1, %d], got %s", limit, clip(v)))
		return def
	}
	return int(x)
}

// number returns the field as a finite float in [lo, hi], def when absent or null.
func (f *fields) number(name string, def, lo, hi float64) float64 {
	v, ok := f.raw[name]
	if !ok || string(v) == "null" {
		return def
	}
	var x float64
	if err := json.Unmarshal(v, &x); err != nil || math.IsNaN(x) || x < lo || x > hi {
		f.fail(name, fmt.Errorf("want a number in [%g, %g], got %s", lo, hi, clip(v)))
		return def
	}
	return x
}

func (f *fields) boolean(name string, def bool) bool {
	v, ok := f.raw[name]
	if !ok || string(v) == "null" {
		return def
	}
	var b bool
	if err := json.Unmarshal(v, &b); err != nil {
		f.fail(name, fmt.Errorf("want true or false, got %s", clip(v)))
		return def
	}
	return b
}

func (f *fields) str(name, def string) string {
	v, ok := f.raw[name]
	if !ok || string(v) == "null" {
		return def
	}
	var s string
	if err := json.Unmarshal(v, &s); err != nil || len(s) > 64 {
		f.fail(name, fmt.Errorf("want a short string, got %s", clip(v)))
		return def
	}
	return s
}

// defaults are the configuration classes' defaults that differ between the Llama-family architectures.
var defaults = map[string]struct {
	vocab, ffn, kvHeads, maxPos int
}{
	Llama:   {32000, 11008, 0, 2048},
	Mistral: {32000, 14336, 8, 4096 * 32},
	Qwen2:   {151936, 22016, 32, 32768},
}

func (f *fields) llama(arch string) *Model {
	def := defaults[arch]
	m := &Model{Architecture: arch}
	m.Vocab = f.integer("vocab_size", def.vocab, maxVocab)
	m.DModel = f.integer("hidden_size", 4096, maxDim)
	m.FFN = f.integer("intermediate_size", def.ffn, maxDim)
	m.Layers = f.integer("num_hidden_layers", 32, maxLayers)
	m.Heads = f.integer("num_attention_heads", 32, maxHeads)
	m.KVHeads = f.integer("num_key_value_heads", def.kvHeads, maxHeads)
	if m.KVHeads == 0 {
		m.KVHeads = m.Heads
	}
	m.HeadDim = f.integer("head_dim", 0, maxDim)
	if m.HeadDim == 0 && m.Heads > 0 {
		m.HeadDim = m.DModel / m.Heads
	}
	m.MaxPositions = f.integer("max_position_embeddings", def.maxPos, maxSeq)
	m.Tied = f.boolean("tie_word_embeddings", false)
	m.NormEps = f.number("rms_norm_eps", 1e-6, 0, 1)
	m.RopeTheta = f.number("rope_theta", 10000, 1, 1e12)
	if v, ok := f.raw["rope_parameters"]; ok && string(v) != "null" { // transformers v5 moved rope_theta here
		var rp map[string]json.RawMessage
		if err := json.Unmarshal(v, &rp); err != nil {
			f.fail("rope_parameters", errors.New("want an object"))
		} else {
			sub := &fields{raw: rp}
			m.RopeTheta = sub.number("rope_theta", m.RopeTheta, 1, 1e12)
			if pe := (*ParseError)(nil); errors.As(sub.err, &pe) {
				f.fail("rope_parameters."+pe.Field, pe.Err)
			}
		}
	}
	m.Dropout = f.number("attention_dropout", 0, 0, 0.999)
	m.AttentionBias = f.boolean("attention_bias", false)
	m.MLPBias = f.boolean("mlp_bias", false)
	m.QKVBias = arch == Qwen2
	m.DType = f.dtype()
	if act := f.str("hidden_act", "silu"); act != "silu" {
		f.fail("hidden_act", fmt.Errorf("%q: the Llama family here computes silu", act))
	}
	return m
}

func (f *fields) gpt2() *Model {
	m := &Model{Architecture: GPT2}
	m.Vocab = f.integer("vocab_size", 50257, maxVocab)
	m.MaxPositions = f.integer("n_positions", 1024, maxSeq)
	m.DModel = f.integer("n_embd", 768, maxDim)
	m.Layers = f.integer("n_layer", 12, maxLayers)
	m.Heads = f.integer("n_head", 12, maxHeads)
	m.KVHeads = m.Heads
	m.FFN = f.integer("n_inner", 4*m.DModel, maxDim)
	if m.FFN != 4*m.DModel {
		f.fail("n_inner", fmt.Errorf("%d: nanoGPT's MLP is 4 x n_embd (%d)", m.FFN, 4*m.DModel))
	}
	if m.Heads > 0 {
		m.HeadDim = m.DModel / m.Heads
	}
	m.Tied = f.boolean("tie_word_embeddings", true)
	m.NormEps = f.number("layer_norm_epsilon", 1e-5, 0, 1)
	m.Dropout = f.number("resid_pdrop", 0.1, 0, 0.999)
	m.DType = f.dtype()
	return m
}

// dtype returns torch_dtype (transformers v5: dtype), checked.
func (f *fields) dtype() string {
	name := "torch_dtype"
	if _, ok := f.raw[name]; !ok {
		name = "dtype"
	}
	d := f.str(name, "")
	if d != "" && !slices.Contains([]string{"float32", "bfloat16", "float16"}, d) {
		f.fail(name, fmt.Errorf("%q (want float32, bfloat16 or float16)", d))
	}
	return d
}

// check validates what the fields must satisfy together.
func (m *Model) check() error {
	switch {
	case m.Heads%m.KVHeads != 0:
		return &ParseError{Field: "num_key_value_heads", Err: fmt.Errorf("%d attention heads are not a multiple of %d key-value heads", m.Heads, m.KVHeads)}
	case m.Architecture == GPT2 && m.DModel%m.Heads != 0:
		return &ParseError{Field: "n_head", Err: fmt.Errorf("n_embd %d is not divisible by %d heads", m.DModel, m.Heads)}
	case m.HeadDim == 0 || m.HeadDim%2 != 0 && m.Architecture != GPT2 && m.Family() != "bert":
		return &ParseError{Field: "head_dim", Err: fmt.Errorf("%d: rotary embeddings need an even, positive head size", m.HeadDim)}
	}
	return nil
}

// clip shows a JSON value in an error, cut to one short line.
func clip(v json.RawMessage) string {
	s := oneLine(errors.New(string(v)))
	if len(s) > 40 {
		s = s[:40] + "…"
	}
	return s
}

func oneLine(err error) string {
	return strings.Join(strings.Fields(err.Error()), " ")
}

//go:embed models/*.json
var published embed.FS

// Published returns the model of a published config by its preset name (e.g. "llama-3.1-8b").
func Published(name string) (*Model, error) {
	data, err := published.ReadFile("models/" + name + ".json")
	if err != nil {
		return nil, fmt.Errorf("no published config %q", name)
	}
	return Parse(data)
}

// PublishedNames lists the published configs held here.
func PublishedNames() []string {
	entries, _ := published.ReadDir("models")
	var names []string
	for _, e := range entries {
		names = append(names, strings.TrimSuffix(e.Name(), ".json"))
	}
	return names
}
