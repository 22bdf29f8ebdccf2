package leaks

import (
	"strings"
	"testing"
)

// TestAdvice holds each finding's advice to the change PyTorch's FAQ and documentation prescribe for it.
func TestAdvice(t *testing.T) {
	lossPath := &RetainerPath{Root: "losses[3]", Path: []string{"AddmmBackward0[net.2] saved mat1", "NllLossBackward0", "losses[3]"}}
	outPath := &RetainerPath{Root: "outputs[3]", Path: []string{"AddmmBackward0[net.2] saved mat1", "outputs[3]"}}
	for name, tc := range map[string]struct {
		r    Result
		want string
	}{
		"a list of losses":   {Result{Verdict: Leak, Suspects: []Suspect{{Kind: RetainedGraph, RetainedBy: lossPath}}}, "losses.append(loss.item()), not losses.append(loss)"},
		"a list of outputs":  {Result{Verdict: Leak, Suspects: []Suspect{{Kind: RetainedGraph, RetainedBy: outPath}}}, "torch.no_grad()"},
		"stashed tensors":    {Result{Verdict: Leak, Suspects: []Suspect{{Kind: StashedOutputs, RetainedBy: outPath}}}, "t.detach().cpu()"},
		"nothing names them": {Result{Verdict: Leak, Suspects: []Suspect{{Kind: Unclassified}}}, "record heap dumps"},
		"a module attribute": {Result{Verdict: Held, Held: []HeldGroup{{RetainedBy: &RetainerPath{Root: "net.0.intermediate"}}}}, "not self.intermediate = ..."},
		"a variable":         {Result{Verdict: Held, Held: []HeldGroup{{RetainedBy: &RetainerPath{Root: "logits"}}}}, "del logits"},
		"an unnamed local": {Result{Verdict: Held, Held: []HeldGroup{{RetainedBy: &RetainerPath{Root: "local f32[4,50] mm.out"}}}},
			"local f32[4,50] mm.out holds a tensor into the next iteration"},
		"gradients":          {Result{Verdict: Held, Gradients: &GradientFinding{}}, "optimizer.zero_grad(set_to_none=True)"},
		"no leak, no advice": {Result{Verdict: NoLeak}, ""},
		"inconclusive, none": {Result{Verdict: Inconclusive}, ""},
	} {
		got := tc.r.Advice()
		if tc.want == "" && got != "" || !strings.Contains(got, tc.want) {
			t.Errorf("%s: advice %q, want it to say %q", name, got, tc.want)
		}
	}
}
