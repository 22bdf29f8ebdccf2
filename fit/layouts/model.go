package layouts

import (
	"fmt"

	"github.com/oomdbg/oomdbg/workloads/dist/layout"
	"github.com/oomdbg/oomdbg/workloads/nn/hfconfig"
)

// ModelFromHF is the shape layout estimates of a decoder read from a config.json, at seq tokens a sequence
// (0: its context, at most 4096): a Llama-family decoder (RMSNorm, SwiGLU, untied unless the config ties
// them) or GPT-2 (LayerNorm, a 4h GeLU MLP, tied). Mixtures of experts and BERT are refused: layout has
// no formulas for them.
func ModelFromHF(m *hfconfig.Model, seq int) (layout.Model, error) {
	switch {
	case m.Family() == "bert":
		return layout.Model{}, &InputError{Reason: m.Architecture + ": layouts searches decoders; BERT has no pipeline formulas here"}
	case m.Experts > 0:
		return layout.Model{}, &InputError{Reason: fmt.Sprintf("%s: a mixture of %d experts; layouts has no expert-parallel formulas", m.Architecture, m.Experts)}
	}
	if seq == 0 {
		seq = min(4096, m.MaxPositions)
	}
	llama := m.Family() == "llama"
	return layout.Model{
		Layers: int64(m.Layers), Hidden: int64(m.DModel), Heads: int64(m.Heads), QueryGroups: int64(m.KVHeads),
		KVChannels: int64(m.HeadDim), FFN: int64(m.FFN), Vocab: int64(m.Vocab), Seq: int64(seq), MicroBatch: 1,
		GatedMLP: llama, RMSNorm: llama, UntiedEmbeddings: !m.Tied,
	}, nil
}
