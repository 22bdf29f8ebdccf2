package nn

import "github.com/oomdbg/oomdbg/workloads/tensor"

// What Phi-3 (Phi-3, Phi-3.5 and Phi-4, models/phi3 of transformers 4.51) changes in the decoder: the
// attention's q, k and v come from one fused qkv_proj and the MLP's gate and up from one gate_up_proj, each
// sliced out of the fused output as a view; dropout (resid_pdrop) on each block's output before the residual
// add; Mistral's mask (the sliding window changes its values, not its size).
//
// Fusing changes what backward keeps: a view keeps its whole storage, so attention saving v keeps the (batch,
// seq, q + 2 kv) output of qkv_proj, q and k included, where separate projections let the q and k outputs go
// after the rotary embedding; the MLP saves gate and up as before, now one storage. In backward each slice of
// qkv_proj's output sends back a gradient of the full fused size (zeros with the slice copied in,
// SliceBackward0), summed as they arrive. LoRA adapts the fused layers as wholes: peft's targets are qkv_proj,
// o_proj, gate_up_proj and down_proj, one adapter of out = q + 2 kv (or 2 x ffn) rows each.

// fusedQKV is Phi3Attention's split of qkv_proj's output: qkv[..., :q], qkv[..., q:q+kv] and qkv[..., q+kv:],
// each viewed as (batch, seq, heads, head_dim) and transposed to (batch, heads, seq, head_dim).
func (a *DecoderAttention) fusedQKV(x *tensor.Tensor) (q, k, v *tensor.Tensor) {
	b, t := x.Dim(0), x.Dim(1)
	qkv := a.QKV.Forward(x)
	qp, kvp := a.heads*a.headDim, a.kvh*a.headDim
	part := func(start, n int) *tensor.Tensor {
		s := qkv.Narrow(-1, start, n)
		v := s.View(b, t, -1, a.headDim)
		s.Release()
		tr := v.Transpose(1, 2)
		v.Release()
		return tr
	}
	q, k, v = part(0, qp), part(qp, kvp), part(qp+kvp, kvp)
	qkv.Release()
	return q, k, v
}

// fusedForward is Phi3MLP.forward: up_states = gate_up_proj(x); gate, up_states = up_states.chunk(2, dim=-1)
// (views, one SplitBackward0); up_states * act(gate); down_proj.
func (m *GatedMLP) fusedForward(x *tensor.Tensor) *tensor.Tensor {
	gu := m.GateUp.Forward(x)
	parts := gu.Split(gu.Dim(-1)/2, -1)
	gu.Release()
	gate, up := parts[0], parts[1]
	act := m.act(gate)
	p := tensor.Mul(up, act)
	up.Release()
	act.Release()
	out := m.Down.Forward(p)
	p.Release()
	gate.Release()
	return out
}
