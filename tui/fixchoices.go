package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// The rows of the pane, each a setting with its choices.
const (
	rowAMP = iota
	rowWeights
	rowAdapter
	rowAttention
	rowCheckpoint
	rowAccum
	rowOptimizer
	rowZeroGrad
	rowBug
	rowParallel // a data-parallel rank's rows, shown for one only
	rowOffload
	numFixRows
)

var fixRowNames = [numFixRows]string{"mixed precision", "weights", "adapter", "attention", "checkpointing", "batch x accumulation", "optimizer", "zero_grad", "leak bug", "data parallel", "offload"}

// parallelChoices are the data-parallel row's choices: DDP, DeepSpeed's stages and FSDP's strategies.
var parallelChoices = dist.Strategies

// rows lists the rows the pane shows, the selection's index into them: those with a choice to make for the
// base's model (a GPT has no weights dtype or adapter to choose), the data-parallel ones for a rank of a job
// only.
func (p *fixesPane) rows() []int {
	n := rowParallel
	if p.base.GPUs > 1 {
		n = numFixRows
	}
	var out []int
	for r := range n {
		if len(options(p.base, r)) > 1 {
			out = append(out, r)
		}
	}
	return out
}

// adapterRank is the rank of the LoRA and QLoRA choices, on allProjections, as oomdbg fixes chooses them.
const adapterRank = 16

// allProjections are the LoRA targets of the adapter choices: every linear layer of a decoder layer, as
// QLoRA's recipe adapts them (--lora-targets).
var allProjections = train.AllLoRATargets

// optimizerChoices are the optimizer row's choices: torch.optim's (AdamW in its three implementations)
// and bitsandbytes'.
var optimizerChoices = []struct {
	optimizer knob.Optimizer
	impl      knob.OptimizerImpl
}{{knob.AdamW, ""}, {knob.AdamW, knob.Fused}, {knob.AdamW, knob.ForLoop}, {knob.Adam, ""}, {knob.Momentum, ""},
	{knob.SGD, ""}, {knob.AdamW8bit, ""}, {knob.PagedAdamW8bit, ""}, {knob.PagedAdamW, ""}}

// A choice is one of a row's settings: its label, as the row shows it, and what choosing it sets. It is made
// of typed values, so that nothing is parsed back from the label.
type choice struct {
	label string
	set   func(*Fixes) // nil for the base's own setting where the row does not offer it: it keeps the base's
}

// each makes a choice of each value, labelled as the value prints and set by set.
func each[T fmt.Stringer](set func(*Fixes, T), vs ...T) []choice {
	out := make([]choice, len(vs))
	for i, v := range vs {
		out[i] = choice{label: v.String(), set: func(f *Fixes) { set(f, v) }}
	}
	return out
}

// options lists a row's choices for workload w; w's own is always one of them, first when the row does not
// offer it.
func options(w *Workload, row int) []choice {
	opts := offered(w, row)
	if cur := label(w.Fixes, row); indexOfLabel(opts, cur) < 0 {
		opts = append([]choice{{label: cur}}, opts...)
	}
	return opts
}

// offered lists the choices a row offers for w's model.
func offered(w *Workload, row int) []choice {
	c, llama := w.Fixes, w.Llama
	switch row {
	case rowAMP:
		return each(func(f *Fixes, v knob.AMP) { f.AMP = v }, knob.AMPOff, knob.AMPBF16, knob.AMPFP16)
	case rowWeights:
		if !llama {
			return nil
		}
		return each(func(f *Fixes, v train.Weights) { f.Weights = v }, train.WeightsF32, train.WeightsBF16, train.WeightsFP16)
	case rowAdapter:
		if !llama {
			return nil
		}
		return []choice{adapter(0, false), adapter(adapterRank, false), adapter(adapterRank, true)}
	case rowAttention:
		if !w.GPT && !llama {
			return nil
		}
		return each(func(f *Fixes, v knob.Attention) { f.Attention = v }, knob.AttentionNaive, knob.AttentionFlash)
	case rowCheckpoint:
		set := func(f *Fixes, v knob.Checkpoint) { f.Checkpoint = v }
		switch {
		case w.GPT:
			return each(set, knob.CheckpointOff, knob.CheckpointAttention, knob.CheckpointEvery(2), knob.CheckpointAll)
		case llama:
			return each(set, knob.CheckpointOff, knob.CheckpointEvery(2), knob.CheckpointAll)
		}
		return nil
	case rowAccum:
		var out []choice
		for k := 1; k <= 8 && c.Batch*c.Accum/k >= 1; k *= 2 {
			if (c.Batch*c.Accum)%k == 0 {
				batch := c.Batch * c.Accum / k
				out = append(out, choice{accumLabel(batch, k), func(f *Fixes) { f.Batch, f.Accum = batch, k }})
			}
		}
		return out
	case rowOptimizer:
		out := make([]choice, len(optimizerChoices))
		for i, o := range optimizerChoices {
			out[i] = choice{optimizerLabel(o.optimizer, o.impl), func(f *Fixes) { f.Optimizer, f.OptimizerImpl = o.optimizer, o.impl }}
		}
		return out
	case rowZeroGrad:
		var out []choice
		for _, z := range []knob.ZeroGrad{knob.ZeroGradNone, knob.ZeroGradZero} {
			out = append(out, choice{zeroGradLabel(z), func(f *Fixes) { f.ZeroGrad = z }})
		}
		return out
	case rowBug:
		if c.Bug == "" {
			return []choice{{"none", func(f *Fixes) { f.Bug = "" }}}
		}
		bug := c.Bug
		return []choice{{bug, func(f *Fixes) { f.Bug = bug }}, {"fixed", func(f *Fixes) { f.Bug = "" }}}
	case rowParallel:
		return each(func(f *Fixes, v dist.Strategy) { f.Parallel = v }, parallelChoices...)
	case rowOffload:
		return each(func(f *Fixes, v dist.Offload) { f.Offload = v }, dist.Offloads...)
	}
	return nil
}

// adapter is the adapter row's choice of LoRA of a rank on allProjections (rank 0: none, a full fine-tune),
// on the 4-bit base with qlora.
func adapter(rank int, qlora bool) choice {
	return choice{adapterLabel(rank, qlora), func(f *Fixes) {
		f.LoRA, f.QLoRA, f.LoRATargets = rank, qlora, allProjections
		if rank == 0 {
			f.LoRATargets = 0
		}
	}}
}

// choices names a row's choices for the base configuration as the row shows them.
func (p *fixesPane) choices(row int) []string {
	opts := options(p.base, row)
	out := make([]string, len(opts))
	for i, o := range opts {
		out[i] = o.label
	}
	return out
}

// current names the base's choice in a row.
func (p *fixesPane) current(row int) string { return label(p.base.Fixes, row) }

// choose makes the choices those of f, where the rows offer them.
func (p *fixesPane) choose(f Fixes) {
	for r := range numFixRows {
		v := label(f, r)
		if r == rowBug && p.base.Fixes.Bug != "" && f.Bug == "" {
			v = "fixed"
		}
		if i := indexOf(p.choices(r), v); i >= 0 {
			p.choice[r] = i
		}
	}
}

// label names the choice of c in a row.
func label(c Fixes, row int) string {
	switch row {
	case rowAMP:
		return c.AMP.String()
	case rowWeights:
		return c.Weights.String()
	case rowAdapter:
		return adapterOf(c)
	case rowAttention:
		return c.Attention.String()
	case rowCheckpoint:
		return c.Checkpoint.String()
	case rowAccum:
		return accumLabel(c.Batch, c.Accum)
	case rowOptimizer:
		return optimizerOf(c)
	case rowZeroGrad:
		return zeroGradLabel(c.ZeroGrad)
	case rowBug:
		if c.Bug == "" {
			return "none"
		}
		return c.Bug
	case rowParallel:
		return c.Parallel.String()
	case rowOffload:
		return c.Offload.String()
	}
	return ""
}

// reset makes the choices match the base configuration.
func (p *fixesPane) reset() {
	for r := range numFixRows {
		p.choice[r] = indexOf(p.choices(r), p.current(r))
	}
}

// adapterOf and optimizerOf name a workload's choice as its row does.
func adapterOf(c Fixes) string   { return adapterLabel(c.LoRA, c.QLoRA) }
func optimizerOf(c Fixes) string { return optimizerLabel(c.Optimizer, c.OptimizerImpl) }

func adapterLabel(rank int, qlora bool) string {
	switch {
	case qlora:
		return fmt.Sprintf("qlora %d", rank)
	case rank > 0:
		return fmt.Sprintf("lora %d", rank)
	}
	return "none"
}

// optimizerLabel names an optimizer with its implementation, but for the default one: "adamw fused", "adamw".
func optimizerLabel(o knob.Optimizer, impl knob.OptimizerImpl) string {
	if impl != "" && impl != knob.Foreach {
		return string(o) + " " + string(impl)
	}
	return string(o)
}

// zeroGradLabel names a zero_grad choice as PyTorch's argument does: set_to_none (--zero-grad none, PyTorch's
// default) frees the gradients between steps, zero keeps them and fills them with zeros.
func zeroGradLabel(z knob.ZeroGrad) string {
	if z == knob.ZeroGradNone {
		return "set_to_none"
	}
	return z.String()
}

func accumLabel(batch, accum int) string { return fmt.Sprintf("%d x %d", batch, accum) }

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func indexOfLabel(opts []choice, s string) int {
	for i, o := range opts {
		if o.label == s {
			return i
		}
	}
	return -1
}

// config returns the base workload with the chosen fixes, on the meta device.
func (p *fixesPane) config() Workload {
	w := *p.base
	for _, r := range p.rows() {
		// A row left at the base's own choice keeps the base's settings, which its label may not say in full
		// (LoRA's targets, AdamW's implementation left out).
		if c := options(p.base, r)[p.choice[r]]; c.label != p.current(r) {
			c.set(&w.Fixes)
		}
	}
	w.Device = device.Meta
	return w
}

// describe names the chosen fixes that differ from the base.
func (p *fixesPane) describe() string {
	var parts []string
	c, b := p.config().Fixes, p.base.Fixes
	if c.AMP != b.AMP {
		parts = append(parts, "amp "+c.AMP.String())
	}
	if c.Weights != b.Weights {
		parts = append(parts, c.Weights.String()+" weights")
	}
	if adapterOf(c) != adapterOf(b) {
		parts = append(parts, adapterOf(c))
	}
	if c.Attention != b.Attention {
		parts = append(parts, c.Attention.String()+" attention")
	}
	if c.Checkpoint != b.Checkpoint {
		parts = append(parts, "checkpoint "+c.Checkpoint.String())
	}
	if c.Batch != b.Batch {
		parts = append(parts, "batch "+accumLabel(c.Batch, c.Accum))
	}
	if optimizerOf(c) != optimizerOf(b) {
		parts = append(parts, optimizerOf(c))
	}
	if c.ZeroGrad != b.ZeroGrad {
		parts = append(parts, "zero_grad "+zeroGradLabel(c.ZeroGrad))
	}
	if c.Bug != b.Bug {
		parts = append(parts, "the leak fixed")
	}
	if c.Parallel != b.Parallel {
		parts = append(parts, c.Parallel.String())
	}
	if c.Offload != b.Offload {
		parts = append(parts, "offload "+c.Offload.String())
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, ", ")
}

// choiceCells renders a row's choices, the chosen one in brackets, in width: when they do not fit, from a
// choice late enough that the chosen one shows, with "…" for those left out.
func choiceCells(opts []string, chosen, width int) string {
	cell := func(i int) string {
		if i == chosen {
			return "[" + opts[i] + "]"
		}
		return " " + opts[i] + " "
	}
	from := 0
	for {
		var b strings.Builder
		if from > 0 {
			b.WriteString("…")
		}
		for i := from; i <= chosen; i++ {
			b.WriteString(cell(i))
		}
		if ansi.StringWidth(b.String()) <= width || from == chosen {
			for i := chosen + 1; i < len(opts); i++ {
				b.WriteString(cell(i))
			}
			return b.String()
		}
		from++
	}
}
