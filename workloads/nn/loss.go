package nn

import (
	"fmt"

	"github.com/oomdbg/oomdbg/versions"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The losses of a causal LM: HF's full loss in the generation of the run's transformers release, and the two
// that trainers use to keep the logits from dominating long-context memory.

// LossKind is how the loss is computed from the final hidden states.
type LossKind uint8

// The losses.
const (
	// LossFull is lm_head over every position, then the model's causal-LM loss (versions.LossGeneration).
	LossFull LossKind = iota
	// LossChunked is torchtune's CEWithChunkedOutputLoss (and LitGPT's chunked lm_head): lm_head over chunks
	// of tokens, each chunk's logits upcast and put through cross-entropy (sum) on its own, the sum divided
	// by the tokens counted.
	LossChunked
	// LossFusedLinearCE is Liger's LigerFusedLinearCrossEntropyLoss: lm_head and cross-entropy fused in chunks
	// of rows, the logits never whole, the input's gradient computed in the forward and saved.
	LossFusedLinearCE
	// LossLinearCE is torchtune's LinearCrossEntropyLoss: the final hidden states split into chunks along the
	// sequence, and for each the positions whose label counts picked out (a copy), lm_head over them, and
	// cross-entropy (sum) of the float32 logits, each chunk's logits freed once its log-probabilities are
	// saved; the sum divided by the tokens counted.
	LossLinearCE
	// LossChunkedHeld is LitGPT's finetune loop under Lightning Fabric (finetune/lora.py and lit_gpt/utils.py
	// chunked_cross_entropy at 8641822): lm_head over chunks of tokens (lm_head_chunk_size), every chunk's
	// logits converted to float32 as the forward returns (the precision plugin's convert_output, to the
	// default dtype) and the 16-bit chunks freed, then cross-entropy of each float32 chunk against its
	// shifted labels, averaged over the positions. The float32 chunks are the loop's logits: its name holds
	// them through backward until the next forward returns and rebinds it.
	LossChunkedHeld
)

// Loss is the loss a causal LM computes: the kind, and for LossChunked the tokens per chunk, for
// LossLinearCE the chunks.
type Loss struct {
	Kind  LossKind
	Chunk int // tokens per chunk (LossChunked); chunks of the sequence (LossLinearCE: num_output_chunks)
}

func (l Loss) validate() error {
	if l.Kind == LossChunked && l.Chunk <= 0 {
		return fmt.Errorf("a chunked loss needs chunks of at least one token (got %d)", l.Chunk)
	}
	if l.Kind == LossLinearCE && l.Chunk <= 0 {
		return fmt.Errorf("a linear cross-entropy loss needs at least one chunk (got %d)", l.Chunk)
	}
	if l.Kind == LossChunkedHeld && l.Chunk <= 0 {
		return fmt.Errorf("a chunked loss needs chunks of at least one token (got %d)", l.Chunk)
	}
	if l.Kind > LossChunkedHeld {
		return fmt.Errorf("unknown loss %d", l.Kind)
	}
	return nil
}

// causalLMHead runs lm_head and the loss on the final hidden states h (batch, seq, d) as loss says, and
// returns the logits the model's output holds (nil where the loss never makes them whole) and the loss. It
// takes h's reference.
func causalLMHead(rt *tensor.Runtime, head Layer, weight *Parameter, h, labels *tensor.Tensor, loss Loss) (logits, l *tensor.Tensor) {
	switch loss.Kind {
	case LossChunked:
		l = chunkedLoss(rt, head, h, labels, loss.Chunk)
		h.Release()
		return nil, l
	case LossFusedLinearCE:
		l = fusedLinearCELoss(rt, weight, h, labels)
		h.Release()
		return nil, l
	case LossLinearCE:
		l = linearCELoss(rt, head, h, labels, loss.Chunk)
		h.Release()
		return nil, l
	}
	leave := rt.Scope("lm_head")
	sliced := h.Narrow(1, 0, h.Dim(1)) // hidden_states[:, slice(-0, None), :]
	leave()
	logits = head.Forward(sliced)
	sliced.Release()
	logits, l = causalLMLoss(logits, labels)
	h.Release() // outputs[0], alive until the forward returns
	return logits, l
}

// causalLMLoss is the causal-LM loss of the runtime's transformers release (versions.Set.CausalLMLoss) on
// the logits lm_head returned; it returns the logits the model's output holds (float32 for the in-model loss,
// which rebinds them, else the ones it was given) and the loss.
func causalLMLoss(logits, labels *tensor.Tensor) (*tensor.Tensor, *tensor.Tensor) {
	switch logits.Runtime().Versions().CausalLMLoss() {
	case versions.LossInModel:
		// LlamaForCausalLM.forward before 4.46: logits = logits.float(); shift_logits = logits[..., :-1,
		// :].contiguous(); shift_labels = labels[..., 1:].contiguous(); CrossEntropyLoss()(...).
		lf := tensor.ToDType(logits, tensor.F32)
		logits.Release()
		return lf, shiftedLogitsLoss(lf, labels)
	case versions.LossShiftLogits:
		// ForCausalLMLoss of 4.46 to 4.48: the same inside the loss, on its own float32 copy.
		lf := tensor.ToDType(logits, tensor.F32)
		loss := shiftedLogitsLoss(lf, labels)
		lf.Release()
		return logits, loss
	}
	return logits, shiftedLabelsLoss(logits, labels)
}

// shiftedLogitsLoss is cross_entropy(logits[..., :-1, :].contiguous().view(-1, V), labels[..., 1:]
// .contiguous().view(-1)) of float32 logits.
func shiftedLogitsLoss(lf, labels *tensor.Tensor) *tensor.Tensor {
	t := lf.Dim(1)
	sv := lf.Narrow(1, 0, t-1)
	shifted := sv.Contiguous()
	sv.Release()
	lv := labels.Narrow(-1, 1, t-1)
	shiftLabels := lv.Contiguous()
	lv.Release()
	flat := shifted.View(-1, lf.Dim(-1))
	shifted.Release()
	tflat := shiftLabels.View(-1)
	shiftLabels.Release()
	loss := tensor.CrossEntropy(flat, tflat)
	flat.Release()
	tflat.Release()
	return loss
}

// shiftedLabelsLoss is ForCausalLMLoss from 4.49 with num_items_in_batch unset (mean reduction): the logits
// upcast, the labels padded with -100 and shifted, and cross_entropy with ignore_index -100.
func shiftedLabelsLoss(logits, labels *tensor.Tensor) *tensor.Tensor {
	lf := tensor.ToDType(logits, tensor.F32) // logits.float(): a copy unless already float32
	shiftLabels := shiftLabels(labels)
	flat := lf.View(-1, lf.Dim(-1))
	lf.Release()
	tflat := shiftLabels.View(-1)
	shiftLabels.Release()
	loss := tensor.CrossEntropy(flat, tflat)
	flat.Release()
	tflat.Release()
	return loss
}

// shiftLabels is nn.functional.pad(labels, (0, 1), value=-100)[..., 1:].contiguous().
func shiftLabels(labels *tensor.Tensor) *tensor.Tensor {
	padded := tensor.PadLast(labels, 1, -100)
	shifted := padded.Narrow(-1, 1, labels.Dim(-1))
	padded.Release()
	out := shifted.Contiguous()
	shifted.Release()
	return out
}

// chunkedLoss is torchtune's chunked output and CEWithChunkedOutputLoss: the labels shifted (the recipe's
// hstack of labels[..., 1:] and an ignore column), lm_head over each chunk of chunk tokens of h (the
// chunks' logits a list, all alive until the loss returns), and for each chunk cross_entropy(logits.float(),
// labels, reduction="sum"), the float32 copy freed once its log-probabilities are saved; the sum divided by
// the tokens counted.
func chunkedLoss(rt *tensor.Runtime, head Layer, h, labels *tensor.Tensor, chunk int) *tensor.Tensor {
	shifted := shiftLabels(labels)
	defer shifted.Release()
	chunks := headChunks(rt, head, h, chunk)
	var total *tensor.Tensor
	for i, lc := range chunks {
		n := lc.Dim(1)
		flat := lc.Reshape(-1, lc.Dim(-1))
		lf := tensor.ToDType(flat, tensor.F32)
		flat.Release()
		lv := shifted.Narrow(1, i*chunk, n)
		tflat := lv.Reshape(-1)
		lv.Release()
		ce := tensor.CrossEntropySum(lf, tflat)
		lf.Release()
		tflat.Release()
		total = addLoss(total, ce)
	}
	releaseAll(chunks)
	count := float32(shifted.Numel() - shifted.Dim(0)) // the ignore column is not counted
	loss := tensor.Scale(total, 1/count)
	total.Release()
	return loss
}

// linearCELoss is torchtune's LinearCrossEntropyLoss on the final hidden states, the output layer skipped:
// the labels shifted as the recipe shifts them (an ignore column last), mask = labels != -100 and its sum,
// then for each of tensor_split(chunks) along the sequence: the chunk's mask, its labels and hidden states
// where the mask is true (copies; the hidden states' index saves the mask), lm_head over those rows,
// cross_entropy(logits.float(), labels, reduction="sum") (the 16-bit logits and their float32 copy freed
// once the log-probabilities are saved), summed; the sum divided by the count (DivBackward0 saves it).
func linearCELoss(rt *tensor.Runtime, head Layer, h, labels *tensor.Tensor, chunks int) *tensor.Tensor {
	shifted := shiftLabels(labels)
	defer shifted.Release()
	b, t := h.Dim(0), h.Dim(1)
	// The meta device knows which labels count from their layout: every position but the ignore column.
	validIn := func(start, n int) int {
		if n > 0 && start+n == t {
			return b * (n - 1)
		}
		return b * n
	}
	mask := tensor.NotEqualScalar(shifted, -100)
	count := tensor.CountTrue(mask)
	mask.Release()
	defer count.Release()
	leave := rt.Scope("lm_head")
	defer leave()
	var total *tensor.Tensor
	start := 0
	for i := range chunks { // tensor_split: the first t%chunks chunks one longer
		n := t / chunks
		if i < t%chunks {
			n++
		}
		hc := h.Narrow(1, start, n)
		tc := shifted.Narrow(1, start, n)
		valid := validIn(start, n)
		start += n
		mc := tensor.NotEqualScalar(tc, -100)
		nz := tensor.CountTrue(mc) // mask_chunk.sum() == 0
		nz.Release()
		if valid == 0 && n > 0 { // a chunk of ignore columns: mask_chunk[0] = True
			tensor.MarkFirst_(mc)
			valid = n
		}
		targets := tensor.MaskRows(tc, mc, valid)
		tc.Release()
		rows := tensor.MaskRows(hc, mc, valid)
		hc.Release()
		mc.Release()
		logits := head.Forward(rows)
		rows.Release()
		lf := tensor.ToDType(logits, tensor.F32)
		logits.Release()
		ce := tensor.CrossEntropySum(lf, targets)
		lf.Release()
		targets.Release()
		if total == nil { // 0.0 + the first chunk's: a new scalar
			total = tensor.AddScalar(ce, 0)
		} else { // total_loss += ...: in place
			sum := tensor.Add_(total, ce)
			total.Release()
			total = sum
		}
		ce.Release()
	}
	loss := tensor.Div_(total, count) // total_loss / total_elements: the in-place form saves the same
	total.Release()
	return loss
}

// fusedLinearCELoss is LigerFusedLinearCrossEntropyLoss on the flattened hidden states and the shifted
// labels (Liger's causal-LM forward: shift_hidden_states = hidden_states[..., :-1, :].contiguous() and
// shift_labels = labels[..., 1:].contiguous() in the generations that shift the logits, the padded labels
// from 4.49).
func fusedLinearCELoss(rt *tensor.Runtime, weight *Parameter, h, labels *tensor.Tensor) *tensor.Tensor {
	defer rt.Scope("lm_head")()
	shifted := shiftLabels(labels)
	flat := h.View(-1, h.Dim(-1))
	tflat := shifted.View(-1)
	shifted.Release()
	loss := tensor.FusedLinearCrossEntropy(flat, weight.Tensor, tflat)
	flat.Release()
	tflat.Release()
	return loss
}

// heldChunkedLoss is LitGPT's chunked head and loss (LossChunkedHeld) on the final hidden states h (it takes
// h's reference): [lm_head(x_i) for x_i in x.split(chunk, dim=1)], the list converted to float32 by
// convert_output (all the 16-bit chunks alive until the last is converted), the previous step's list in
// *held freed as the loop's name is rebound and the new one kept there, logits[-1] = logits[-1][..., :-1,
// :], and cross_entropy of each chunk against targets[..., 1:] split alike (zip: a last chunk left empty by
// the slice has no targets); reduction="none" concatenated and averaged, here the chunks' sums added and
// divided by the positions (the per-position losses are a few bytes).
func heldChunkedLoss(rt *tensor.Runtime, head Layer, h, labels *tensor.Tensor, chunk int, held *[]*tensor.Tensor) *tensor.Tensor {
	b, t := h.Dim(0), h.Dim(1)
	if t < 2 { // no position has a next token: torch.cat of no losses raises
		tensor.Abort(fmt.Errorf("loss litgpt-chunked: a batch of %d token has no next token to predict (LitGPT's chunked_cross_entropy concatenates no losses, and torch.cat raises)", t))
	}
	chunks := headChunks(rt, head, h, chunk)
	h.Release() // GPT.forward returns: its x goes
	f32 := make([]*tensor.Tensor, len(chunks))
	for i, c := range chunks {
		f32[i] = tensor.ToDType(c, tensor.F32).SetName("logits")
	}
	releaseAll(chunks)
	releaseAll(*held)
	*held = f32
	if last := f32[len(f32)-1]; last.Dim(1) > 1 { // a one-token chunk sliced empty is never read
		f32[len(f32)-1] = last.Narrow(1, 0, last.Dim(1)-1).SetName("logits")
		last.Release()
	}
	targets := labels.Narrow(-1, 1, t-1)
	defer targets.Release()
	var total *tensor.Tensor
	for i := 0; i*chunk < t-1; i++ {
		n := min(chunk, t-1-i*chunk)
		flat := f32[i].Reshape(-1, f32[i].Dim(-1))
		tc := targets.Narrow(1, i*chunk, n)
		tflat := tc.Reshape(-1)
		tc.Release()
		ce := tensor.CrossEntropySum(flat, tflat)
		flat.Release()
		tflat.Release()
		total = addLoss(total, ce)
	}
	loss := tensor.Scale(total, 1/float32(b*(t-1)))
	total.Release()
	return loss
}

// headChunks runs lm_head over each chunk of chunk tokens of h, in order ([lm_head(x_i) for x_i in
// x.split(chunk, dim=1)]), and returns the chunks' logits; h stays the caller's.
func headChunks(rt *tensor.Runtime, head Layer, h *tensor.Tensor, chunk int) []*tensor.Tensor {
	t := h.Dim(1)
	var chunks []*tensor.Tensor
	leave := rt.Scope("lm_head")
	defer leave()
	for start := 0; start < t; start += chunk {
		hc := h.Narrow(1, start, min(chunk, t-start))
		chunks = append(chunks, head.Forward(hc))
		hc.Release()
	}
	return chunks
}

// addLoss adds a chunk's loss ce to the running total (nil before the first), taking both references.
func addLoss(total, ce *tensor.Tensor) *tensor.Tensor {
	if total == nil {
		return ce
	}
	sum := tensor.Add(total, ce)
	total.Release()
	ce.Release()
	return sum
}
