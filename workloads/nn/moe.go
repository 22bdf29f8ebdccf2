package nn

import (
	"fmt"

	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Mixtures of experts as transformers 4.51 writes them (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock,
// Qwen3MoeSparseMoeBlock) and what each step saves for backward:
//   - the router, gate, a linear layer to one score per expert: its input is saved (the layer's normed input,
//     which the experts' gathers read too);
//   - softmax in float32 (saves its (tokens, experts) result), top-k (saves the (tokens, k) int64 indices),
//     and, Mixtral always and Qwen with norm_topk_prob, the top-k weights divided in place by their sum
//     (saves the sum and a copy of the weights as they were);
//   - a one-hot (tokens, k, experts) int64 mask, held while the block runs;
//   - for each expert in turn, torch.where of its row of the mask: nonzero's (2, n) int64 storage of the slot
//     and the token of each of its n tokens, which the gather, the weight pick and index_add_ all save (one
//     storage); the n tokens gathered into a new (n, d) tensor (its expert's first linear layers save it);
//     the expert's MLP on them (what a gated MLP saves, n rows); each token's routing weight picked (n, 1) and
//     the product with the expert's output (saving both); index_add_ of the product into the block's output,
//     which saves the product too (its formula reads the source);
//   - Qwen2-MoE's shared expert on every token and its sigmoid gate (saving the (tokens, 1) result).
// The tokens an expert gets decide the sizes, not their sum: every token goes to k experts, so the gathers
// together are always tokens x k rows, and what a skewed routing changes is the size of the largest expert's
// tensors (the temporaries of its MLP, and the caching allocator's blocks). In backward, each expert's gather
// allocates a gradient of the block's full input size (index_put_ into zeros), one expert at a time.
//
// Grouped-GEMM implementations (transformers 5's fused experts with torch._grouped_mm, Megablocks, ScatterMoE)
// sort the routed tokens once and run every expert in one kernel: they save one (tokens x k, d) permuted input
// and one activation of that many rows instead of n-row pieces, and allocate no per-expert gradient of the
// full input; the bytes saved are the same, the allocations fewer and larger. They are not modelled: the
// loop over experts is what transformers 4.x and peft's LoRA on each expert's linear layers run.

// SparseMoE is a mixture-of-experts block: the router (gate), the experts and Qwen2-MoE's shared expert with
// its gate (shared_expert, shared_expert_gate).
type SparseMoE struct {
	base
	Gate       Projection
	Experts    []*GatedMLP
	Shared     *GatedMLP
	SharedGate Projection
	layer      int
	topK       int
	normTopK   bool
	model      *Decoder
}

func (b *decoderBuilder) sparseMoE(name string, layer int) *SparseMoE {
	cfg := b.cfg
	m := &SparseMoE{base: base{b.rt, name}, layer: layer, topK: cfg.ExpertsPerToken,
		normTopK: cfg.Family == FamilyMixtral || cfg.NormTopK}
	m.Gate = b.linear(join(name, "gate"), "", cfg.DModel, cfg.Experts, false)
	mixtral := cfg.Family == FamilyMixtral
	for e := range cfg.Experts {
		m.Experts = append(m.Experts, b.gatedMLP(join(name, fmt.Sprintf("experts.%d", e)), cfg.ExpertFFN, mixtral))
	}
	if cfg.Family == FamilyQwen2MoE {
		m.Shared = b.gatedMLP(join(name, "shared_expert"), cfg.SharedExpertFFN, false)
		m.SharedGate = b.linear(join(name, "shared_expert_gate"), "", cfg.DModel, 1, false)
	}
	return m
}

// Parameters returns the block's parameters in registration order: gate, experts, shared expert and its gate.
func (m *SparseMoE) Parameters() []*Parameter {
	var ps []*Parameter
	for _, p := range m.projections() {
		ps = append(ps, p.Parameters()...)
	}
	return ps
}

func (m *SparseMoE) projections() []Projection {
	ps := []Projection{m.Gate}
	for _, e := range m.Experts {
		ps = append(ps, e.projections()...)
	}
	if m.Shared != nil {
		ps = append(append(ps, m.Shared.projections()...), m.SharedGate)
	}
	return ps
}

// forward is the block's forward on x (batch, seq, d): it returns the output and the router logits (tokens,
// experts), which the caller releases or keeps for the auxiliary loss.
func (m *SparseMoE) forward(x *tensor.Tensor) (out, routerLogits *tensor.Tensor) {
	defer m.scope()()
	rt := m.rt
	b, t, d := x.Dim(0), x.Dim(1), x.Dim(2)
	n, experts := b*t, len(m.Experts)
	h := x.View(-1, d)
	routerLogits = m.Gate.Forward(h)
	probs := tensor.SoftmaxDType(routerLogits, tensor.F32) // F.softmax(router_logits, dim=1, dtype=torch.float)
	w, selected := tensor.TopK(probs, m.topK)
	probs.Release()
	if m.normTopK { // routing_weights /= routing_weights.sum(dim=-1, keepdim=True)
		s := tensor.SumLast(w)
		w2 := tensor.Div_(w, s)
		s.Release()
		w.Release()
		w = w2
	}
	weights := tensor.ToDType(w, h.DType()) // routing_weights.to(hidden_states.dtype)
	w.Release()
	routes := m.route(selected, n, experts)
	final := rt.Empty(h.DType(), []int{n, d}, "final_hidden_states") // torch.zeros: the cpu device's memory starts zeroed
	oneHot := rt.Temporary(tensor.I64, []int{n, m.topK, experts}, "one_hot")
	var prev []*tensor.Tensor // the loop's locals, held until the next iteration rebinds them
	for e, slots := range routes.byExpert(experts) {
		nz := rt.Values(tensor.I64, []int{2, len(slots)}, slots.values(), "nonzero") // torch.where: nonzero(as_tuple=True)
		idx, topX := row(nz, 0), row(nz, 1)
		nz.Release()
		cur := tensor.IndexRows(h, topX) // hidden_states[None, top_x].reshape(-1, hidden_dim)
		eo := m.Experts[e].Forward(cur)
		rw := tensor.IndexPairs(weights, topX, idx) // routing_weights[top_x, idx, None]
		prod := tensor.Mul(eo, rw)
		eo.Release()
		rw.Release()
		pc := tensor.ToDType(prod, h.DType())
		f2 := tensor.IndexAdd_(final, topX, pc)
		pc.Release()
		final.Release()
		final = f2
		releaseAll(prev)
		prev = []*tensor.Tensor{idx, topX, cur, prod}
	}
	releaseAll(prev)
	if m.Shared != nil {
		so := m.Shared.Forward(h)
		g := m.SharedGate.Forward(h)
		sg := tensor.Sigmoid(g)
		g.Release()
		gated := tensor.Mul(sg, so)
		sg.Release()
		so.Release()
		sum := tensor.Add(final, gated)
		gated.Release()
		final.Release()
		final = sum
	}
	out = final.Reshape(b, t, d)
	final.Release()
	for _, r := range []*tensor.Tensor{oneHot, weights, selected, h} {
		r.Release()
	}
	if m.model.OnRoute != nil {
		m.model.OnRoute(m.layer, routes.counts(experts))
	}
	return out, routerLogits
}

// route returns the experts each of the n tokens goes to: the router's top-k where the device computes them
// and no Routing is set, else the model's Routing (uniform when unset).
func (m *SparseMoE) route(selected *tensor.Tensor, n, experts int) routing {
	rt := m.rt
	if r := m.model.Routing; r != nil || !rt.Device().Computes() {
		if r == nil {
			r = UniformRouting{}
		}
		return routing{k: m.topK, experts: r.Route(rt.Rand(), m.layer, n, experts, m.topK)}
	}
	v := selected.Values()
	ex := make([]int32, len(v))
	for i, x := range v {
		ex[i] = int32(x)
	}
	return routing{k: m.topK, experts: ex}
}

// routing is the experts of every token, k a token, token-major.
type routing struct {
	k       int
	experts []int32
}

// slotTokens is one expert's share of a routing: for each of its tokens, the top-k slot that chose it and
// the token, in the order torch.where gives them (slot-major, tokens increasing).
type slotTokens []struct{ slot, token int32 }

// values returns nonzero's (2, n) values: the slots, then the tokens.
func (s slotTokens) values() []float32 {
	v := make([]float32, 2*len(s))
	for i, st := range s {
		v[i], v[len(s)+i] = float32(st.slot), float32(st.token)
	}
	return v
}

// byExpert splits the routing by expert.
func (r routing) byExpert(experts int) []slotTokens {
	out := make([]slotTokens, experts)
	for e, n := range r.counts(experts) {
		out[e] = make(slotTokens, 0, n)
	}
	for slot := range r.k {
		for tok := slot; tok < len(r.experts); tok += r.k {
			e := r.experts[tok]
			out[e] = append(out[e], struct{ slot, token int32 }{int32(slot), int32(tok / r.k)})
		}
	}
	return out
}

// counts returns the tokens each expert got.
func (r routing) counts(experts int) []int {
	c := make([]int, experts)
	for _, e := range r.experts {
		c[e]++
	}
	return c
}

// loadBalancingLoss is load_balancing_loss_func without an attention mask: the layers' router logits
// concatenated, softmax (float32 under autocast: fp32_set_opt_dtype; it saves its result), top-k (saves the
// indices), the one-hot mask and its float copy ((layers x tokens, k, experts), int64 and float32: the
// largest tensors of the loss), the tokens per expert and the mean router probability per expert, their
// product (saving the tokens per expert) summed, times the number of experts.
func loadBalancingLoss(rt *tensor.Runtime, logits []*tensor.Tensor, experts, k int) *tensor.Tensor {
	cat := tensor.Cat(logits, 0)
	rw := tensor.Softmax(cat)
	cat.Release()
	vals, selected := tensor.TopK(rw, k)
	vals.Release()
	rows := rw.Dim(0)
	oneHot := rt.Temporary(tensor.I64, []int{rows, k, experts}, "one_hot")
	asFloat := rt.Temporary(tensor.F32, []int{rows, k, experts}, "expert_mask.float")
	var perExpert []float32
	if v := selected.Values(); v != nil {
		perExpert = make([]float32, k*experts)
		for i, e := range v {
			perExpert[(i%k)*experts+int(e)] += 1 / float32(rows)
		}
	}
	asF := rt.Values(tensor.F32, []int{k, experts}, perExpert, "tokens_per_expert") // torch.mean(expert_mask.float(), dim=0)
	asFloat.Release()
	prob := tensor.MeanRows(rw)
	u := prob.Unsqueeze(0)
	prob.Release()
	prod := tensor.Mul(asF, u)
	u.Release()
	s := tensor.Sum(prod)
	prod.Release()
	loss := tensor.Scale(s, float32(experts))
	s.Release()
	for _, r := range []*tensor.Tensor{asF, oneHot, selected, rw} {
		r.Release()
	}
	return loss
}

// row returns row i of the 2-D x as a 1-D view.
func row(x *tensor.Tensor, i int) *tensor.Tensor {
	n := x.Narrow(0, i, 1)
	defer n.Release()
	return n.View(-1)
}

func releaseAll(ts []*tensor.Tensor) {
	for _, t := range ts {
		t.Release()
	}
}
