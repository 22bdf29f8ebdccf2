package train

import (
	"encoding/json"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/nn"
)

// frozenWorkloads are Meta.Workload blobs as snapshots recorded before the settings were typed stored them:
// the first two copied from recordings, the third with every setting away from its default.
var frozenWorkloads = []string{
	`{"model":"mlp","in_features":32,"hidden":128,"layers":2,"classes":8,"amp":"off","checkpoint":"off","attention":"naive","accum":1,"batch":64,"steps":8,"device":"meta","gpu_memory":25769803776,"context_reserve":536870912,"optimizer":"adam","lr":0.01,"zero_grad":"none","seed":1,"bug":"retain-graph"}`,
	`{"model":"gpt","preset":"tiny","layers":2,"seq":64,"d_model":64,"heads":4,"vocab":32,"bias":true,"amp":"bf16","checkpoint":"off","attention":"flash","accum":1,"batch":16,"steps":6,"device":"meta","gpu_memory":41943040,"context_reserve":4194304,"optimizer":"adamw","lr":0.003,"zero_grad":"none","seed":1}`,
	`{"model":"gpt","preset":"gpt2-medium","layers":24,"seq":1024,"d_model":1024,"heads":16,"vocab":50257,"bias":true,"amp":"fp16","checkpoint":"every:2","attention":"flash","accum":4,"batch":4,"steps":3,"device":"cpu","gpu_memory":25769803776,"context_reserve":536870912,"alloc_conf":"expandable_segments:True, max_split_size_mb:128","optimizer":"sgd","lr":0.0006,"zero_grad":"zero","seed":1}`,
}

// TestOldWorkloadsStillRead reads the frozen blobs into typed settings and writes them back byte for byte.
func TestOldWorkloadsStillRead(t *testing.T) {
	for i, blob := range frozenWorkloads {
		var c Config
		if err := json.Unmarshal([]byte(blob), &c); err != nil {
			t.Fatalf("blob %d: %v", i, err)
		}
		if err := c.Validate(); err != nil {
			t.Errorf("blob %d: %v", i, err)
		}
		back, err := json.Marshal(c)
		if err != nil {
			t.Fatal(err)
		}
		if string(back) != blob {
			t.Errorf("blob %d changed on a round trip:\n got %s\nwant %s", i, back, blob)
		}
	}
	var c Config
	if err := json.Unmarshal([]byte(frozenWorkloads[2]), &c); err != nil {
		t.Fatal(err)
	}
	if c.AMP != knob.AMPFP16 || c.Checkpoint != knob.CheckpointEvery(2) || c.Attention != knob.AttentionFlash || c.Device != device.CPU ||
		c.Optimizer != knob.SGD || c.ZeroGrad != knob.ZeroGradZero || !c.AllocConf.ExpandableSegments || c.AllocConf.MaxSplitSize != 128<<20 {
		t.Errorf("settings read as %+v", c)
	}
	if plan := planCheckpoint(c.Checkpoint); plan.blocks == nil || !plan.blocks(0) || plan.blocks(1) || !plan.blocks(2) || plan.attention {
		t.Error("every:2 does not checkpoint blocks 0, 2, 4, ...")
	}
}

// TestBadSettingsRefusedWhereTheyEnter checks a setting is parsed, and refused with a one-line reason, when a
// configuration is read, not later.
func TestBadSettingsRefusedWhereTheyEnter(t *testing.T) {
	tests := map[string]string{
		`{"amp":"fp8"}`:                             `unknown amp "fp8" (want off, fp16 or bf16)`,
		`{"checkpoint":"every:0"}`:                  `checkpoint "every:0": N must be a positive integer`,
		`{"checkpoint":"some"}`:                     `unknown checkpoint "some" (want off, all, every:N, attn or selective:ops)`,
		`{"attention":"sparse"}`:                    `unknown attention "sparse" (want naive or flash)`,
		`{"zero_grad":"maybe"}`:                     `unknown zero_grad "maybe" (want none or zero)`,
		`{"device":"tpu"}`:                          `unknown device "tpu" (want meta, cpu or cuda)`,
		`{"optimizer":"lion"}`:                      `unknown optimizer "lion" (want sgd, momentum, adam, adamw, adamw8bit, paged-adamw or paged-adamw8bit)`,
		`{"optimizer_impl":"magic"}`:                `unknown optimizer implementation "magic" (want foreach, fused or for-loop)`,
		`{"weights":"fp8"}`:                         `unknown weights "fp8" (want f32, bf16 or fp16)`,
		`{"lora_targets":"q,embeddings"}`:           `unknown lora target "embeddings" (want some of q,k,v,o,gate,up,down,qkv,gate_up,lm_head,embed, or all-linear)`,
		`{"loss":"chunked:0"}`:                      `loss "chunked:0": chunked:T takes T, the tokens a chunk, from 1 to 16777216`,
		`{"loss":"fused"}`:                          `unknown loss "fused" (want full, chunked:T, linear-ce:N, fused-linear-ce or litgpt-chunked:T)`,
		`{"loss":"litgpt-chunked:x"}`:               `loss "litgpt-chunked:x": litgpt-chunked:T takes T, the tokens a chunk, from 1 to 16777216`,
		`{"qlora_storage":"int4"}`:                  `unknown qlora storage "int4" (want uint8, bf16 or f32)`,
		`{"kbit_prep":"maybe"}`:                     `"maybe" is not true or false`,
		`{"load":"disk"}`:                           `unknown load "disk" (want none or hf)`,
		`{"versions":"jax=0.4"}`:                    `versions: unknown library "jax" (want some of torch, transformers, bitsandbytes, peft, accelerate)`,
		`{"lora_targets":"q,v,q"}`:                  `lora target "q" given twice`,
		`{"alloc_conf":"expandable_segments:true"}`: `alloc conf: Expected 'True' or 'False' at index 2 in ConfigTokenizer but got 'true'`,
	}
	for blob, want := range tests {
		var c Config
		err := json.Unmarshal([]byte(blob), &c)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want an error saying %q", blob, err, want)
		}
	}
}

// TestSettingsRoundTrip checks every setting's word parses back to the same value.
func TestSettingsRoundTrip(t *testing.T) {
	for _, s := range []string{"f32", "bf16", "fp16"} {
		if w, err := ParseWeights(s); err != nil || w.String() != s {
			t.Errorf("weights %q: %v, %v", s, w, err)
		}
	}
	// LoRA targets are a set: any order parses, and it reads back in the order of a decoder layer.
	for s, want := range map[string]string{"": "", "q,v": "q,v", "v,q": "q,v", "down,q,gate": "q,gate,down", "q,k,v,o,gate,up,down": "q,k,v,o,gate,up,down"} {
		if l, err := ParseLoRATargets(s); err != nil || l.String() != want {
			t.Errorf("lora targets %q: %v, %v; want %q", s, l, err, want)
		}
	}
	if DefaultLoRATargets.String() != "q,v" || AllLoRATargets.String() != "q,k,v,o,gate,up,down" {
		t.Errorf("default targets %q, all %q", DefaultLoRATargets, AllLoRATargets)
	}
	for _, s := range []string{"full", "chunked:128", "linear-ce:8", "fused-linear-ce", "litgpt-chunked:128"} {
		if l, err := ParseLoss(s); err != nil || l.String() != s {
			t.Errorf("loss %q: %v, %v", s, l, err)
		}
	}
	// Settings made in code have no source string and marshal to the canonical one.
	var a AllocConf
	a.ExpandableSegments = true
	if got := a.String(); got != "expandable_segments:True" {
		t.Errorf("AllocConf made in code reads %q", got)
	}
}

// TestLlamaWorkloadRoundTrip checks a Llama workload with every adapter setting away from its default
// survives the JSON a snapshot stores it in.
func TestLlamaWorkloadRoundTrip(t *testing.T) {
	c, err := PresetConfig("llama-3.1-8b")
	if err != nil {
		t.Fatal(err)
	}
	c.LoRA, c.LoRAAlpha, c.LoRADropout, c.QLoRA = 16, 32, 0.05, true
	c.LoRATargets, c.Weights, c.OptimizerImpl, c.Optimizer = AllLoRATargets, WeightsFP16, knob.Fused, knob.PagedAdamW8bit
	c.QLoRAHalf, c.QLoRAHead, c.Loss = ToggleOff, true, LossSetting{Kind: nn.LossChunkedHeld, Chunk: 128}
	blob, err := json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{`"weights":"fp16"`, `"lora_targets":"q,k,v,o,gate,up,down"`, `"optimizer_impl":"fused"`, `"optimizer":"paged-adamw8bit"`,
		`"qlora_head":true`, `"loss":"litgpt-chunked:128"`} {
		if !strings.Contains(string(blob), want) {
			t.Errorf("%s lacks %s", blob, want)
		}
	}
	var back Config
	if err := json.Unmarshal(blob, &back); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(back, c) {
		t.Errorf("round trip changed the workload:\n got %+v\nwant %+v", back, c)
	}
}

// TestSettingsSweepLeavesOutWhatIsAlreadySet: a run configured with expandable segments is not measured
// again "with expandable segments" as if that were a fix; a setting it does not have still is.
func TestSettingsSweepLeavesOutWhatIsAlreadySet(t *testing.T) {
	cfg := DefaultMLP()
	cfg.Device, cfg.Steps = "meta", 2
	conf, err := ParseAllocConf("expandable_segments:True")
	if err != nil {
		t.Fatal(err)
	}
	cfg.AllocConf = conf
	rows, err := SweepSettings(t.Context(), cfg, SettingsFixes)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range rows {
		names = append(names, r.Fix)
	}
	if slices.Contains(names, "expandable_segments:True") || !slices.Contains(names, "max_split_size_mb:128") || names[0] != "as configured" {
		t.Errorf("measured %v: want the run as configured and max_split_size_mb:128, not expandable segments again", names)
	}
}
