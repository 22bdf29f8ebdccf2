package nn

import (
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Loss returns the mean cross-entropy of the model's next-token predictions (plus the router's auxiliary
// loss, when its logits are output); the logits are freed as soon as it is computed.
func (m *Decoder) Loss(idx, labels *tensor.Tensor) *tensor.Tensor {
	logits, loss := m.ForwardLoss(idx, labels)
	logits.Release()
	return loss
}

// ForwardLoss is the family's ForCausalLM.forward(input_ids, labels=labels): the logits of lm_head
// (soft-capped for Gemma 2: divided by the cap, tanh, times the cap), ForCausalLMLoss, and for a mixture of
// experts whose router logits are output, loss += router_aux_loss_coef * load_balancing_loss_func(...).
func (m *Decoder) ForwardLoss(idx, labels *tensor.Tensor) (logits, loss *tensor.Tensor) {
	h, routerLogits := m.forwardModel(idx)
	leave := m.rt.Scope("lm_head")
	sliced := h.Narrow(1, 0, h.Dim(1))
	leave()
	logits = m.LMHead.Forward(sliced)
	sliced.Release()
	if c := m.Config.FinalSoftcap; c > 0 && m.Config.Family == FamilyGemma2 {
		logits = softcap(logits, c)
	}
	logits, loss = causalLMLoss(logits, labels)
	if len(routerLogits) > 0 {
		aux := loadBalancingLoss(m.rt, routerLogits, m.Config.Experts, m.Config.ExpertsPerToken)
		releaseAll(routerLogits)
		scaled := tensor.Scale(aux, m.Config.RouterAuxLoss)
		aux.Release()
		total := tensor.Add(loss, scaled)
		scaled.Release()
		loss.Release()
		loss = total
	}
	h.Release()
	return logits, loss
}

// forwardModel is the family's Model.forward: embeddings (Gemma 3's scaled in the embedding module), the
// positions, the eager attention's causal mask (none for flash attention), the rotary cos and sin (and Gemma
// 3's local ones), Gemma 2's normalizer, the layers under checkpointing when asked, the final norm. It returns
// the final hidden states and, when the auxiliary loss asks for them, every layer's router logits.
func (m *Decoder) forwardModel(idx *tensor.Tensor) (*tensor.Tensor, []*tensor.Tensor) {
	rt, cfg := m.rt, &m.Config
	b, t := idx.Dim(0), idx.Dim(1)
	embeds := m.Embed.Forward(idx)
	if cfg.Family == FamilyGemma3 {
		embeds = m.scaleEmbeddings(embeds)
	}
	if m.InputRequiresGrad && !embeds.RequiresGrad() { // the embedding module's output made to require grad
		embeds.SetRequiresGrad(true)
	}
	cachePos := rt.Arange(t, "cache_position")
	posIDs := cachePos.Unsqueeze(0)
	var mask *tensor.Tensor
	if cfg.Attention != "flash" {
		if cfg.Family.Gemma() { // Gemma's _update_causal_mask: target length seq
			mask = causalMaskOf(rt, cachePos, b, t, t, embeds.DType())
		} else {
			mask = mistralMask(rt, cachePos, b, t, embeds.DType(), cfg.SlidingWindow)
		}
	}
	cos, sin := rotary(rt, "model.rotary_emb", m.InvFreq, embeds, posIDs)
	kept := []*tensor.Tensor{cos, sin}
	if cfg.Family == FamilyGemma3 {
		lcos, lsin := rotary(rt, "model.rotary_emb_local", m.LocalInvFreq, embeds, posIDs)
		kept = append(kept, lcos, lsin)
	}
	x := embeds.Ref()
	if cfg.Family == FamilyGemma2 {
		x = m.normalize(x)
	}
	var routerLogits []*tensor.Tensor
	aux := cfg.Family.MoE() && cfg.RouterAuxLoss > 0
	for i, l := range m.Layers {
		var y, logits *tensor.Tensor
		if m.Checkpoint != nil && m.Checkpoint(i) && m.Training {
			y, logits = l.checkpointed(x, mask, posIDs, cachePos, kept, aux)
		} else {
			y, logits = l.forward(x, mask, cachePos, kept, aux)
		}
		x.Release()
		x = y
		if logits != nil {
			routerLogits = append(routerLogits, logits)
		}
		if m.AfterLayer != nil {
			m.AfterLayer(l, x)
		}
	}
	h := m.Norm.Forward(x)
	x.Release()
	for _, r := range append([]*tensor.Tensor{embeds, cachePos, posIDs, mask}, kept...) {
		r.Release()
	}
	return h, routerLogits
}

// checkpointed runs the layer through reentrant checkpointing: the tensors among the layer's arguments
// (hidden states, mask, position_ids, cache_position) are saved, the cos/sin tuples kept in ctx.inputs; the
// router logits, when output, are a second output of the checkpoint.
func (l *DecoderLayer) checkpointed(x, mask, posIDs, cachePos *tensor.Tensor, kept []*tensor.Tensor, aux bool) (y, logits *tensor.Tensor) {
	inputs := []*tensor.Tensor{x, mask, posIDs, cachePos}
	if mask == nil {
		inputs = []*tensor.Tensor{x, posIDs, cachePos}
	}
	outs := tensor.CheckpointOutputs(func(in, k []*tensor.Tensor) []*tensor.Tensor {
		mk, cp := mask, in[2]
		if mask != nil {
			mk, cp = in[1], in[3]
		}
		y, logits := l.forward(in[0], mk, cp, k, aux)
		return []*tensor.Tensor{y, logits}
	}, inputs, kept...)
	return outs[0], outs[1]
}

// forward is the layer's forward: Gemma's sliding layers rebuild the mask first (and take the local cos and
// sin); then the attention block and the MLP block, each pre-normed (and post-normed for Gemma), with Phi-3's
// residual dropout. The router logits come back when aux asks for them, else they are freed.
func (l *DecoderLayer) forward(x, mask, cachePos *tensor.Tensor, kept []*tensor.Tensor, aux bool) (out, routerLogits *tensor.Tensor) {
	defer l.scope()()
	cfg := &l.model.Config
	cos, sin := kept[0], kept[1]
	if l.sliding && mask != nil {
		var locals []*tensor.Tensor
		mask, locals = tensor.SlidingWindowMask(mask, cfg.SlidingWindow, cachePos.Dim(0))
		defer releaseAll(append(locals, mask))
	}
	if l.sliding && cfg.Family == FamilyGemma3 {
		cos, sin = kept[2], kept[3]
	}
	h := l.InputNorm.Forward(x)
	a := l.Attn.forward(h, mask, cos, sin)
	h.Release()
	if cfg.Family.Gemma() {
		pa := l.PostNorm.Forward(a)
		a.Release()
		x1 := tensor.Add(x, pa)
		pa.Release()
		hf := l.PreFFNorm.Forward(x1)
		f := l.MLP.Forward(hf)
		hf.Release()
		pf := l.PostFFNorm.Forward(f)
		f.Release()
		out = tensor.Add(x1, pf)
		x1.Release()
		pf.Release()
		return out, nil
	}
	x1 := l.residual(x, a)
	h2 := l.PostNorm.Forward(x1)
	var f *tensor.Tensor
	if l.MoE != nil {
		f, routerLogits = l.MoE.forward(h2)
		if !aux {
			routerLogits.Release()
			routerLogits = nil
		}
	} else {
		f = l.MLP.Forward(h2)
	}
	h2.Release()
	out = l.residual(x1, f)
	x1.Release()
	return out, routerLogits
}

// residual is residual + dropout(block), Phi-3's resid_attn_dropout and resid_mlp_dropout (nothing at p = 0,
// the other families'); it takes the block's reference.
func (l *DecoderLayer) residual(x, block *tensor.Tensor) *tensor.Tensor {
	d := tensor.Dropout(block, l.model.Config.ResidDropout, l.model.Training)
	block.Release()
	out := tensor.Add(x, d)
	d.Release()
	return out
}

// forward is the family's Attention.forward: q, k and v projected (or sliced out of Phi-3's qkv_proj) and
// viewed as (batch, heads, seq, head_dim), Qwen3's q_norm and k_norm before the transpose or Gemma 3's after
// it, the rotary embeddings, attention (eager, or flash with the family's scale, soft-cap and window), the
// heads merged and o_proj.
func (a *DecoderAttention) forward(x, mask, cos, sin *tensor.Tensor) *tensor.Tensor {
	defer a.scope()()
	b, t := x.Dim(0), x.Dim(1)
	var q, k, v *tensor.Tensor
	if a.QKV != nil {
		q, k, v = a.fusedQKV(x)
	} else {
		q, k, v = a.project(x, a.Q, a.QNorm), a.project(x, a.K, a.KNorm), a.project(x, a.V, nil)
	}
	qe, ke := applyRotary(q, k, cos, sin)
	q.Release()
	k.Release()
	p := a.dropout
	if !*a.training {
		p = 0
	}
	var out *tensor.Tensor
	if a.flash {
		o := tensor.FlashAttentionWith(qe, ke, v, tensor.AttentionOptions{Causal: true, Dropout: p, Training: *a.training,
			Scale: a.scaling, Softcap: a.softcap, Window: a.window})
		ot := o.Transpose(1, 2)
		o.Release()
		out = ot.Contiguous()
		ot.Release()
	} else {
		out = eagerAttention(qe, ke, v, mask, eagerSpec{groups: a.heads / a.kvh, scaling: a.scaling, softcap: a.softcap,
			p: p, training: *a.training})
	}
	qe.Release()
	ke.Release()
	v.Release()
	merged := out.Reshape(b, t, -1)
	out.Release()
	o := a.O.Forward(merged)
	merged.Release()
	return o
}

// project is proj(x).view(b, t, -1, head_dim).transpose(1, 2), with a head norm: Qwen3's on the view, before
// the transpose, Gemma 3's after it.
func (a *DecoderAttention) project(x *tensor.Tensor, p Projection, norm Layer) *tensor.Tensor {
	y := p.Forward(x)
	v := y.View(x.Dim(0), x.Dim(1), -1, a.headDim)
	y.Release()
	if norm != nil && a.family == FamilyQwen3MoE {
		n := norm.Forward(v)
		v.Release()
		v = n
	}
	tr := v.Transpose(1, 2)
	v.Release()
	if norm != nil && a.family == FamilyGemma3 {
		n := norm.Forward(tr)
		tr.Release()
		tr = n
	}
	return tr
}

// Forward applies the MLP: down(act(gate(x)) * up(x)), or Phi-3's fused form.
func (m *GatedMLP) Forward(x *tensor.Tensor) *tensor.Tensor {
	defer m.scope()()
	if m.GateUp != nil {
		return m.fusedForward(x)
	}
	g := m.Gate.Forward(x)
	act := m.act(g)
	g.Release()
	u := m.Up.Forward(x)
	p := tensor.Mul(act, u)
	act.Release()
	u.Release()
	out := m.Down.Forward(p)
	p.Release()
	return out
}

// causalMaskOf is causalMask with a target length of its own (Gemma's: the sequence, not seq + 1).
func causalMaskOf(rt *tensor.Runtime, cachePos *tensor.Tensor, b, t, target int, dtype tensor.DType) *tensor.Tensor {
	full := rt.FullLike(dtype, []int{t, target}, minFinite(dtype), "causal_mask")
	tri := tensor.Triu(full, 1)
	full.Release()
	ar := rt.Arange(target, "causal_mask.arange")
	cp := cachePos.Reshape(-1, 1)
	gt := tensor.Greater(ar, cp)
	tensor.Mul_(tri, gt)
	for _, r := range []*tensor.Tensor{ar, cp, gt} {
		r.Release()
	}
	v := tri.View(1, 1, t, target)
	tri.Release()
	mask := v.Expand(b, 1, -1, -1)
	v.Release()
	return mask
}

// mistralMask is MistralModel's _prepare_4d_causal_attention_mask_with_cache_position without an attention
// mask (Mixtral, Qwen's mixtures of experts and Phi-3 use it): torch.full((seq, seq+1), min), the positions
// past each query (arange > cache_position) or'ed, with a sliding window, with those more than the window
// behind it, the full tensor multiplied in place by them and expanded over the batch. The window changes the
// mask's values, not its size.
func mistralMask(rt *tensor.Runtime, cachePos *tensor.Tensor, b, t int, dtype tensor.DType, window int) *tensor.Tensor {
	target := t + 1
	full := rt.FullLike(dtype, []int{t, target}, minFinite(dtype), "causal_mask")
	ar := rt.Arange(target, "causal_mask.arange")
	cp := cachePos.Reshape(-1, 1)
	attend := tensor.Greater(ar, cp)
	ar.Release()
	if window > 0 { // diagonal_attend_mask.bitwise_or_(arange(target) <= cache_position - window)
		ar2 := rt.Arange(target, "causal_mask.arange")
		shifted := tensor.AddScalar(cp, float32(1-window)) // positions are integers: ar2 <= cp - w is cp - w + 1 > ar2
		far := tensor.Greater(shifted, ar2)
		tensor.Or_(attend, far)
		for _, r := range []*tensor.Tensor{ar2, shifted, far} {
			r.Release()
		}
	}
	cp.Release()
	tensor.Mul_(full, attend)
	attend.Release()
	v := full.View(1, 1, t, target)
	full.Release()
	mask := v.Expand(b, 1, -1, -1)
	v.Release()
	return mask
}
