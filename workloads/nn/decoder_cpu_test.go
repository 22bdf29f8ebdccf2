package nn

import (
	"math"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// cpuFamilies are the families' cases run with real math: the first case of each family in familyCases, the
// mixtures of experts routed by their routers' top-k (the cpu device computes the scores).
func cpuFamilies() map[string]familyCase {
	out := map[string]familyCase{}
	for _, c := range familyCases() {
		if c.AMP != "" || c.Checkpoint || c.LoRA != nil {
			continue
		}
		c.Routing = nil
		out[c.name] = c
	}
	return out
}

// trainDecoder runs one forward and backward of the case on the cpu device with the given attention,
// checkpointing and adapters, and returns the loss and every trained parameter's gradient.
func trainDecoder(t *testing.T, c familyCase, attention string, ckpt bool, adapter *LoRAConfig) (float32, map[string][]float32) {
	t.Helper()
	rt := gptRuntime(device.CPU)
	cfg := c.decoderConfig(t)
	cfg.Attention, cfg.Adapter = attention, adapter
	m, err := NewDecoder(rt, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range m.Parameters() { // lora_B starts at zero: give it values so that lora_A gets a gradient
		if strings.Contains(p.Name, "lora_B") {
			tensor.AddScalar_(p.Tensor, 0.01)
		}
	}
	if ckpt {
		m.Checkpoint = func(int) bool { return true }
	}
	m.InputRequiresGrad = adapter != nil
	idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
	loss := m.Loss(idx, idx)
	loss.Backward(false)
	grads := map[string][]float32{}
	for _, p := range Trainable(m) {
		if g := p.Tensor.Grad(); g != nil {
			grads[p.Name] = g.Values()
		}
	}
	l := loss.Item()
	loss.Release()
	idx.Release()
	m.Release()
	if n := rt.LiveHandles(); n != 0 {
		t.Errorf("%d references left", n)
	}
	return l, grads
}

// TestDecodersFlashMatchesEager checks, for every family on the cpu device, that flash attention told the
// family's scale, soft-cap and window gives eager attention's loss and gradients (eager attention reads the
// window from the mask: Gemma's rebuilt sliding mask, Mistral's for Phi-3).
func TestDecodersFlashMatchesEager(t *testing.T) {
	for name, c := range cpuFamilies() {
		t.Run(name, func(t *testing.T) {
			l1, eager := trainDecoder(t, c, "naive", false, nil)
			l2, flash := trainDecoder(t, c, "flash", false, nil)
			if math.Abs(float64(l1-l2)) > 1e-5 {
				t.Errorf("loss %v eager, %v flash", l1, l2)
			}
			for p, g := range eager {
				for i := range g {
					if d := math.Abs(float64(g[i] - flash[p][i])); d > 1e-4*(1+math.Abs(float64(g[i]))) {
						t.Fatalf("gradient of %s[%d]: eager %v, flash %v", p, i, g[i], flash[p][i])
					}
				}
			}
		})
	}
}

// TestDecodersCheckpointedGradientsAreIdentical checks that checkpointing every layer changes no gradient, for
// every family, in a full fine-tune and with LoRA (the router's auxiliary loss flowing back through the
// checkpoint's second output for Mixtral).
func TestDecodersCheckpointedGradientsAreIdentical(t *testing.T) {
	for name, c := range cpuFamilies() {
		targets := c.Family.Projections()
		for _, adapter := range []*LoRAConfig{nil, {Rank: 2, Alpha: 4, Targets: targets}} {
			t.Run(name+"/lora "+strings.Join(lora(adapter), ","), func(t *testing.T) {
				_, plain := trainDecoder(t, c, "naive", false, adapter)
				_, ckpt := trainDecoder(t, c, "naive", true, adapter)
				if len(plain) == 0 {
					t.Fatal("no gradients")
				}
				for p, g := range plain {
					if !slices.Equal(g, ckpt[p]) {
						t.Errorf("gradient of %s differs with checkpointing", p)
					}
				}
			})
		}
	}
}

func lora(a *LoRAConfig) []string {
	if a == nil {
		return nil
	}
	return a.Targets
}

// TestDecoderLoRATrainsOnlyAdapters checks what trains under LoRA for each family: the adapters, on the
// family's projections (every expert's for a mixture of experts; Phi-3's fused layers as wholes), and nothing
// else.
func TestDecoderLoRATrainsOnlyAdapters(t *testing.T) {
	for name, c := range cpuFamilies() {
		t.Run(name, func(t *testing.T) {
			targets := c.Family.Projections()
			_, grads := trainDecoder(t, c, "naive", false, &LoRAConfig{Rank: 2, Alpha: 4, Targets: targets})
			perLayer := len(targets)
			if c.Family.MoE() {
				perLayer = 4 + 3*c.Experts // q, k, v, o and every expert's three
				if c.Family == FamilyQwen2MoE {
					perLayer += 3 // the shared expert's
				}
			}
			if want := 2 * perLayer * c.Layers; len(grads) != want {
				t.Errorf("%d adapter weights got a gradient, want %d", len(grads), want)
			}
			for p := range grads {
				if !isAdapter(p) {
					t.Errorf("%s trained", p)
				}
			}
		})
	}
}

// TestDecoderConfigErrors checks the shape errors NewDecoder reports instead of building a wrong model.
func TestDecoderConfigErrors(t *testing.T) {
	cases := familyCases()
	for name, mod := range map[string]func(*DecoderConfig){
		"more experts per token than experts": func(c *DecoderConfig) { c.Family, c.Experts, c.ExpertsPerToken = FamilyMixtral, 2, 3 },
		"no expert width":                     func(c *DecoderConfig) { c.Family, c.Experts, c.ExpertsPerToken, c.ExpertFFN = FamilyQwen3MoE, 4, 2, 0 },
		"qwen2_moe without a shared expert":   func(c *DecoderConfig) { c.Family, c.Experts, c.ExpertsPerToken, c.ExpertFFN = FamilyQwen2MoE, 4, 2, 8 },
		"gemma without a query scale":         func(c *DecoderConfig) { c.Family, c.SlidingWindow = FamilyGemma2, 4 },
		"gemma3 without a pattern":            func(c *DecoderConfig) { c.Family, c.QueryScale, c.SlidingWindow = FamilyGemma3, 16, 4 },
		"unknown family":                      func(c *DecoderConfig) { c.Family = "falcon" },
		"phi3 has no q_proj": func(c *DecoderConfig) {
			c.Family, c.Adapter = FamilyPhi3, &LoRAConfig{Rank: 2, Alpha: 2, Targets: []string{"q"}}
		},
	} {
		cfg := cases[0].decoderConfig(t)
		cfg.Experts, cfg.ExpertsPerToken, cfg.ExpertFFN = 0, 0, 0
		mod(&cfg)
		if _, err := NewDecoder(gptRuntime(device.Meta), cfg); err == nil {
			t.Errorf("%s: no error", name)
		} else if strings.Contains(err.Error(), "\n") {
			t.Errorf("%s: error %q spans lines", name, err)
		}
	}
}
