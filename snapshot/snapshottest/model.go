package snapshottest

// The model the generator traces: nanoGPT's structure (token and position embedding, dropout, N pre-LN blocks
// of causal self-attention and MLP, final layer norm, LM head tied to the token embedding, cross-entropy), with
// naive attention, so the B*H*T*T score tensors are there. Each op lists the tensors it makes, which of them
// autograd saves, and which earlier temporaries it lets go of.

// shapeKind names a tensor shape in terms of the Config.
type shapeKind int

const (
	shapeBTD    shapeKind = iota // batch, seq, d_model
	shapeBT3D                    // qkv
	shapeBT4D                    // mlp hidden
	shapeBT                      // layer-norm statistics
	shapeBHTT                    // attention scores
	shapeBHTd                    // attention output per head
	shapeTD                      // position embedding
	shapeBTV                     // logits
	shapeScalar                  // the loss
)

func (c *Config) shape(k shapeKind) []int {
	b, t, d, h, v := c.Batch, c.Seq, c.DModel, c.Heads, c.Vocab
	switch k {
	case shapeBTD:
		return []int{b, t, d}
	case shapeBT3D:
		return []int{b, t, 3 * d}
	case shapeBT4D:
		return []int{b, t, 4 * d}
	case shapeBT:
		return []int{b, t}
	case shapeBHTT:
		return []int{b, h, t, t}
	case shapeBHTd:
		return []int{b, h, t, d / h}
	case shapeTD:
		return []int{t, d}
	case shapeBTV:
		return []int{b, t, v}
	}
	return nil
}

// fate says what happens to an op's output.
type fate int

const (
	temporary  fate = iota // freed by a later op of the forward pass
	saved                  // saved for backward by the op that made it: allocated as an activation
	savedLater             // allocated as a temporary, then saved by the next op: a category change
)

type output struct {
	role  string
	shape shapeKind
	dtype string // "f32" (4 bytes), "u8" (dropout masks, 1 byte)
	fate  fate
}

type op struct {
	module string // module kind, for the stack
	kind   string // op kind, for the stack
	scope  string // scope suffix under the block (or model) scope
	outs   []output
	frees  []string // roles of temporaries this op lets go of
	params []string // parameters (names under scope's module) whose gradients backward makes
}

var embeddingOps = []op{
	{module: "emb", kind: "embedding", scope: "wte", outs: []output{{"tok_emb.out", shapeBTD, "f32", temporary}}, params: []string{"wte.weight"}},
	{module: "emb", kind: "embedding", scope: "wpe", outs: []output{{"pos_emb.out", shapeTD, "f32", temporary}}, params: []string{"wpe.weight"}},
	{module: "emb", kind: "add", scope: "", outs: []output{{"emb.sum", shapeBTD, "f32", temporary}}, frees: []string{"tok_emb.out", "pos_emb.out"}},
	{module: "emb", kind: "dropout", scope: "drop", outs: []output{{"drop.out", shapeBTD, "f32", savedLater}, {"drop.mask", shapeBTD, "u8", saved}}, frees: []string{"emb.sum"}},
}

var blockOps = []op{
	{module: "ln", kind: "layernorm", scope: "ln_1", outs: []output{{"ln_1.out", shapeBTD, "f32", savedLater}, {"ln_1.mean", shapeBT, "f32", saved}, {"ln_1.rstd", shapeBT, "f32", saved}}, params: []string{"ln_1.weight", "ln_1.bias"}},
	{module: "attn", kind: "linear", scope: "attn.qkv", outs: []output{{"qkv.out", shapeBT3D, "f32", saved}}, params: []string{"attn.qkv.weight", "attn.qkv.bias"}},
	{module: "attn", kind: "matmul", scope: "attn", outs: []output{{"att.scores", shapeBHTT, "f32", temporary}}},
	{module: "attn", kind: "mul", scope: "attn", outs: []output{{"att.scaled", shapeBHTT, "f32", temporary}}, frees: []string{"att.scores"}},
	{module: "attn", kind: "masked_fill", scope: "attn", outs: []output{{"att.masked", shapeBHTT, "f32", temporary}}, frees: []string{"att.scaled"}},
	{module: "attn", kind: "softmax", scope: "attn", outs: []output{{"att.probs", shapeBHTT, "f32", saved}}, frees: []string{"att.masked"}},
	{module: "attn", kind: "dropout", scope: "attn.attn_dropout", outs: []output{{"att.drop", shapeBHTT, "f32", savedLater}, {"att.drop.mask", shapeBHTT, "u8", saved}}},
	{module: "attn", kind: "matmul", scope: "attn", outs: []output{{"att.y", shapeBHTd, "f32", temporary}}},
	{module: "attn", kind: "contiguous", scope: "attn", outs: []output{{"att.merge", shapeBTD, "f32", savedLater}}, frees: []string{"att.y"}},
	{module: "attn", kind: "linear", scope: "attn.proj", outs: []output{{"proj.out", shapeBTD, "f32", temporary}}, params: []string{"attn.proj.weight", "attn.proj.bias"}},
	{module: "attn", kind: "dropout", scope: "attn.resid_dropout", outs: []output{{"resid_1.drop", shapeBTD, "f32", temporary}, {"resid_1.mask", shapeBTD, "u8", saved}}, frees: []string{"proj.out"}},
	{module: "attn", kind: "add", scope: "", outs: []output{{"resid_1.out", shapeBTD, "f32", savedLater}}, frees: []string{"resid_1.drop"}},
	{module: "ln", kind: "layernorm", scope: "ln_2", outs: []output{{"ln_2.out", shapeBTD, "f32", savedLater}, {"ln_2.mean", shapeBT, "f32", saved}, {"ln_2.rstd", shapeBT, "f32", saved}}, params: []string{"ln_2.weight", "ln_2.bias"}},
	{module: "mlp", kind: "linear", scope: "mlp.fc", outs: []output{{"fc.out", shapeBT4D, "f32", savedLater}}, params: []string{"mlp.fc.weight", "mlp.fc.bias"}},
	{module: "mlp", kind: "gelu", scope: "mlp.gelu", outs: []output{{"gelu.out", shapeBT4D, "f32", savedLater}}},
	{module: "mlp", kind: "linear", scope: "mlp.proj", outs: []output{{"mlp_proj.out", shapeBTD, "f32", temporary}}, params: []string{"mlp.proj.weight", "mlp.proj.bias"}},
	{module: "mlp", kind: "dropout", scope: "mlp.dropout", outs: []output{{"resid_2.drop", shapeBTD, "f32", temporary}, {"resid_2.mask", shapeBTD, "u8", saved}}, frees: []string{"mlp_proj.out"}},
	{module: "mlp", kind: "add", scope: "", outs: []output{{"resid_2.out", shapeBTD, "f32", savedLater}}, frees: []string{"resid_2.drop"}},
}

var headOps = []op{
	{module: "ln", kind: "layernorm", scope: "ln_f", outs: []output{{"ln_f.out", shapeBTD, "f32", savedLater}, {"ln_f.mean", shapeBT, "f32", saved}, {"ln_f.rstd", shapeBT, "f32", saved}}, params: []string{"ln_f.weight", "ln_f.bias"}},
	{module: "head", kind: "linear", scope: "lm_head", outs: []output{{"logits", shapeBTV, "f32", temporary}}, params: []string{"wte.weight"}},
	{module: "loss", kind: "log_softmax", scope: "loss", outs: []output{{"log_probs", shapeBTV, "f32", saved}}, frees: []string{"logits"}},
	{module: "loss", kind: "nll", scope: "loss", outs: []output{{"loss", shapeScalar, "f32", saved}}},
}

// param is one model parameter.
type param struct {
	name  string // full name, e.g. "blocks.3.attn.qkv.weight"
	scope string // its module, e.g. "blocks.3.attn.qkv"
	role  string // "weight" or "bias"
	shape []int
}

// params lists the model's parameters in the order the model builds them.
func (c *Config) params() []param {
	d, v := c.DModel, c.Vocab
	var ps []param
	add := func(scope, role string, shape ...int) {
		ps = append(ps, param{name: scope + "." + role, scope: scope, role: role, shape: shape})
	}
	add("wte", "weight", v, d)
	add("wpe", "weight", c.Seq, d)
	for l := range c.Layers {
		b := blockScope(l)
		add(b+".ln_1", "weight", d)
		add(b+".ln_1", "bias", d)
		add(b+".attn.qkv", "weight", 3*d, d)
		add(b+".attn.qkv", "bias", 3*d)
		add(b+".attn.proj", "weight", d, d)
		add(b+".attn.proj", "bias", d)
		add(b+".ln_2", "weight", d)
		add(b+".ln_2", "bias", d)
		add(b+".mlp.fc", "weight", 4*d, d)
		add(b+".mlp.fc", "bias", 4*d)
		add(b+".mlp.proj", "weight", d, 4*d)
		add(b+".mlp.proj", "bias", d)
	}
	add("ln_f", "weight", d)
	add("ln_f", "bias", d)
	return ps
}
