package dist

import (
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Adapters (LoRA, QLoRA) under the sharded strategies. peft freezes every parameter but the adapters
// before a model is wrapped, so a strategy that shards a block as soon as it is built takes its non-adapter
// parameters as frozen when the block holds adapters. QLoRA's packed 4-bit weights are sharded as 16-bit
// elements: FSDP flattens (FSDP1) or shards (FSDP2) only floating-point tensors of one dtype with the rest
// of the unit, and DeepSpeed ZeRO-3 partitions them likewise, so the recipes load the base with
// BitsAndBytesConfig(bnb_4bit_quant_storage=torch.bfloat16) (Answer.AI's fsdp_qlora, Hugging Face's FSDP
// and DeepSpeed QLoRA guides): the packed bytes stored as bf16, half as many elements; the quantization
// state (absmax and codes) is not a parameter and stays whole on every rank.

// peftFrozen reports whether params, one block's, hold LoRA adapters: then everything else in them is frozen.
func peftFrozen(params []*nn.Parameter) bool {
	for _, p := range params {
		if nn.IsAdapter(p.Name) {
			return true
		}
	}
	return false
}

// trainsUnder reports whether p is trained, given whether its block holds adapters (peft freezes the rest
// later, after the block is built).
func trainsUnder(p *nn.Parameter, peft bool) bool {
	return p.Tensor.RequiresGrad() && (!peft || nn.IsAdapter(p.Name))
}

// quantStorage stores each packed 4-bit weight of params as bf16 (bnb_4bit_quant_storage=torch.bfloat16):
// the same bytes, half as many elements.
func (b *base) quantStorage(params []*nn.Parameter) {
	for _, p := range params {
		t := p.Tensor
		if !p.Packed4Bit || t.DType() == tensor.BF16 {
			continue
		}
		bytes := t.Numel() * t.DType().Size()
		b.allocating(snapshot.CategoryParameter, "", func() {
			s := b.rt.Empty(tensor.BF16, []int{(bytes + 1) / 2, 1}, p.Name)
			t.SetData(s)
			s.Release()
		})
	}
}
