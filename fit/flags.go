package fit

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/workloads/train"
)

// Flags returns the `oomdbg run` flags that set everything a plan chooses, each given even where it keeps
// the configured value, so that they reproduce the plan after the workload's own flags whatever those say.
func Flags(c train.Config) []string {
	f := []string{"--batch", fmt.Sprint(c.Batch), "--accum", fmt.Sprint(max(c.Accum, 1)), "--amp", c.AMP.String()}
	if c.Model != "mlp" {
		f = append(f, "--attention", c.Attention.String(), "--checkpoint", c.Checkpoint.String())
	}
	f = append(f, "--optimizer", string(c.Optimizer))
	if c.OptimizerImpl != "" {
		f = append(f, "--optimizer-impl", string(c.OptimizerImpl))
	}
	f = append(f, "--zero-grad", c.ZeroGrad.String())
	if c.HF() {
		f = append(f, "--weights", c.Weights.String(), "--lora", fmt.Sprint(c.LoRA))
		if c.LoRA > 0 {
			f = append(f, "--lora-alpha", fmt.Sprint(c.LoRAAlpha), "--lora-targets", c.LoRATargets.String(), fmt.Sprintf("--qlora=%t", c.QLoRA))
		}
	}
	if p := c.Parallel; p.Parallel() {
		f = append(f, "--gpus", fmt.Sprint(p.World()), "--dp", p.Strategy.String())
	}
	if o := c.Offload(); o != (train.Offload{}) { // the optimizer's and the activations', in one list
		f = append(f, "--offload", o.String())
	}
	return f
}

// PlanFlagNames are the flags Flags may set: a workload's own flags among them are left out of a plan's
// command line, which sets them.
var PlanFlagNames = []string{"batch", "accum", "amp", "attention", "checkpoint", "optimizer", "optimizer-impl",
	"zero-grad", "weights", "lora", "lora-alpha", "lora-targets", "qlora", "gpus", "dp", "offload"}

// JoinFlags writes flags as one command line, quoting what a shell would split.
func JoinFlags(flags []string) string {
	out := make([]string, len(flags))
	for i, f := range flags {
		if f == "" || strings.ContainsAny(f, " \t\n'\"\\$`*?[]{}()<>|&;#~") {
			f = "'" + strings.ReplaceAll(f, "'", `'\''`) + "'"
		}
		out[i] = f
	}
	return strings.Join(out, " ")
}
