// Package optim holds the optimizers of oomdbg's workloads: SGD (with or without momentum), Adam and AdamW,
// as PyTorch's multi-tensor (foreach) implementations run them on a GPU.
//
// What matters here is their memory: state is allocated lazily at the first step (so the first step is often
// where a run OOMs), and a multi-tensor step allocates its temporaries for every parameter at once.
package optim

import (
	"fmt"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Kind names an optimizer.
type Kind string

// The optimizers.
const (
	SGD      Kind = "sgd"
	Momentum Kind = "momentum"
	Adam     Kind = "adam"
	AdamW    Kind = "adamw"
)

// ParseKind returns the optimizer named s.
func ParseKind(s string) (Kind, error) {
	switch k := Kind(s); k {
	case SGD, Momentum, Adam, AdamW:
		return k, nil
	}
	return "", fmt.Errorf("unknown optimizer %q (want sgd, momentum, adam or adamw)", s)
}

// MarshalText returns the optimizer's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k), nil }

// UnmarshalText reads an optimizer's name (ParseKind).
func (k *Kind) UnmarshalText(text []byte) error {
	v, err := ParseKind(string(text))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// Config sets an optimizer's hyperparameters; zero values take PyTorch's defaults.
type Config struct {
	Kind        Kind
	LR          float32 // learning rate (default 1e-3)
	Momentum    float32 // SGD momentum (default 0.9 for Momentum)
	Beta1       float32 // Adam betas (default 0.9, 0.999)
	Beta2       float32
	Eps         float32 // Adam eps (default 1e-8)
	WeightDecay float32 // default 0, and 0.01 for AdamW
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

// New returns the optimizer cfg names for params.
func New(rt *tensor.Runtime, params []*nn.Parameter, cfg Config) (Optimizer, error) {
	if cfg.LR == 0 {
		cfg.LR = 1e-3
	}
	switch cfg.Kind {
	case SGD, Momentum:
		if cfg.Kind == Momentum && cfg.Momentum == 0 {
			cfg.Momentum = 0.9
		}
		return &sgd{base: base{rt: rt, params: params}, cfg: cfg}, nil
	case Adam, AdamW:
		if cfg.Beta1 == 0 {
			cfg.Beta1 = 0.9
		}
		if cfg.Beta2 == 0 {
			cfg.Beta2 = 0.999
		}
		if cfg.Eps == 0 {
			cfg.Eps = 1e-8
		}
		if cfg.Kind == AdamW && cfg.WeightDecay == 0 {
			cfg.WeightDecay = 0.01
		}
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
		if o.cfg.Kind == Momentum {
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
		if o.expAvg == nil {
			o.expAvg, o.expAvgSq = map[*nn.Parameter]*tensor.Tensor{}, map[*nn.Parameter]*tensor.Tensor{}
		}
		exps, sqs := make([]*tensor.Tensor, len(params)), make([]*tensor.Tensor, len(params))
		for i, p := range params { // _init_group: lazy state, exp_avg then exp_avg_sq for each parameter
			if o.expAvg[p] == nil {
				prev := o.rt.SetCategory(snapshot.CategoryOptimizerState)
				o.expAvg[p] = o.newState(tensor.ZerosLike(p.Tensor, "exp_avg", snapshot.CategoryOptimizerState), p, "exp_avg")
				o.expAvgSq[p] = o.newState(tensor.ZerosLike(p.Tensor, "exp_avg_sq", snapshot.CategoryOptimizerState), p, "exp_avg_sq")
				o.rt.SetCategory(prev)
			}
			exps[i], sqs[i] = o.expAvg[p], o.expAvgSq[p]
		}
		o.step++
		c := o.cfg
		var decayed []*tensor.Tensor
		switch {
		case c.Kind == AdamW && c.WeightDecay != 0: // decoupled: params scaled in place
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
		bc1 := 1 - pow(c.Beta1, o.step)
		bc2 := 1 - pow(c.Beta2, o.step)
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
	})
}

func releaseAll(ts []*tensor.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}
