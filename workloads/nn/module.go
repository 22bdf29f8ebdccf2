// Package nn holds the modules of oomdbg's workloads: a module tree whose paths ("blocks.3.attn.qkv") are
// the scopes every allocation is tagged with, the layers a training loop needs, and the models.
//
// Modules follow PyTorch's: the same parameters in the same order, the same initialisation, the same ops in
// forward, so the memory a model uses is the memory its PyTorch twin uses. Forward borrows its input (the
// caller still holds it) and returns a new reference the caller owns.
package nn

import (
	"math"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Module is a node of the module tree.
type Module interface {
	// Name is the module's path in the tree, e.g. "blocks.3.attn"; the root's is "".
	Name() string
	// Parameters returns the module's parameters and its children's, in registration order.
	Parameters() []*Parameter
}

// Layer is a module with a one-input forward.
type Layer interface {
	Module
	Forward(x *tensor.Tensor) *tensor.Tensor
}

// Parameter is a named tensor of a model's state: trainable while its tensor requires grad, frozen
// otherwise (the base model under LoRA).
type Parameter struct {
	Name   string // full path, e.g. "blocks.0.attn.c_attn.weight"
	Tensor *tensor.Tensor
	// Packed4Bit marks a bitsandbytes Params4bit: its uint8 tensor holds two parameters a byte.
	Packed4Bit bool
}

// Count returns how many parameters p holds: its elements, or twice its bytes for a packed 4-bit weight, as
// peft's get_nb_trainable_parameters counts a Params4bit (num_params * 2 * element_size).
func (p *Parameter) Count() int {
	if p.Packed4Bit {
		return p.Tensor.Numel() * 2 * p.Tensor.DType().Size()
	}
	return p.Tensor.Numel()
}

// Trainable reports whether the optimizer updates p (param.requires_grad).
func (p *Parameter) Trainable() bool { return p.Tensor.RequiresGrad() }

// base carries a module's name and runtime.
type base struct {
	rt   *tensor.Runtime
	name string
}

func (b *base) Name() string { return b.name }

// scope enters the module's scope; call the result to leave.
func (b *base) scope() func() { return b.rt.Scope(b.name) }

// join makes a child path: join("blocks.3", "attn") is "blocks.3.attn".
func join(parent, child string) string {
	if parent == "" {
		return child
	}
	return parent + "." + child
}

// newParameter allocates a parameter initialised uniformly in [-bound, bound], as PyTorch's kaiming_uniform
// with a=sqrt(5) does for Linear weights and biases.
func newParameter(rt *tensor.Runtime, name string, dtype tensor.DType, shape []int, bound float32) *Parameter {
	defer rt.Scope(owner(name))()
	t := rt.Uniform(dtype, shape, -bound, bound, name, snapshot.CategoryParameter)
	return &Parameter{Name: name, Tensor: t.SetRequiresGrad(true).SetName(name)}
}

// constParameter allocates a parameter with every element v (LayerNorm's ones and zeros).
func constParameter(rt *tensor.Runtime, name string, dtype tensor.DType, shape []int, v float32) *Parameter {
	defer rt.Scope(owner(name))()
	t := rt.Full(dtype, shape, v, name, snapshot.CategoryParameter)
	return &Parameter{Name: name, Tensor: t.SetRequiresGrad(true).SetName(name)}
}

// owner returns the module path of a parameter name: owner("blocks.3.attn.qkv.weight") is
// "blocks.3.attn.qkv". A parameter is allocated in its module's scope, so the trace says whose it is.
func owner(name string) string {
	if i := strings.LastIndexByte(name, '.'); i >= 0 {
		return name[:i]
	}
	return ""
}

// ReleaseParameters releases every parameter of m (and their gradients).
func ReleaseParameters(m Module) {
	for _, p := range m.Parameters() {
		p.Tensor.Release()
	}
}

// CountParameters returns the number of parameters of m (peft's all_param).
func CountParameters(m Module) int {
	n := 0
	for _, p := range m.Parameters() {
		n += p.Count()
	}
	return n
}

// CountTrainable returns the number of parameters of m that require grad (peft's trainable_params).
func CountTrainable(m Module) int {
	n := 0
	for _, p := range m.Parameters() {
		if p.Trainable() {
			n += p.Count()
		}
	}
	return n
}

// Trainable returns the parameters of m that require grad: what a training loop gives its optimizer.
func Trainable(m Module) []*Parameter {
	var out []*Parameter
	for _, p := range m.Parameters() {
		if p.Trainable() {
			out = append(out, p)
		}
	}
	return out
}

// Freeze stops autograd tracking every parameter of m (requires_grad_(False)), as peft freezes a base model.
func Freeze(m Module) {
	for _, p := range m.Parameters() {
		p.Tensor.SetRequiresGrad(false)
	}
}

// Linear is nn.Linear: y = x W^T + b.
type Linear struct {
	base
	Weight, Bias *Parameter
}

// NewLinear makes a Linear layer named name with PyTorch's default initialisation.
func NewLinear(rt *tensor.Runtime, name string, in, out int, bias bool, dtype tensor.DType) *Linear {
	bound := float32(1 / math.Sqrt(float64(in)))
	l := &Linear{base: base{rt, name}}
	l.Weight = newParameter(rt, join(name, "weight"), dtype, []int{out, in}, bound)
	if bias {
		l.Bias = newParameter(rt, join(name, "bias"), dtype, []int{out}, bound)
	}
	return l
}

// Parameters returns the weight and, if present, the bias.
func (l *Linear) Parameters() []*Parameter {
	if l.Bias == nil {
		return []*Parameter{l.Weight}
	}
	return []*Parameter{l.Weight, l.Bias}
}

// Forward applies the layer.
func (l *Linear) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	var b *tensor.Tensor
	if l.Bias != nil {
		b = l.Bias.Tensor
	}
	return tensor.Linear(x, l.Weight.Tensor, b)
}

// ReLU is nn.ReLU.
type ReLU struct{ base }

// NewReLU makes a ReLU named name.
func NewReLU(rt *tensor.Runtime, name string) *ReLU { return &ReLU{base{rt, name}} }

// Parameters returns nothing: ReLU has none.
func (*ReLU) Parameters() []*Parameter { return nil }

// Forward applies max(x, 0).
func (r *ReLU) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer r.scope()()
	return tensor.ReLU(x)
}

// GELU is nn.GELU (exact form).
type GELU struct{ base }

// NewGELU makes a GELU named name.
func NewGELU(rt *tensor.Runtime, name string) *GELU { return &GELU{base{rt, name}} }

// Parameters returns nothing: GELU has none.
func (*GELU) Parameters() []*Parameter { return nil }

// Forward applies GELU.
func (g *GELU) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer g.scope()()
	return tensor.GELU(x)
}

// Dropout is nn.Dropout; it is active only while Training is set.
type Dropout struct {
	base
	P        float32
	Training *bool // shared with the model, like module.training
}

// NewDropout makes a Dropout named name with probability p, active when *training.
func NewDropout(rt *tensor.Runtime, name string, p float32, training *bool) *Dropout {
	return &Dropout{base: base{rt, name}, P: p, Training: training}
}

// Parameters returns nothing: Dropout has none.
func (*Dropout) Parameters() []*Parameter { return nil }

// Forward applies dropout (or returns x itself when inactive or p is 0).
func (d *Dropout) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer d.scope()()
	return tensor.Dropout(x, d.P, *d.Training)
}

// LayerNorm is nn.LayerNorm over the last dimension, with weight and (optionally) bias.
type LayerNorm struct {
	base
	Weight, Bias *Parameter
	Eps          float32 // 0: nn.LayerNorm's default, 1e-5
}

// NewLayerNorm makes a LayerNorm named name over dim features.
func NewLayerNorm(rt *tensor.Runtime, name string, dim int, bias bool, dtype tensor.DType) *LayerNorm {
	l := &LayerNorm{base: base{rt, name}}
	l.Weight = constParameter(rt, join(name, "weight"), dtype, []int{dim}, 1)
	if bias {
		l.Bias = constParameter(rt, join(name, "bias"), dtype, []int{dim}, 0)
	}
	return l
}

// Parameters returns the weight and, if present, the bias.
func (l *LayerNorm) Parameters() []*Parameter {
	if l.Bias == nil {
		return []*Parameter{l.Weight}
	}
	return []*Parameter{l.Weight, l.Bias}
}

// Forward normalises x.
func (l *LayerNorm) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer l.scope()()
	var b *tensor.Tensor
	if l.Bias != nil {
		b = l.Bias.Tensor
	}
	eps := l.Eps
	if eps == 0 {
		eps = 1e-5
	}
	return tensor.LayerNorm(x, l.Weight.Tensor, b, eps)
}

// Embedding is nn.Embedding: a table of num vectors of size dim, initialised N(0, 1) as PyTorch does.
type Embedding struct {
	base
	Weight *Parameter
}

// NewEmbedding makes an Embedding named name.
func NewEmbedding(rt *tensor.Runtime, name string, num, dim int, dtype tensor.DType) *Embedding {
	e := &Embedding{base: base{rt, name}}
	leave := rt.Scope(name)
	t := rt.Randn(dtype, []int{num, dim}, 1, join(name, "weight"), snapshot.CategoryParameter)
	leave()
	e.Weight = &Parameter{Name: join(name, "weight"), Tensor: t.SetRequiresGrad(true).SetName(join(name, "weight"))}
	return e
}

// Parameters returns the table.
func (e *Embedding) Parameters() []*Parameter { return []*Parameter{e.Weight} }

// Forward looks up the vectors of the indices idx.
func (e *Embedding) Forward(idx *tensor.Tensor) *tensor.Tensor {
	defer e.scope()()
	return tensor.Embedding(idx, e.Weight.Tensor)
}

// Sequential is nn.Sequential: children applied in order, named "0", "1", ... under its own name.
type Sequential struct {
	base
	Layers []Layer
	// AfterLayer, when set, is called with each layer's output, like a forward hook registered on every
	// child. It borrows the output.
	AfterLayer func(l Layer, out *tensor.Tensor)
}

// NewSequential makes an empty Sequential named name; add layers named with Child.
func NewSequential(rt *tensor.Runtime, name string) *Sequential {
	return &Sequential{base: base{rt, name}}
}

// Child returns the path of the next child ("net.3").
func (s *Sequential) Child() string { return join(s.name, strconv.Itoa(len(s.Layers))) }

// Add appends a layer.
func (s *Sequential) Add(l Layer) { s.Layers = append(s.Layers, l) }

// Parameters returns the children's parameters in order.
func (s *Sequential) Parameters() []*Parameter {
	var ps []*Parameter
	for _, l := range s.Layers {
		ps = append(ps, l.Parameters()...)
	}
	return ps
}

// Forward applies the layers in order; each intermediate result is released as soon as the next layer has
// used it, as Python rebinding `x = layer(x)` drops the old x.
func (s *Sequential) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer s.scope()()
	h := x.Ref()
	for _, l := range s.Layers {
		y := l.Forward(h)
		h.Release()
		h = y
		if s.AfterLayer != nil {
			s.AfterLayer(l, h)
		}
	}
	return h
}

// PrepareForKbitTraining is the cast of peft's prepare_model_for_kbit_training: every float16 or bfloat16
// parameter that is not a Params4bit (norms, embeddings, lm_head, biases) upcast to float32 in place,
// param.data = param.data.to(torch.float32), in the model's parameter order: the float32 copy is made while
// the 16-bit one still exists, then the 16-bit one is freed. Adapters are left as they are: peft casts
// before get_peft_model adds them.
func PrepareForKbitTraining(m Module) {
	for _, p := range m.Parameters() {
		t := p.Tensor
		if p.Packed4Bit || isAdapter(p.Name) || (t.DType() != tensor.BF16 && t.DType() != tensor.F16) {
			continue
		}
		rt := t.Runtime()
		leave := rt.Scope(owner(p.Name))
		prev := rt.SetCategory(snapshot.CategoryParameter)
		f := tensor.ToDType(t, tensor.F32)
		rt.SetCategory(prev)
		leave()
		f.SetRequiresGrad(t.RequiresGrad()).SetName(p.Name)
		t.Release()
		p.Tensor = f
	}
}
