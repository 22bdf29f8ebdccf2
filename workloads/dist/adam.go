package dist

import (
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// flatAdam is DeepSpeed's Adam on a flat fp32 partition: FusedAdam (ops/adam/fused_adam.py, one multi-tensor
// kernel, no temporaries) on the GPU, DeepSpeedCPUAdam (ops/adam/cpu_adam.py) in host memory when the
// optimizer is offloaded. Its state, exp_avg and exp_avg_sq, is made at the first step (torch.optim's lazy
// state), in the memory of the partition it updates.
type flatAdam struct {
	cfg       optim.Config
	p         *tensor.Tensor // the fp32 partition it updates
	label     string
	exp, sq   *tensor.Tensor
	steps     int
	decoupled bool // AdamW
}

func newFlatAdam(p *tensor.Tensor, cfg optim.Config, label string) *flatAdam {
	cfg = cfg.Defaults()
	return &flatAdam{cfg: cfg, p: p, label: label, decoupled: cfg.Kind == knob.AdamW}
}

// step updates the partition from its fp32 gradient g.
func (a *flatAdam) step(rt *tensor.Runtime, g *tensor.Tensor) {
	if a.exp == nil {
		prev := rt.SetCategory(snapshot.CategoryOptimizerState)
		a.exp = tensor.ZerosLike(a.p, a.label+".exp_avg", snapshot.CategoryOptimizerState).SetName(fmt.Sprintf("optimizer.state[%s].exp_avg", a.label))
		a.sq = tensor.ZerosLike(a.p, a.label+".exp_avg_sq", snapshot.CategoryOptimizerState).SetName(fmt.Sprintf("optimizer.state[%s].exp_avg_sq", a.label))
		rt.SetCategory(prev)
	}
	a.steps++
	c := a.cfg
	bc1 := 1 - float32(math.Pow(float64(c.Beta1), float64(a.steps)))
	bc2 := 1 - float32(math.Pow(float64(c.Beta2), float64(a.steps)))
	if a.decoupled && c.WeightDecay != 0 {
		tensor.Scale_(a.p, 1-c.LR*c.WeightDecay)
		tensor.AddFused_(a.exp, a.sq, g, nil, 0, c.Beta1, c.Beta2)
	} else {
		tensor.AddFused_(a.exp, a.sq, g, a.p, c.WeightDecay, c.Beta1, c.Beta2)
	}
	tensor.AdamUpdate_(a.p, a.exp, a.sq, -c.LR/bc1, float32(math.Sqrt(float64(bc2))), c.Eps)
}
