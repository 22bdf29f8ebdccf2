package tui

import (
	"fmt"
	"strings"

	"github.com/charmbracelet/x/ansi"

	"github.com/oomdbg/oomdbg/knob"
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
var parallelChoices = []string{"ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "hsdp"}

// rows lists the rows the pane shows: the data-parallel ones for a rank of a job only.
func (p *fixesPane) rows() []int {
	n := rowParallel
	if p.base.GPUs > 1 {
		n = numFixRows
	}
	out := make([]int, n)
	for i := range out {
		out[i] = i
	}
	return out
}

// adapterRank is the rank of the LoRA and QLoRA choices, on allProjections, as oomdbg fixes chooses them.
const adapterRank = 16

// allProjections are the LoRA targets of the adapter choices: every linear layer of a decoder layer, as
// QLoRA's recipe adapts them (--lora-targets).
const allProjections = "q,k,v,o,gate,up,down"

// optimizerChoices are the optimizer row's choices: torch.optim's (AdamW in its three implementations)
// and bitsandbytes'.
var optimizerChoices = []string{string(knob.AdamW), string(knob.AdamW) + " " + string(knob.Fused),
	string(knob.AdamW) + " " + string(knob.ForLoop), string(knob.Adam), string(knob.Momentum), string(knob.SGD),
	string(knob.AdamW8bit), string(knob.PagedAdamW8bit), string(knob.PagedAdamW)}

// words names settings as their rows show them.
func words[T fmt.Stringer](vs ...T) []string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = v.String()
	}
	return out
}

// choices lists a row's choices for the base configuration; the base's own is always one of them.
func (p *fixesPane) choices(row int) []string {
	opts := p.offered(row)
	if cur := p.current(row); indexOf(opts, cur) < 0 {
		opts = append([]string{cur}, opts...)
	}
	return opts
}

// offered lists the choices a row offers for the base's model.
func (p *fixesPane) offered(row int) []string {
	c, llama := p.base.Fixes, p.base.Llama
	switch row {
	case rowAMP:
		return words(knob.AMPOff, knob.AMPBF16, knob.AMPFP16)
	case rowWeights:
		if !llama {
			return nil
		}
		return []string{"f32", "bf16", "fp16"}
	case rowAdapter:
		if !llama {
			return nil
		}
		return []string{"none", fmt.Sprintf("lora %d", adapterRank), fmt.Sprintf("qlora %d", adapterRank)}
	case rowAttention:
		if !p.base.GPT && !llama {
			return nil
		}
		return words(knob.AttentionNaive, knob.AttentionFlash)
	case rowCheckpoint:
		switch {
		case p.base.GPT:
			return words(knob.CheckpointOff, knob.CheckpointAttention, knob.CheckpointEvery(2), knob.CheckpointAll)
		case llama:
			return words(knob.CheckpointOff, knob.CheckpointEvery(2), knob.CheckpointAll)
		}
		return nil
	case rowAccum:
		var out []string
		for k := 1; k <= 8 && c.Batch*c.Accum/k >= 1; k *= 2 {
			if (c.Batch*c.Accum)%k == 0 {
				out = append(out, fmt.Sprintf("%d x %d", c.Batch*c.Accum/k, k))
			}
		}
		return out
	case rowOptimizer:
		return optimizerChoices
	case rowZeroGrad:
		return words(knob.ZeroGradNone, knob.ZeroGradZero)
	case rowBug:
		if c.Bug == "" {
			return []string{"none"}
		}
		return []string{c.Bug, "fixed"}
	case rowParallel:
		return parallelChoices
	case rowOffload:
		return []string{"none", "optimizer", "optimizer+params"}
	}
	return nil
}

// current names the base's choice in a row.
func (p *fixesPane) current(row int) string { return valueOf(p.base.Fixes, row) }

// choose makes the choices those of f, where the rows offer them.
func (p *fixesPane) choose(f Fixes) {
	for r := range numFixRows {
		v := valueOf(f, r)
		if r == rowBug && p.base.Fixes.Bug != "" && f.Bug == "" {
			v = "fixed"
		}
		if i := indexOf(p.choices(r), v); i >= 0 {
			p.choice[r] = i
		}
	}
}

// valueOf names the choice of c in a row.
func valueOf(c Fixes, row int) string {
	switch row {
	case rowAMP:
		return c.AMP
	case rowWeights:
		return weightsOf(c)
	case rowAdapter:
		return adapterOf(c)
	case rowAttention:
		return c.Attention
	case rowCheckpoint:
		return c.Checkpoint
	case rowAccum:
		return fmt.Sprintf("%d x %d", c.Batch, c.Accum)
	case rowOptimizer:
		return optimizerOf(c)
	case rowZeroGrad:
		return c.ZeroGrad
	case rowBug:
		if c.Bug == "" {
			return "none"
		}
		return c.Bug
	case rowParallel:
		return c.Parallel
	case rowOffload:
		if c.Offload == "" {
			return "none"
		}
		return c.Offload
	}
	return ""
}

// reset makes the choices match the base configuration.
func (p *fixesPane) reset() {
	for r := range numFixRows {
		p.choice[r] = indexOf(p.choices(r), p.current(r))
	}
}

// weightsOf, adapterOf and optimizerOf name a workload's choice as its row does.
func weightsOf(c Fixes) string {
	if c.Weights == "" {
		return "f32"
	}
	return c.Weights
}

func adapterOf(c Fixes) string {
	switch {
	case c.QLoRA:
		return fmt.Sprintf("qlora %d", c.LoRA)
	case c.LoRA > 0:
		return fmt.Sprintf("lora %d", c.LoRA)
	}
	return "none"
}

func optimizerOf(c Fixes) string {
	if c.OptimizerImpl != "" && c.OptimizerImpl != "foreach" {
		return c.Optimizer + " " + c.OptimizerImpl
	}
	return c.Optimizer
}

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

// config returns the base workload with the chosen fixes, on the meta device.
func (p *fixesPane) config() Workload {
	w := *p.base
	c := &w.Fixes
	pick := func(r int) string { return p.choices(r)[p.choice[r]] }
	c.AMP, c.Attention, c.Checkpoint, c.ZeroGrad = pick(rowAMP), pick(rowAttention), pick(rowCheckpoint), pick(rowZeroGrad)
	if o := pick(rowOptimizer); o != optimizerOf(p.base.Fixes) {
		c.Optimizer, c.OptimizerImpl, _ = strings.Cut(o, " ")
	}
	if wt := pick(rowWeights); wt != weightsOf(p.base.Fixes) {
		c.Weights = wt
	}
	if a := pick(rowAdapter); a != adapterOf(p.base.Fixes) {
		kind, rank, _ := strings.Cut(a, " ")
		c.LoRA, c.QLoRA, c.LoRATargets = 0, false, ""
		if kind != "none" {
			fmt.Sscan(rank, &c.LoRA)
			c.QLoRA, c.LoRATargets = kind == "qlora", allProjections
		}
	}
	fmt.Sscanf(pick(rowAccum), "%d x %d", &c.Batch, &c.Accum)
	if pick(rowBug) == "fixed" {
		c.Bug = ""
	}
	if p.base.GPUs > 1 {
		c.Parallel, c.Offload = pick(rowParallel), pick(rowOffload)
	}
	w.Device = "meta"
	return w
}

// describe names the chosen fixes that differ from the base.
func (p *fixesPane) describe() string {
	var parts []string
	c, b := p.config().Fixes, p.base.Fixes
	if c.AMP != b.AMP {
		parts = append(parts, "amp "+c.AMP)
	}
	if weightsOf(c) != weightsOf(b) {
		parts = append(parts, weightsOf(c)+" weights")
	}
	if adapterOf(c) != adapterOf(b) {
		parts = append(parts, adapterOf(c))
	}
	if c.Attention != b.Attention {
		parts = append(parts, c.Attention+" attention")
	}
	if c.Checkpoint != b.Checkpoint {
		parts = append(parts, "checkpoint "+c.Checkpoint)
	}
	if c.Batch != b.Batch {
		parts = append(parts, fmt.Sprintf("batch %d x %d", c.Batch, c.Accum))
	}
	if optimizerOf(c) != optimizerOf(b) {
		parts = append(parts, optimizerOf(c))
	}
	if c.ZeroGrad != b.ZeroGrad {
		parts = append(parts, "zero_grad "+c.ZeroGrad)
	}
	if c.Bug != b.Bug {
		parts = append(parts, "the leak fixed")
	}
	if c.Parallel != b.Parallel {
		parts = append(parts, c.Parallel)
	}
	if c.Offload != b.Offload && (c.Offload != "none" || b.Offload != "") {
		parts = append(parts, "offload "+c.Offload)
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
