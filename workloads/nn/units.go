package nn

// What data-parallel strategies need to know of a model's structure: its repeated blocks (FSDP's units) and
// which module's forward uses which parameters (ZeRO-3 gathers a module's parameters as it enters it).

// Composite is a model made of models, each with its own modules: a pipeline stage's model chunks. Its
// blocks and scopes are its parts'.
type Composite interface {
	Module
	Parts() []Module
}

// RepeatedBlocks returns the model's repeated blocks, the modules FSDP's transformer auto-wrap policy makes
// units of: a GPT's transformer blocks, a Llama's or another decoder's layers, a BERT's encoder layers, an
// MLP's linear layers. Other modules return nil.
func RepeatedBlocks(m Module) []Module {
	var out []Module
	switch m := m.(type) {
	case Composite:
		for _, p := range m.Parts() {
			out = append(out, RepeatedBlocks(p)...)
		}
	case *GPT:
		for _, b := range m.Blocks {
			out = append(out, b)
		}
	case *Llama:
		for _, l := range m.Layers {
			out = append(out, l)
		}
	case *Decoder:
		for _, l := range m.Layers {
			out = append(out, l)
		}
	case *Bert:
		for _, l := range m.Layers {
			out = append(out, l)
		}
	case *MLP:
		for _, l := range m.Net.Layers {
			if len(l.Parameters()) > 0 {
				out = append(out, l)
			}
		}
	}
	return out
}

// ParameterScopes maps each module scope whose forward uses parameters to those parameters: a parameter
// belongs to the module its name says (blocks.3.attn.c_attn.weight to blocks.3.attn.c_attn), and a tied LM
// head uses the embedding's weight under its own scope (BERT's MLM decoder, with the head's bias).
func ParameterScopes(m Module) map[string][]*Parameter {
	out := map[string][]*Parameter{}
	if c, ok := m.(Composite); ok {
		for _, p := range c.Parts() {
			for scope, ps := range ParameterScopes(p) {
				out[scope] = append(out[scope], ps...)
			}
		}
		return out
	}
	for _, p := range m.Parameters() {
		o := owner(p.Name)
		out[o] = append(out[o], p)
	}
	switch m := m.(type) {
	case *GPT:
		out[m.LMHead.Name()] = []*Parameter{m.LMHead.Weight}
	case *Llama:
		if m.Config.Tied {
			out[m.LMHead.Name()] = []*Parameter{m.LMHead.Weight}
		}
	case *Decoder:
		if m.Config.Tied {
			out[m.LMHead.Name()] = []*Parameter{m.LMHead.Weight}
		}
	case *Bert:
		if m.Transform != nil { // the MLM decoder: the word embeddings' weight and the head's bias
			out["cls.predictions.decoder"] = []*Parameter{m.Word.Weight, m.DecoderBias}
		}
	}
	return out
}
