package train

import (
	"fmt"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
)

// adapterLlama is a small Llama (hidden 64, MLP 128, 4 heads of 16, 2 key-value heads, vocabulary 100, 2
// layers) with LoRA of rank 4 on every projection, trained with mixed-precision AdamW.
func adapterLlama(t *testing.T, qlora bool) Config {
	t.Helper()
	m, err := hfconfig.Parse([]byte(`{"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
		"num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
		"max_position_embeddings": 32, "rms_norm_eps": 1e-5}`))
	if err != nil {
		t.Fatal(err)
	}
	c := FromHF(m)
	c.Batch, c.Seq, c.Steps = 2, 16, 2
	c.LoRA, c.LoRATargets, c.QLoRA = 4, AllLoRATargets, qlora
	c.AMP, c.Optimizer = knob.AMPBF16, knob.AdamW
	c.GPUMemory = 1 << 40
	return c
}

// adapterShape is one parameter of adapterLlama as PyTorch shapes it: (rows, the rest), in registration
// order (peft's LoRA layer: its base layer, then lora_A (r, in), then lora_B (out, r)).
type adapterShape struct {
	rows, rest int64
	adapter    bool
	linear     bool // a base linear weight (4-bit under QLoRA)
	layer      int  // -1: the root's (embeddings, final norm, LM head)
}

func adapterShapes() []adapterShape {
	const d, f, r, kv = 64, 128, 4, 32
	s := []adapterShape{{100, d, false, false, -1}}
	for l := range 2 {
		for _, io := range [][2]int64{{d, d}, {d, kv}, {d, kv}, {d, d}, {d, f}, {d, f}, {f, d}} { // q k v o gate up down
			in, out := io[0], io[1]
			s = append(s, adapterShape{out, in, false, true, l}, adapterShape{r, in, true, false, l}, adapterShape{out, r, true, false, l})
		}
		s = append(s, adapterShape{d, 1, false, false, l}, adapterShape{d, 1, false, false, l})
	}
	return append(s, adapterShape{d, 1, false, false, -1}, adapterShape{100, d, false, false, -1})
}

// statesAtStep is atStep without bitsandbytes' quantization state (absmax and codes), which no strategy
// shards. It includes the rotary embedding's inv_freq buffer, whole on every rank: 8 floats (head size 16).
func statesAtStep(t *testing.T, cfg Config) int64 {
	t.Helper()
	_, s := record(t, cfg)
	var total int64
	found := false
	replay(s, func(_ int, e *snapshot.Event, live map[uint64]*liveBlock) {
		if found || e.Action != snapshot.ActionPhase || e.Phase != snapshot.PhaseOptimizer || e.Iteration != 1 {
			return
		}
		found = true
		for _, b := range live {
			switch b.cat {
			case snapshot.CategoryParameter, snapshot.CategoryGradient, snapshot.CategoryOptimizerState:
				if !strings.Contains(b.label, " quant.") && !strings.Contains(b.label, "ipg_bucket") {
					total += b.requested
				}
			}
		}
	})
	if !found {
		t.Fatal("no optimizer phase in iteration 1")
	}
	return total
}

// TestAdapterModelStatesPerRank derives what each rank holds at the step of a LoRA (and QLoRA) fine-tune
// from the implementations' layouts, parameter by parameter: the frozen base sharded (FSDP, ZeRO-3) or
// whole (ZeRO-1/2 shard only what trains), with no gradient and no optimizer state; each adapter with its
// fp32 shard, fp32 gradient and Adam's two moments (16 bytes an element). FSDP1 runs peft's wrap policy (a
// unit per adapter, nested in its layer's; the frozen rest of a layer one unit, the embeddings, final norm
// and LM head the root's); FSDP2 shards every parameter on dim 0; QLoRA's packed 4-bit weights count as
// bf16 elements, half their bytes (bnb_4bit_quant_storage=bfloat16).
func TestAdapterModelStatesPerRank(t *testing.T) {
	t.Parallel()
	shapes := adapterShapes()
	elems := func(s adapterShape, qlora bool) int64 { // elements as the strategy stores the parameter
		n := s.rows * s.rest
		if qlora && s.linear {
			return ((n+1)/2 + 1) / 2 // packed two a byte, stored as bf16
		}
		return n
	}
	for _, qlora := range []bool{false, true} {
		base := int64(4) // the frozen base's bytes an element: fp32 weights, or bf16 under QLoRA
		if qlora {
			base = 2
		}
		const n = 8
		// FSDP1: per unit, ceil(numel/N) elements.
		var fsdp1 int64
		units := map[int]int64{} // frozen per layer (-1: the root)
		for _, s := range shapes {
			if s.adapter {
				fsdp1 += 16 * ceil(elems(s, qlora), n)
			} else {
				units[s.layer] += elems(s, qlora)
			}
		}
		for _, u := range units {
			fsdp1 += base * ceil(u, n)
		}
		// FSDP2: per parameter, ceil(rows/N) rows.
		var fsdp2 int64
		for _, s := range shapes {
			rows, rest := s.rows, s.rest
			if qlora && s.linear {
				rows, rest = elems(s, qlora), 1 // the packed tensor, (bytes/2, 1) in bf16
			}
			per := base
			if s.adapter {
				per = 16
			}
			fsdp2 += per * ceil(rows, n) * rest
		}
		// ZeRO-2 (N=4): the frozen base whole in bf16 (DeepSpeed's bf16 casts the model; packed weights stay
		// packed); the adapters, DeepSpeed's flat bf16 group: 2A + 2g + 12P.
		var frozen16, zero3 int64
		var adapters []int64
		for _, s := range shapes {
			e := s.rows * s.rest
			if qlora && s.linear {
				frozen16 += (e + 1) / 2 // uint8, two a byte
			} else if !s.adapter {
				frozen16 += 2 * e
			}
			if s.adapter {
				adapters = append(adapters, e)
			}
			// ZeRO-3 (N=4): every parameter partitioned, ceil(numel/4), in bf16; every one here is under the
			// persistence threshold, so it also stays gathered whole (2 bytes an element); adapters add an
			// fp32 master copy, Adam's moments and a bf16 gradient partition: 14 more bytes.
			z := elems(s, qlora)
			per := int64(2)
			if s.adapter {
				per = 16
			}
			zero3 += per*ceil(z, 4) + 2*z
		}
		aligned, part, grads0 := zeroLayout(adapters, 4)
		zero2 := frozen16 + 2*aligned + 2*grads0 + 12*part
		for _, c := range []struct {
			s    dist.Settings
			want int64
		}{
			{dist.Settings{GPUs: n, Strategy: dist.FSDPFull}, fsdp1},
			{dist.Settings{GPUs: n, Strategy: dist.FSDP2}, fsdp2},
			{dist.Settings{GPUs: 4, Strategy: dist.ZeRO2}, zero2},
			{dist.Settings{GPUs: 4, Strategy: dist.ZeRO3}, zero3},
		} {
			t.Run(fmt.Sprintf("%s/qlora %v", c.s.Strategy, qlora), func(t *testing.T) {
				t.Parallel()
				cfg := adapterLlama(t, qlora)
				cfg.Parallel = c.s
				const invFreq = 16 / 2 * 4
				if got := statesAtStep(t, cfg) - invFreq; got != c.want {
					t.Errorf("model states at the step: %d bytes, want %d (%+d)", got, c.want, got-c.want)
				}
			})
		}
	}
}
