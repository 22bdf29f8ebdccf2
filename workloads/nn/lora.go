package nn

import (
	"fmt"
	"slices"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// LoRA as peft computes it (peft/tuners/lora/layer.py Linear, and bnb.py Linear4bit for a 4-bit base): the
// base layer frozen, and next to it lora_A (in -> r) and lora_B (r -> out), both bias-free nn.Linear in
// float32 (peft upcasts 16-bit adapter weights: autocast_adapter_dtype), lora_B initialised to zeros so the
// adapted model starts as the base one. The output is base(x) + lora_B(lora_A(dropout(x))) * alpha / r.

// LoRAConfig is a LoraConfig: rank, alpha, dropout and the projections adapted.
type LoRAConfig struct {
	Rank    int
	Alpha   float32
	Dropout float32
	// Targets are short names of LoRAProjections ("q", "k", "v", "o", "gate", "up", "down" of a Llama-family
	// layer; "qkv" and "gate_up" of Phi-3's fused ones; a Llama's "lm_head" and "embed"); each model says
	// which it has.
	Targets []string
	// DType is the adapters' dtype: float32 (peft since 0.12 upcasts 16-bit adapters, autocast_adapter_dtype;
	// the zero value) or bf16 (torchtune's, and peft's before 0.12 on a bf16 base).
	DType tensor.DType
}

// The targets beside a decoder layer's projections: lm_head and the input embeddings.
const (
	TargetLMHead = "lm_head"
	TargetEmbed  = "embed"
)

// LoRAProjections are the short names LoRA targets go by across the families, Llama's first.
var LoRAProjections = append(slices.Clone(LlamaProjections), "qkv", "gate_up", TargetLMHead, TargetEmbed)

// Validate checks the adapter's settings.
func (c LoRAConfig) Validate() error {
	if c.Rank <= 0 || c.Alpha <= 0 {
		return fmt.Errorf("lora needs a rank and alpha > 0 (got %d, %g)", c.Rank, c.Alpha)
	}
	if c.Dropout < 0 || c.Dropout >= 1 {
		return fmt.Errorf("lora dropout %g is not in [0, 1)", c.Dropout)
	}
	if len(c.Targets) == 0 {
		return fmt.Errorf("lora needs target modules (some of %s)", strings.Join(LoRAProjections, ", "))
	}
	for _, t := range c.Targets {
		if !slices.Contains(LoRAProjections, t) {
			return fmt.Errorf("unknown lora target %q (want some of %s)", t, strings.Join(LoRAProjections, ", "))
		}
	}
	return nil
}

func (c LoRAConfig) targets(short string) bool { return slices.Contains(c.Targets, short) }

// onlyOf checks that every target is one of the model's projections (nil adapts nothing: no error).
func (c *LoRAConfig) onlyOf(model string, projections []string) error {
	if c == nil {
		return nil
	}
	for _, t := range c.Targets {
		if !slices.Contains(projections, t) {
			return fmt.Errorf("%s has no %q projection to adapt (want some of %s)", model, t, strings.Join(projections, ", "))
		}
	}
	return nil
}

// Scaling is alpha / r (use_rslora off).
func (c LoRAConfig) Scaling() float32 { return c.Alpha / float32(c.Rank) }

// LoRALinear is a linear layer with a LoRA adapter. Its name is the adapted layer's ("...q_proj"); the base
// layer is "...q_proj.base_layer" and the adapters "...q_proj.lora_A.default" and "lora_B.default", as peft
// names them.
type LoRALinear struct {
	base
	Base    Projection
	A, B    *Linear
	Drop    *Dropout
	Scaling float32
	bnb     bool // the base is 4-bit: peft's bnb.Linear4bit forward
}

// newLoRALinear wraps the base layer made under name (its parameters already named name+".base_layer").
func newLoRALinear(rt *tensor.Runtime, name string, baseLayer Projection, in, out int, cfg LoRAConfig, training *bool) *LoRALinear {
	l := &LoRALinear{base: base{rt, name}, Base: baseLayer, Scaling: cfg.Scaling()}
	_, l.bnb = baseLayer.(*Linear4bit)
	l.A = NewLinear(rt, join(name, "lora_A.default"), in, cfg.Rank, false, cfg.DType) // kaiming_uniform(a=sqrt(5))
	l.B = &Linear{base: base{rt, join(name, "lora_B.default")},
		Weight: constParameter(rt, join(name, "lora_B.default.weight"), cfg.DType, []int{out, cfg.Rank}, 0)}
	l.Drop = NewDropout(rt, join(name, "lora_dropout.default"), cfg.Dropout, training)
	return l
}

// IsAdapter reports whether a parameter name is a LoRA adapter's (peft trains these and freezes the rest).
func IsAdapter(name string) bool { return isAdapter(name) }

// isAdapter reports whether a parameter name is a LoRA adapter's.
func isAdapter(name string) bool {
	return strings.Contains(name, ".lora_A.") || strings.Contains(name, ".lora_B.") ||
		strings.Contains(name, ".lora_embedding_A.") || strings.Contains(name, ".lora_embedding_B.")
}

// Parameters returns the base layer's parameters, then lora_A's and lora_B's.
func (l *LoRALinear) Parameters() []*Parameter {
	return append(append(l.Base.Parameters(), l.A.Parameters()...), l.B.Parameters()...)
}

func (l *LoRALinear) releaseState() {
	if r, ok := l.Base.(interface{ releaseState() }); ok {
		r.releaseState()
	}
}

// Forward is peft's Linear.forward: result = base(x); x cast to the adapter's dtype; result + lora_B(
// lora_A(dropout(x))) * scaling, converted back to the base result's dtype. Over a 4-bit base it is
// bnb.Linear4bit.forward: the base result cloned ("defensively", for backprop through a view), and the
// input cast and the output converted only when autocast is off.
func (l *LoRALinear) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	rt := l.rt
	result := l.Base.Forward(x)
	if l.bnb {
		c := tensor.CloneGrad(result)
		result.Release()
		result = c
	}
	resultDType := result.DType()
	convert := !l.bnb || rt.AutocastDType() == tensor.F32
	xin := x.Ref()
	if convert { // _cast_input_dtype(x, lora_A.weight.dtype)
		c := tensor.ToDType(x, l.A.Weight.Tensor.DType())
		xin.Release()
		xin = c
	}
	d := l.Drop.Forward(xin)
	a := l.A.Forward(d)
	d.Release()
	bo := l.B.Forward(a)
	a.Release()
	out := tensor.Scale(bo, l.Scaling)
	bo.Release()
	if l.bnb && convert { // output.to(expected_dtype)
		c := tensor.ToDType(out, resultDType)
		out.Release()
		out = c
	}
	sum := tensor.Add(result, out)
	result.Release()
	out.Release()
	if !l.bnb { // result.to(torch_result_dtype)
		c := tensor.ToDType(sum, resultDType)
		sum.Release()
		sum = c
	}
	xin.Release() // x, rebound to its cast, is a local until forward returns
	return sum
}

// LoRAEmbedding is peft's lora.Embedding: the base embedding frozen, lora_embedding_A (r, num_embeddings,
// zeros) and lora_embedding_B (embedding_dim, r, normal), and the output base(x) + F.embedding(x, A.T) @
// B.T * scaling, converted to the base result's dtype.
type LoRAEmbedding struct {
	base
	Base    *Embedding
	A, B    *Parameter
	Scaling float32
}

func newLoRAEmbedding(rt *tensor.Runtime, name string, baseLayer *Embedding, num, dim int, cfg LoRAConfig) *LoRAEmbedding {
	l := &LoRAEmbedding{base: base{rt, name}, Base: baseLayer, Scaling: cfg.Scaling()}
	l.A = constParameter(rt, join(name, "lora_embedding_A.default"), cfg.DType, []int{cfg.Rank, num}, 0)
	bn := join(name, "lora_embedding_B.default")
	leave := rt.Scope(owner(bn))
	t := rt.Randn(cfg.DType, []int{dim, cfg.Rank}, 1, bn, snapshot.CategoryParameter)
	leave()
	l.B = &Parameter{Name: bn, Tensor: t.SetRequiresGrad(true).SetName(bn)}
	return l
}

// Parameters returns the base table, then lora_embedding_A and lora_embedding_B.
func (l *LoRAEmbedding) Parameters() []*Parameter {
	return append(l.Base.Parameters(), l.A, l.B)
}

// Forward is peft's Embedding.forward: result = base(x); after_A = F.embedding(x, lora_embedding_A.T);
// result + (after_A @ lora_embedding_B.T) * scaling, converted back to the result's dtype.
func (l *LoRAEmbedding) Forward(idx *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	result := l.Base.Forward(idx)
	at := l.A.Tensor.T()
	afterA := tensor.Embedding(idx, at)
	at.Release()
	bt := l.B.Tensor.T()
	prod := tensor.Matmul(afterA, bt)
	bt.Release()
	afterA.Release()
	scaled := tensor.Scale(prod, l.Scaling)
	prod.Release()
	sum := tensor.Add(result, scaled)
	scaled.Release()
	dtype := result.DType()
	result.Release()
	out := tensor.ToDType(sum, dtype)
	sum.Release()
	return out
}
