package train

import (
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The Hugging Face models a run builds: the Llama family, the decoders written from it, BERT; each with the
// strategy's dtype and sharding hook, checkpointing, the input made to require grad for adapters under
// checkpointing, and the hooks the leak bugs use.

func (r *run) buildLlama() *nn.Llama {
	cfg := r.cfg
	lc := cfg.llamaConfig()
	lc.DType, lc.Built = r.paramDType(lc.DType), r.builtBlock()
	m, err := nn.NewLlama(r.rt, lc)
	if err != nil {
		panic(err) // Validate checked the shape
	}
	plan := planCheckpoint(cfg.Checkpoint)
	m.Checkpoint = plan.blocks
	// Adapters under reentrant checkpointing need an input that requires grad (peft's
	// _prepare_model_for_gradient_checkpointing, HF's enable_input_require_grads).
	m.InputRequiresGrad = cfg.LoRA > 0 && plan.blocks != nil
	m.AfterLayer = func(l *nn.LlamaDecoderLayer, out *tensor.Tensor) {
		r.forwardHook(l.Name(), out)
		r.keepOnModule(l.Name(), out)
	}
	return m
}

func (r *run) buildDecoder() *nn.Decoder {
	cfg := r.cfg
	dc := cfg.decoderConfig()
	dc.DType, dc.Built = r.paramDType(dc.DType), r.builtBlock()
	m, err := nn.NewDecoder(r.rt, dc)
	if err != nil {
		panic(err) // Validate checked the shape
	}
	plan := planCheckpoint(cfg.Checkpoint)
	m.Checkpoint = plan.blocks
	m.InputRequiresGrad = cfg.LoRA > 0 && plan.blocks != nil
	m.AfterLayer = func(l *nn.DecoderLayer, out *tensor.Tensor) {
		r.forwardHook(l.Name(), out)
		r.keepOnModule(l.Name(), out)
	}
	if !r.rt.Device().Computes() { // the cpu device routes by the routers' scores
		m.Routing = cfg.Routing.nn()
	}
	m.OnRoute = r.noteRoute
	return m
}

func (r *run) buildBert() *nn.Bert {
	cfg := r.cfg
	bc := cfg.bertConfig()
	bc.DType, bc.Built = r.paramDType(bc.DType), r.builtBlock()
	m, err := nn.NewBert(r.rt, bc)
	if err != nil {
		panic(err) // Validate checked the shape
	}
	plan := planCheckpoint(cfg.Checkpoint)
	m.Checkpoint = plan.blocks
	m.InputRequiresGrad = cfg.LoRA > 0 && plan.blocks != nil
	m.AfterLayer = func(l *nn.BertLayer, out *tensor.Tensor) {
		r.forwardHook(l.Name(), out)
		r.keepOnModule(l.Name(), out)
	}
	return m
}

// attentionMask puts a batch's attention_mask on the device for a model that reads one (BERT), as a padding
// collator does with the inputs: (batch, seq) int64, ones for tokens and zeros for padding.
func (r *run) attentionMask(shape batchShape, role string) {
	m, ok := r.model.(*nn.Bert)
	if !ok {
		return
	}
	var values []float32
	if r.rt.Device().Computes() {
		values = make([]float32, shape.n*shape.t)
		for i := range shape.n {
			n := shape.t
			if shape.lengths != nil {
				n = shape.lengths[i]
			}
			for j := range n {
				values[i*shape.t+j] = 1
			}
		}
	}
	var mask *tensor.Tensor
	if values != nil {
		mask = r.rt.FromValues(tensor.I64, []int{shape.n, shape.t}, values, role+".attention_mask", snapshot.CategoryInput)
	} else {
		mask = r.rt.Zeros(tensor.I64, []int{shape.n, shape.t}, role+".attention_mask", snapshot.CategoryInput)
	}
	var lengths []int
	for _, n := range shape.lengths {
		if n < shape.t {
			lengths = shape.lengths
			break
		}
	}
	m.UseAttentionMask(mask, lengths)
	mask.Release()
}
