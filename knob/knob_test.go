package knob_test

import (
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/knob"
)

// TestWordsRoundTrip checks every setting's word parses back to the same value, and a bad one is refused
// with the words it wants.
func TestWordsRoundTrip(t *testing.T) {
	for _, s := range []string{"off", "fp16", "bf16"} {
		if a, err := knob.ParseAMP(s); err != nil || a.String() != s {
			t.Errorf("amp %q: %v, %v", s, a, err)
		}
	}
	for _, s := range []string{"off", "all", "attn", "every:1", "every:3", "selective:ops"} {
		if c, err := knob.ParseCheckpoint(s); err != nil || c.String() != s {
			t.Errorf("checkpoint %q: %v, %v", s, c, err)
		}
	}
	for _, s := range []string{"naive", "flash"} {
		if a, err := knob.ParseAttention(s); err != nil || a.String() != s {
			t.Errorf("attention %q: %v, %v", s, a, err)
		}
	}
	for _, s := range []string{"none", "zero"} {
		if z, err := knob.ParseZeroGrad(s); err != nil || z.String() != s {
			t.Errorf("zero_grad %q: %v, %v", s, z, err)
		}
	}
	for _, o := range knob.Optimizers {
		if back, err := knob.ParseOptimizer(string(o)); err != nil || back != o {
			t.Errorf("optimizer %q: %v, %v", o, back, err)
		}
	}
	for s, want := range map[string]knob.OptimizerImpl{"": knob.Foreach, "foreach": knob.Foreach, "fused": knob.Fused, "for-loop": knob.ForLoop} {
		if i, err := knob.ParseOptimizerImpl(s); err != nil || i != want {
			t.Errorf("optimizer impl %q: %v, %v", s, i, err)
		}
	}
	for s, want := range map[string]string{
		"every:0":       `checkpoint "every:0": N must be a positive integer`,
		"every:2000000": `checkpoint "every:2000000": N must be a positive integer`,
		"some":          `unknown checkpoint "some" (want off, all, every:N, attn or selective:ops)`,
		"selective:mm":  `unknown checkpoint "selective:mm" (want off, all, every:N, attn or selective:ops)`,
	} {
		if _, err := knob.ParseCheckpoint(s); err == nil || err.Error() != want {
			t.Errorf("checkpoint %q: %v, want %q", s, err, want)
		}
	}
	if _, err := knob.ParseOptimizer("lion"); err == nil || !strings.Contains(err.Error(), "want sgd, momentum, adam, adamw, adamw8bit, paged-adamw or paged-adamw8bit") {
		t.Errorf("optimizer lion: %v", err)
	}
}

// TestCheckpointBlocks checks which blocks each setting runs whole under checkpointing, against the rule
// torchtune and torchtitan state for every-N checkpointing: block i when i mod N is 0.
func TestCheckpointBlocks(t *testing.T) {
	tests := map[string]struct {
		layers  int
		blocks  []int
		attn    bool
		ops     bool
		periods int
	}{
		"off":           {layers: 5},
		"attn":          {layers: 5, attn: true},
		"selective:ops": {layers: 5, ops: true}, // every block, under the policy: none recomputed whole
		"all":           {layers: 5, blocks: []int{0, 1, 2, 3, 4}, periods: 1},
		"every:2":       {layers: 5, blocks: []int{0, 2, 4}, periods: 2},
		"every:3":       {layers: 7, blocks: []int{0, 3, 6}, periods: 3},
		"every:9":       {layers: 4, blocks: []int{0}, periods: 9},
	}
	for s, tc := range tests {
		c, err := knob.ParseCheckpoint(s)
		if err != nil {
			t.Fatal(err)
		}
		var got []int
		for i := range tc.layers {
			if c.Block(i) {
				got = append(got, i)
			}
		}
		if len(got) != len(tc.blocks) || c.Blocks(tc.layers) != len(tc.blocks) {
			t.Errorf("%s on %d layers: blocks %v (Blocks %d), want %v", s, tc.layers, got, c.Blocks(tc.layers), tc.blocks)
		}
		for i := range got {
			if got[i] != tc.blocks[i] {
				t.Errorf("%s: blocks %v, want %v", s, got, tc.blocks)
				break
			}
		}
		if c.Attention() != tc.attn || c.Ops() != tc.ops || c.Every() != tc.periods || c.Off() != (s == "off") {
			t.Errorf("%s: attention %v ops %v every %d off %v", s, c.Attention(), c.Ops(), c.Every(), c.Off())
		}
	}
}

// TestOptimizerStates holds States against torch.optim: the parameter-sized tensors each optimizer keeps per
// parameter after a step.
func TestOptimizerStates(t *testing.T) {
	var got map[string]int
	torchtest.Run(t, `
import json, torch
out = {}
for name, make in {"sgd": lambda ps: torch.optim.SGD(ps, lr=0.1),
                   "momentum": lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
                   "adam": lambda ps: torch.optim.Adam(ps),
                   "adamw": lambda ps: torch.optim.AdamW(ps)}.items():
    p = torch.nn.Parameter(torch.randn(4, 3))
    opt = make([p])
    p.grad = torch.randn(4, 3)
    opt.step()
    out[name] = sum(1 for v in opt.state[p].values() if torch.is_tensor(v) and v.shape == p.shape)
print(json.dumps(out))
`, &got)
	for name, n := range got {
		if s := knob.Optimizer(name).States(); s != n {
			t.Errorf("%s keeps %d states per parameter in torch.optim; States says %d", name, n, s)
		}
	}
	if len(got) != 4 {
		t.Errorf("torch reported %v", got)
	}
}
