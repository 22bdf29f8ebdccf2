package nn

import (
	"encoding/json"
	"math/rand/v2"
	"testing"

	"github.com/oomdbg/oomdbg/internal/torchtest"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// familyCase is one model and run of the comparison with testdata/families.py; its JSON form is the
// script's.
type familyCase struct {
	Family     Family    `json:"family"`
	Batch      int       `json:"batch"`
	Seq        int       `json:"seq"`
	D          int       `json:"d"`
	Heads      int       `json:"heads"`
	KVHeads    int       `json:"kv_heads"`
	HeadDim    int       `json:"head_dim,omitempty"`
	Layers     int       `json:"layers"`
	Vocab      int       `json:"vocab"`
	FFN        int       `json:"ffn"`
	Tied       bool      `json:"tied"`
	AMP        string    `json:"amp,omitempty"`
	DType      string    `json:"dtype,omitempty"`
	Checkpoint bool      `json:"checkpoint,omitempty"`
	LoRA       *caseLoRA `json:"lora,omitempty"`
	// Mixtures of experts.
	Experts   int       `json:"experts,omitempty"`
	TopK      int       `json:"topk,omitempty"`
	MoEFFN    int       `json:"moe_ffn,omitempty"`
	SharedFFN int       `json:"shared_ffn,omitempty"`
	NormTopK  bool      `json:"norm_topk,omitempty"`
	Aux       float32   `json:"aux,omitempty"`
	Routing   [][][]int `json:"routing,omitempty"`
	// Gemma and Phi-3.
	QueryScale     float64 `json:"query_scale,omitempty"`
	AttnSoftcap    float32 `json:"attn_softcap,omitempty"`
	FinalSoftcap   float32 `json:"final_softcap,omitempty"`
	SlidingWindow  int     `json:"sliding_window,omitempty"`
	SlidingPattern int     `json:"sliding_pattern,omitempty"`
	Dropout        float32 `json:"dropout,omitempty"`
	// BERT.
	Task      string `json:"task,omitempty"`
	Labels    int    `json:"labels,omitempty"`
	TypeVocab int    `json:"type_vocab,omitempty"`
	MaxPos    int    `json:"max_pos,omitempty"`
	Lengths   []int  `json:"lengths,omitempty"`
	name      string
}

// decoderConfig returns the model of the case; attention is eager, as the script's.
func (c familyCase) decoderConfig(t testing.TB) DecoderConfig {
	t.Helper()
	dtype := tensor.F32
	if c.DType != "" {
		var err error
		if dtype, err = tensor.ParseDType(c.DType); err != nil {
			t.Fatal(err)
		}
	}
	moeFFN := c.MoEFFN
	if c.Family == FamilyMixtral {
		moeFFN = c.FFN
	}
	cfg := DecoderConfig{LlamaConfig: LlamaConfig{Vocab: c.Vocab, DModel: c.D, Layers: c.Layers, Heads: c.Heads,
		KVHeads: c.KVHeads, HeadDim: c.HeadDim, FFN: c.FFN, Tied: c.Tied, QKVBias: c.Family == FamilyQwen2MoE,
		RopeTheta: 10000, Attention: "naive", DType: dtype},
		Family: c.Family, Experts: c.Experts, ExpertsPerToken: c.TopK, ExpertFFN: moeFFN, SharedExpertFFN: c.SharedFFN,
		NormTopK: c.NormTopK, RouterAuxLoss: c.Aux, QueryScale: c.QueryScale, AttnSoftcap: c.AttnSoftcap,
		FinalSoftcap: c.FinalSoftcap, SlidingWindow: c.SlidingWindow, SlidingPattern: c.SlidingPattern,
		LocalRopeTheta: 10000, ResidDropout: c.Dropout}
	if c.LoRA != nil {
		cfg.Adapter = &LoRAConfig{Rank: c.LoRA.R, Alpha: c.LoRA.Alpha, Targets: c.LoRA.Targets}
	}
	return cfg
}

// routing returns the case's routing as the model takes it.
func (c familyCase) routing() Routing {
	if c.Routing == nil {
		return nil
	}
	f := FixedRouting{}
	for _, layer := range c.Routing {
		var flat []int32
		for _, tok := range layer {
			for _, e := range tok {
				flat = append(flat, int32(e))
			}
		}
		f.Experts = append(f.Experts, flat)
	}
	return f
}

// randomRouting draws a routing for every layer: each token's k distinct experts, from a generator of its own
// (the comparison's routing is the test's, written into the case for both sides).
func randomRouting(seed uint64, layers, tokens, experts, k int) [][][]int {
	rng := rand.New(rand.NewPCG(seed, 7))
	out := make([][][]int, layers)
	for l := range out {
		for range tokens {
			out[l] = append(out[l], rng.Perm(experts)[:k])
		}
	}
	return out
}

// familyCases are the shapes and runs compared, for every family: mixtures of experts with a fixed routing
// (Mixtral; Qwen2-MoE with its shared expert and top-k not renormalised; Qwen3-MoE with head norms, head_dim
// of its own and renormalised top-k; Mixtral with the router's auxiliary loss), Gemma 2 (soft-capping,
// sliding layers, tied), Gemma 3 (head norms, two rotary embeddings, a pattern of sliding layers) and Phi-3
// (fused projections, a window in the mask's values, residual dropout); each in float32, under bf16
// autocast and with checkpointing, and with LoRA on peft's targets.
func familyCases() []familyCase {
	const b, s = 2, 8
	base := familyCase{Batch: b, Seq: s, D: 32, Heads: 4, KVHeads: 2, Layers: 2, Vocab: 50, FFN: 48}
	with := func(mod func(*familyCase)) familyCase {
		c := base
		mod(&c)
		return c
	}
	shapes := []struct {
		name string
		c    familyCase
	}{
		{"mixtral", with(func(c *familyCase) {
			c.Family, c.Experts, c.TopK, c.Routing = FamilyMixtral, 4, 2, randomRouting(1, 2, b*s, 4, 2)
		})},
		{"qwen2_moe", with(func(c *familyCase) {
			c.Family, c.Experts, c.TopK, c.MoEFFN, c.SharedFFN = FamilyQwen2MoE, 4, 2, 16, 40
			c.Routing = randomRouting(2, 2, b*s, 4, 2)
		})},
		{"qwen3_moe", with(func(c *familyCase) {
			c.Family, c.HeadDim, c.Experts, c.TopK, c.MoEFFN, c.NormTopK = FamilyQwen3MoE, 16, 6, 3, 16, true
			c.Routing = randomRouting(3, 2, b*s, 6, 3)
		})},
		{"mixtral with aux loss", with(func(c *familyCase) {
			c.Family, c.Experts, c.TopK, c.Aux, c.Routing = FamilyMixtral, 4, 2, 0.02, randomRouting(4, 2, b*s, 4, 2)
		})},
		{"gemma2", with(func(c *familyCase) {
			c.Family, c.HeadDim, c.QueryScale, c.AttnSoftcap, c.FinalSoftcap = FamilyGemma2, 16, 16, 50, 30
			c.SlidingWindow, c.Tied = 4, true
		})},
		{"gemma3", with(func(c *familyCase) {
			c.Family, c.HeadDim, c.QueryScale, c.SlidingWindow, c.SlidingPattern = FamilyGemma3, 16, 16, 4, 2
			c.Tied, c.Layers = true, 3
		})},
		{"phi3", with(func(c *familyCase) { c.Family, c.SlidingWindow = FamilyPhi3, 5 })},
		{"phi3 mha with residual dropout", with(func(c *familyCase) {
			c.Family, c.KVHeads, c.Dropout = FamilyPhi3, 4, 0.1
		})},
	}
	var cases []familyCase
	add := func(name string, c familyCase) {
		c.name = name
		cases = append(cases, c)
	}
	for _, sh := range shapes {
		add(sh.name, sh.c)
		bf := sh.c
		bf.AMP = "bf16"
		add(sh.name+"/bf16 autocast", bf)
		ck := sh.c
		ck.Checkpoint = true
		add(sh.name+"/checkpoint", ck)
		both := bf
		both.Checkpoint = true
		add(sh.name+"/bf16 autocast, checkpoint", both)
	}
	lora := func(name string, c familyCase, targets []string, ckpt bool, dtype string) {
		c.LoRA, c.Checkpoint, c.DType = &caseLoRA{R: 4, Alpha: 8, Targets: targets}, ckpt, dtype
		add(name, c)
	}
	lora("mixtral/lora q,v (peft's default)", shapes[0].c, []string{"q", "v"}, false, "")
	lora("mixtral/lora experts, checkpoint", shapes[0].c, []string{"gate", "up", "down"}, true, "")
	lora("qwen2_moe/lora all, checkpoint, bf16 weights", shapes[1].c, LlamaProjections, true, "bf16")
	lora("gemma2/lora q,v, checkpoint", shapes[4].c, []string{"q", "v"}, true, "")
	lora("gemma3/lora all, checkpoint, bf16 weights", shapes[5].c, LlamaProjections, true, "bf16")
	lora("phi3/lora qkv,o,gate_up,down", shapes[6].c, []string{"qkv", "o", "gate_up", "down"}, false, "")
	lora("phi3/lora qkv, checkpoint", shapes[6].c, []string{"qkv"}, true, "")
	return cases
}

// TestDecodersSaveWhatPyTorchSaves compares the bytes autograd keeps after the forward and the loss with
// PyTorch's for the HF-style models of testdata/families.py, once per storage without parameters and
// buffers, exactly, for every family; the mixtures of experts route their tokens as the case says on both
// sides.
func TestDecodersSaveWhatPyTorchSaves(t *testing.T) {
	cases := familyCases()
	arg, _ := json.Marshal(cases)
	var want []uint64
	torchtest.RunFile(t, "testdata/families.py", &want, "saved", string(arg))
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			rt := gptRuntime(device.Meta)
			m, err := NewDecoder(rt, c.decoderConfig(t))
			if err != nil {
				t.Fatal(err)
			}
			m.Routing = c.routing()
			if c.Checkpoint {
				m.Checkpoint = func(int) bool { return true }
				m.InputRequiresGrad = c.LoRA != nil
			}
			idx := tokens(rt, c.Batch, c.Seq, c.Vocab)
			amp := tensor.F32
			if c.AMP == "bf16" {
				amp = tensor.BF16
			}
			loss := autocastLoss(rt, amp, func() *tensor.Tensor { return m.Loss(idx, idx) })
			checkSaved(t, rt, want[i])
			backwardAndRelease(t, rt, loss, idx, m.Release)
		})
	}
}
