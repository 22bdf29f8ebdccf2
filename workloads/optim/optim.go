// Package optim holds the optimizers of oomdbg's workloads: SGD (with or without momentum), Adam and AdamW as
// PyTorch runs them on a GPU (the multi-tensor foreach implementation by default, the fused kernel or the
// for-loop one on request), and bitsandbytes' 8-bit and paged AdamW (bnb.go).
//
// What matters here is their memory: state is allocated lazily at the first step (so the first step is often
// where a run OOMs), a multi-tensor step allocates its temporaries for every parameter at once, a for-loop
// step one parameter's at a time, and a fused step none.
package optim

import (
	"fmt"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Config sets an optimizer's hyperparameters; zero values take PyTorch's defaults.
type Config struct {
	Kind        knob.Optimizer
	LR          float32 // learning rate (default 1e-3)
	Momentum    float32 // SGD momentum (default 0.9 for Momentum)
	Beta1       float32 // Adam betas (default 0.9, 0.999)
	Beta2       float32
	Eps         float32            // Adam eps (default 1e-8)
	WeightDecay float32            // default 0, and 0.01 for AdamW
	Impl        knob.OptimizerImpl // Adam and AdamW: foreach (default), fused or for-loop
}

// Optimizer updates parameters from their gradients.
type Optimizer interface {
	// Step applies one update, allocating state at the first call.
	Step()
	// ZeroGrad clears the gradients: released when setToNone (PyTorch's default), else zeroed in place.
	ZeroGrad(setToNone bool)
	// Release frees the optimizer's state.
	Release()
}

// Defaults returns c with PyTorch's defaults for what is zero: lr 1e-3; momentum 0.9 for Momentum; betas
// (0.9, 0.999), eps 1e-8 and, for AdamW and bitsandbytes' AdamW, weight decay 0.01.
func (c Config) Defaults() Config {
	if c.LR == 0 {
		c.LR = 1e-3
	}
	switch c.Kind {
	case knob.Momentum:
		if c.Momentum == 0 {
			c.Momentum = 0.9
		}
	case knob.Adam, knob.AdamW, knob.AdamW8bit, knob.PagedAdamW, knob.PagedAdamW8bit:
		if c.Beta1 == 0 {
			c.Beta1 = 0.9
		}
		if c.Beta2 == 0 {
			c.Beta2 = 0.999
		}
		if c.Eps == 0 {
			c.Eps = 1e-8
		}
		if c.Kind != knob.Adam && c.WeightDecay == 0 {
			c.WeightDecay = 0.01
		}
	}
	return c
}

// New returns the optimizer cfg names for params.
func New(rt *tensor.Runtime, params []*nn.Parameter, cfg Config) (Optimizer, error) {
	cfg = cfg.Defaults()
	switch cfg.Kind {
	case knob.SGD, knob.Momentum:
		return &sgd{base: base{rt: rt, params: params}, cfg: cfg}, nil
	case knob.Adam, knob.AdamW, knob.AdamW8bit, knob.PagedAdamW, knob.PagedAdamW8bit:
		if cfg.Kind != knob.Adam && cfg.Kind != knob.AdamW {
			return newBNB(rt, params, cfg), nil
		}
		impl, err := knob.ParseOptimizerImpl(string(cfg.Impl))
		if err != nil {
			return nil, err
		}
		cfg.Impl = impl
		return &adam{base: base{rt: rt, params: params}, cfg: cfg}, nil
	}
	return nil, fmt.Errorf("unknown optimizer %q", cfg.Kind)
}

// base holds what every optimizer shares: the parameters and their state.
type base struct {
	rt     *tensor.Runtime
	params []*nn.Parameter
	state  []*tensor.Tensor // every state tensor, for Release
}

// withGrads returns the parameters that have gradients and the gradients, as PyTorch's _init_group
// collects them (parameters without a gradient are skipped).
func (b *base) withGrads() (params []*nn.Parameter, grads []*tensor.Tensor) {
	for _, p := range b.params {
		if g := p.Tensor.Grad(); g != nil {
			params = append(params, p)
			grads = append(grads, g)
		}
	}
	return params, grads
}

// newState allocates a named state tensor for parameter p.
func (b *base) newState(t *tensor.Tensor, p *nn.Parameter, slot string) *tensor.Tensor {
	t.SetName(fmt.Sprintf("optimizer.state[%s].%s", p.Name, slot))
	b.state = append(b.state, t)
	return t
}

func (b *base) ZeroGrad(setToNone bool) {
	for _, p := range b.params {
		g := p.Tensor.Grad()
		if g == nil {
			continue
		}
		if setToNone {
			p.Tensor.SetGrad(nil)
		} else {
			tensor.Zero_(g)
		}
	}
}

func (b *base) Release() {
	for _, s := range b.state {
		s.Release()
	}
	b.state = nil
}

// noGrad runs f as torch.no_grad() does an optimizer step, with new allocations tagged as temporaries.
func (b *base) noGrad(f func()) {
	prev := b.rt.SetCategory(snapshot.CategoryTemporary)
	defer b.rt.SetCategory(prev)
	defer b.rt.Scope("optimizer")()
	b.rt.NoGrad(f)
}

// sgd is torch.optim.SGD with foreach=True.
type sgd struct {
	base
	cfg Config
	buf map[*nn.Parameter]*tensor.Tensor // momentum buffers
}

func (o *sgd) Step() {
	o.noGrad(func() {
		params, grads := o.withGrads()
		if o.cfg.WeightDecay != 0 { // grads = _foreach_add(grads, params, alpha=wd): a temporary per parameter
			decayed := make([]*tensor.Tensor, len(grads))
			for i, g := range grads {
				decayed[i] = tensor.AddNoGrad(g, params[i].Tensor, o.cfg.WeightDecay, "sgd.decayed_grad")
			}
			defer releaseAll(decayed)
			grads = decayed
		}
		if o.cfg.Kind == knob.Momentum {
			if o.buf == nil {
				o.buf = map[*nn.Parameter]*tensor.Tensor{}
			}
			bufs := make([]*tensor.Tensor, len(grads))
			for i, p := range params {
				if b := o.buf[p]; b != nil {
					tensor.Scale_(b, o.cfg.Momentum)
					tensor.AddScaled_(b, grads[i], 1)
					bufs[i] = b
				} else { // the first step clones the gradient into the new buffer
					b := o.newState(tensor.Clone(grads[i], "momentum_buffer", snapshot.CategoryOptimizerState), p, "momentum_buffer")
					o.buf[p] = b
					bufs[i] = b
				}
			}
			grads = bufs
		}
		for i, p := range params {
			tensor.AddScaled_(p.Tensor, grads[i], -o.cfg.LR)
		}
	})
}

// adam is torch.optim.Adam / AdamW with foreach=True (the default on CUDA).
type adam struct {
	base
	cfg      Config
	step     int
	expAvg   map[*nn.Parameter]*tensor.Tensor
	expAvgSq map[*nn.Parameter]*tensor.Tensor
}

func (o *adam) Step() {
	o.noGrad(func() {
		params, grads := o.withGrads()
		exps, sqs := o.initGroup(params)
		o.step++
		switch o.cfg.Impl {
		case knob.Fused:
			o.fused(params, grads, exps, sqs)
		case knob.ForLoop:
			o.forLoop(params, grads, exps, sqs)
		default:
			o.foreach(params, grads, exps, sqs)
		}
	})
}

// initGroup is _init_group: lazy state for each parameter in order, the fused kernel's device step counter
// first (torch.zeros((), dtype=float32, device=p.device); the others keep theirs on the host), then exp_avg
// and exp_avg_sq.
func (o *adam) initGroup(params []*nn.Parameter) (exps, sqs []*tensor.Tensor) {
	if o.expAvg == nil {
		o.expAvg, o.expAvgSq = map[*nn.Parameter]*tensor.Tensor{}, map[*nn.Parameter]*tensor.Tensor{}
	}
	exps, sqs = make([]*tensor.Tensor, len(params)), make([]*tensor.Tensor, len(params))
	for i, p := range params {
		if o.expAvg[p] == nil {
			prev := o.rt.SetCategory(snapshot.CategoryOptimizerState)
			if o.cfg.Impl == knob.Fused {
				o.newState(o.rt.Zeros(tensor.F32, nil, "step", snapshot.CategoryOptimizerState), p, "step")
			}
			o.expAvg[p] = o.newState(tensor.ZerosLike(p.Tensor, "exp_avg", snapshot.CategoryOptimizerState), p, "exp_avg")
			o.expAvgSq[p] = o.newState(tensor.ZerosLike(p.Tensor, "exp_avg_sq", snapshot.CategoryOptimizerState), p, "exp_avg_sq")
			o.rt.SetCategory(prev)
		}
		exps[i], sqs[i] = o.expAvg[p], o.expAvgSq[p]
	}
	return exps, sqs
}

// foreach is _multi_tensor_adam.
func (o *adam) foreach(params []*nn.Parameter, grads, exps, sqs []*tensor.Tensor) {
	c := o.cfg
	var decayed []*tensor.Tensor
	switch {
	case c.Kind == knob.AdamW && c.WeightDecay != 0: // decoupled: params scaled in place
		for _, p := range params {
			tensor.Scale_(p.Tensor, 1-c.LR*c.WeightDecay)
		}
	case c.WeightDecay != 0: // grads = _foreach_add(grads, params, alpha=wd): temporaries
		decayed = make([]*tensor.Tensor, len(grads))
		for i, g := range grads {
			decayed[i] = tensor.AddNoGrad(g, params[i].Tensor, c.WeightDecay, "adam.decayed_grad")
		}
		grads = decayed
	}
	for i := range params {
		tensor.Lerp_(exps[i], grads[i], 1-c.Beta1)
	}
	for i := range params {
		tensor.Scale_(sqs[i], c.Beta2)
		tensor.Addcmul_(sqs[i], grads[i], grads[i], 1-c.Beta2)
	}
	releaseAll(decayed) // del device_grads
	bc1, bc2 := o.biasCorrections()
	// exp_avg_sq_sqrt = _foreach_sqrt(exp_avg_sqs): one temporary per parameter, all alive together.
	denom := make([]*tensor.Tensor, len(params))
	for i := range params {
		denom[i] = tensor.Sqrt(sqs[i], "adam.exp_avg_sq_sqrt")
	}
	for i, p := range params {
		tensor.Scale_(denom[i], 1/sqrt32(bc2))
		tensor.AddScalar_(denom[i], c.Eps)
		tensor.Addcdiv_(p.Tensor, exps[i], denom[i], -c.LR/bc1)
	}
	releaseAll(denom)
}

// forLoop is _single_tensor_adam, parameter by parameter: grad = grad.add(param, alpha=wd) (Adam) or
// param.mul_(1 - lr*wd) (AdamW); the moments in place; denom = (exp_avg_sq.sqrt() / bc2_sqrt).add_(eps), a
// square root and a quotient, the root freed at once and the quotient when the next parameter's is made;
// param.addcdiv_(exp_avg, denom).
func (o *adam) forLoop(params []*nn.Parameter, grads, exps, sqs []*tensor.Tensor) {
	c := o.cfg
	bc1, bc2 := o.biasCorrections()
	var grad, denom *tensor.Tensor // the loop's locals: each lives until rebound
	defer func() { grad.Release(); denom.Release() }()
	for i, p := range params {
		grad.Release()
		grad = grads[i].Ref()
		switch {
		case c.Kind == knob.AdamW && c.WeightDecay != 0:
			tensor.Scale_(p.Tensor, 1-c.LR*c.WeightDecay)
		case c.WeightDecay != 0:
			d := tensor.AddNoGrad(grad, p.Tensor, c.WeightDecay, "adam.decayed_grad")
			grad.Release()
			grad = d
		}
		tensor.Lerp_(exps[i], grad, 1-c.Beta1)
		tensor.Scale_(sqs[i], c.Beta2)
		tensor.Addcmul_(sqs[i], grad, grad, 1-c.Beta2)
		root := tensor.Sqrt(sqs[i], "adam.exp_avg_sq_sqrt")
		q := tensor.Scale(root, 1/sqrt32(bc2))
		root.Release()
		tensor.AddScalar_(q, c.Eps)
		denom.Release()
		denom = q
		tensor.Addcdiv_(p.Tensor, exps[i], denom, -c.LR/bc1)
	}
}

// fused is _fused_adam: torch._foreach_add_(state_steps, 1) on the device counters, then one kernel that
// updates parameters and moments in place.
func (o *adam) fused(params []*nn.Parameter, grads, exps, sqs []*tensor.Tensor) {
	c := o.cfg
	bc1, bc2 := o.biasCorrections()
	for i, p := range params {
		if c.Kind == knob.AdamW && c.WeightDecay != 0 {
			tensor.Scale_(p.Tensor, 1-c.LR*c.WeightDecay)
		}
		g := grads[i]
		if c.Kind == knob.Adam && c.WeightDecay != 0 { // inside the kernel: no temporary
			tensor.AddFused_(exps[i], sqs[i], g, p.Tensor, c.WeightDecay, c.Beta1, c.Beta2)
		} else {
			tensor.AddFused_(exps[i], sqs[i], g, nil, 0, c.Beta1, c.Beta2)
		}
		tensor.AdamUpdate_(p.Tensor, exps[i], sqs[i], -c.LR/bc1, sqrt32(bc2), c.Eps)
	}
}

func (o *adam) biasCorrections() (bc1, bc2 float32) {
	return 1 - pow(o.cfg.Beta1, o.step), 1 - pow(o.cfg.Beta2, o.step)
}

func releaseAll(ts []*tensor.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}
