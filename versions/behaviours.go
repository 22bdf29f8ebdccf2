package versions

// Behaviour is one change of what a library keeps in memory, keyed by the first release that has it and
// cited. A run with an earlier release of Library gets Before, a run with Changed or later gets After.
type Behaviour struct {
	ID      string  // a short name, e.g. "bitsandbytes.matmul4bit-input"
	Library Library // whose release changed it
	Changed Version // the first release with the new behaviour
	Before  string  // what a release before Changed does
	After   string  // what Changed and later do
	File    string  // the source file that does it
	Commit  string  // the commit or pull request that changed it
	URL     string  // where to read the change
	Test    string  // the test that holds the runtime to it
}

// In reports whether a run with the versions of s has the new behaviour (its library at Changed or later).
func (b Behaviour) In(s Set) bool { return !s.Of(b.Library).Before(b.Changed) }

// The behaviours, one variable each, so that the runtime names the row it consults.
var (
	// MatMul4BitDropsInput: bitsandbytes' MatMul4Bit stopped keeping its input for a backward that never reads
	// it.
	MatMul4BitDropsInput = Behaviour{
		ID: "bitsandbytes.matmul4bit-input", Library: Bitsandbytes, Changed: V(0, 43, 2),
		Before: "MatMul4Bit.forward keeps its input A in ctx.tensors = (A, B) until its backward (a 16-bit activation per 4-bit linear layer, as large as the layer's input, held though backward only reads B)",
		After:  "ctx.tensors = (None, B): no activation is kept; backward dequantizes B again",
		File:   "bitsandbytes/autograd/_functions.py", Commit: "9e753741 (#1270, \"fix QLoRA mem bug: delete useless buffered activation\")",
		URL:  "https://github.com/bitsandbytes-foundation/bitsandbytes/pull/1270",
		Test: "workloads/nn TestQLoRASavesWhatBitsandbytesSaves",
	}
	// QuantizesInOwnDType: bitsandbytes stopped quantizing a float16 copy of each 4-bit weight.
	QuantizesInOwnDType = Behaviour{
		ID: "bitsandbytes.quantize-half", Library: Bitsandbytes, Changed: V(0, 43, 0),
		Before: "Params4bit.cuda quantizes self.data.contiguous().half(): the quant state's dtype is float16, so each dequantize_4bit gives a float16 weight that MatMul4Bit's .to(A.dtype) copies into the bfloat16 compute dtype, forward and backward (two weight-sized temporaries alive together)",
		After:  "Params4bit._quantize quantizes the weight in its own dtype: a bfloat16 checkpoint dequantizes to bfloat16 and .to(A.dtype) copies nothing",
		File:   "bitsandbytes/nn/modules.py (Params4bit)", Commit: "dcfb6f81 (#970, \"Initial FSDP Support for QLoRA Finetuning\")",
		URL:  "https://github.com/bitsandbytes-foundation/bitsandbytes/pull/970",
		Test: "workloads/nn TestOldBitsandbytesDequantizesHalf",
	}
	// LossFunction: transformers moved the causal-LM loss out of the model's forward into ForCausalLMLoss.
	LossFunction = Behaviour{
		ID: "transformers.causal-lm-loss", Library: Transformers, Changed: V(4, 46, 0),
		Before: "LlamaForCausalLM.forward: logits = logits.float() (the 16-bit logits freed), shift_logits = logits[..., :-1, :].contiguous() (a second float32 copy), CrossEntropyLoss: float32 logits, their shifted copy and the log-probabilities alive together",
		After:  "self.loss_function, ForCausalLMLoss as first written: the 16-bit logits kept as the model's output, logits.float(), logits[..., :-1, :].contiguous() and cross_entropy inside the loss: the 16-bit logits, two float32 copies and the log-probabilities alive together",
		File:   "src/transformers/loss/loss_utils.py, src/transformers/models/llama/modeling_llama.py", Commit: "release v4.46.0 (loss functions moved out of the models)",
		URL:  "https://github.com/huggingface/transformers/releases/tag/v4.46.0",
		Test: "workloads/nn TestLossGenerationsSaveWhatPyTorchSaves",
	}
	// LossShiftsLabels: ForCausalLMLoss shifts the labels, not the logits.
	LossShiftsLabels = Behaviour{
		ID: "transformers.causal-lm-loss-shift", Library: Transformers, Changed: V(4, 49, 0),
		Before: "ForCausalLMLoss copies logits[..., :-1, :].contiguous() in float32",
		After:  "ForCausalLMLoss pads the labels with -100 and shifts them (labels[..., 1:].contiguous()): no copy of the logits beyond logits.float()",
		File:   "src/transformers/loss/loss_utils.py", Commit: "#35646 (\"Optimize ForCausalLMLoss by removing unnecessary contiguous() call\", merged 2025-01-13, after v4.48.0)",
		URL:  "https://github.com/huggingface/transformers/pull/35646",
		Test: "workloads/nn TestLossGenerationsSaveWhatPyTorchSaves",
	}
	// NumItemsInBatch: Trainer passes the batch's token count to the loss.
	NumItemsInBatch = Behaviour{
		ID: "transformers.num-items-in-batch", Library: Transformers, Changed: V(4, 46, 0),
		Before: "cross_entropy(reduction=\"mean\"), and Trainer divides the loss by gradient_accumulation_steps",
		After:  "Trainer counts the labels of the step's micro-batches (num_items_in_batch) and the loss is fixed_cross_entropy(reduction=\"sum\") / num_items_in_batch, not divided again: scalars only, no activation changes",
		File:   "src/transformers/loss/loss_utils.py (fixed_cross_entropy), src/transformers/trainer.py", Commit: "release v4.46.0 (the gradient accumulation fix)",
		URL:  "https://github.com/huggingface/transformers/releases/tag/v4.46.0",
		Test: "workloads/nn TestLossGenerationsSaveWhatPyTorchSaves",
	}
	// FSDPUpcastsParameters: accelerate holds a low-precision model's parameters in float32 under FSDP mixed
	// precision.
	FSDPUpcastsParameters = Behaviour{
		ID: "accelerate.fsdp-upcast", Library: Accelerate, Changed: V(0, 30, 0),
		Before: "Accelerator.prepare wraps a model loaded in bf16 or fp16 as it is: FSDP's flat parameters and optimizer state in 16 bits",
		After:  "with mixed precision on, the model's 16-bit parameters are upcast to float32 before FSDP wraps them (DeepSpeed's rule): flat parameters, gradients and optimizer state in float32, compute in the mixed-precision dtype",
		File:   "src/accelerate/accelerator.py (Accelerator.prepare_model)", Commit: "9557598c (#2674, \"Add Upcasting for FSDP in Mixed Precision\")",
		URL:  "https://github.com/huggingface/accelerate/pull/2674",
		Test: "versions TestFSDPUpcastRule",
	}
	// MeanSavesSizes: torch's mean over a dimension stopped saving its input.
	MeanSavesSizes = Behaviour{
		ID: "torch.mean-dim-backward", Library: Torch, Changed: V(2, 0, 0),
		Before: "MeanBackward1 (mean.dim) keeps its input (_saved_self; seen on torch 1.13.1): RMSNorm's float32 pow(2) output is held for backward in every norm",
		After:  "derivatives.yaml mean.dim: mean_backward(grad, self.sym_sizes(), dim, self.sym_numel(), keepdim): sizes and numel only",
		File:   "tools/autograd/derivatives.yaml (mean.dim)", Commit: "release v2.0.0 (symbolic sizes in derivatives.yaml)",
		URL:  "https://github.com/pytorch/pytorch/blob/v2.0.0/tools/autograd/derivatives.yaml",
		Test: "workloads/nn TestMeanBackwardOfTorch113",
	}
	// AdapterDTypeFloat32: peft upcasts 16-bit adapter weights to float32.
	AdapterDTypeFloat32 = Behaviour{
		ID: "peft.autocast-adapter-dtype", Library: PEFT, Changed: V(0, 12, 0),
		Before: "LoRA weights take the base layer's dtype when it is a float (bf16 on a bf16 base; float32 on a 4-bit uint8 base): _move_adapter_to_device_of_base_layer",
		After:  "autocast_adapter_dtype=True: bf16 and fp16 adapter weights upcast to float32",
		File:   "src/peft/tuners/tuners_utils.py, src/peft/tuners/lora/layer.py", Commit: "ae1ae20b7 (#1706, \"Autocast adapter weights if fp16/bf16\")",
		URL:  "https://github.com/huggingface/peft/pull/1706",
		Test: "workloads/train TestLoRADTypeFollowsPEFT",
	}
)

// Behaviours is the table: every behaviour the runtime keys on a library's release, in the order
// docs/versions.md lists them.
var Behaviours = []Behaviour{
	MatMul4BitDropsInput, QuantizesInOwnDType, LossFunction, LossShiftsLabels, NumItemsInBatch, FSDPUpcastsParameters, MeanSavesSizes,
	AdapterDTypeFloat32,
}

// MatMul4BitKeepsInput reports whether bitsandbytes' MatMul4Bit keeps its input until backward.
func (s Set) MatMul4BitKeepsInput() bool { return !MatMul4BitDropsInput.In(s) }

// QuantizesHalf reports whether bitsandbytes quantizes a float16 copy of each 4-bit weight (its quant
// state, and so every dequantization, in float16).
func (s Set) QuantizesHalf() bool { return !QuantizesInOwnDType.In(s) }

// LossGeneration is how a transformers release computes a causal LM's loss.
type LossGeneration uint8

// The generations of the causal-LM loss.
const (
	// LossInModel is the loss inside LlamaForCausalLM.forward (transformers before 4.46).
	LossInModel LossGeneration = iota
	// LossShiftLogits is ForCausalLMLoss as first written (4.46 to 4.48): the logits shifted and copied.
	LossShiftLogits
	// LossShiftLabels is ForCausalLMLoss from 4.49: the labels padded and shifted.
	LossShiftLabels
)

var lossNames = [...]string{"in-model", "shift-logits", "shift-labels"}

func (g LossGeneration) String() string {
	if int(g) < len(lossNames) {
		return lossNames[g]
	}
	return "loss(?)"
}

// CausalLMLoss returns the generation of the causal-LM loss of the set's transformers.
func (s Set) CausalLMLoss() LossGeneration {
	switch {
	case LossShiftsLabels.In(s):
		return LossShiftLabels
	case LossFunction.In(s):
		return LossShiftLogits
	}
	return LossInModel
}

// NumItemsInBatch reports whether Trainer divides a summed loss by the step's label count.
func (s Set) NumItemsInBatch() bool { return NumItemsInBatch.In(s) }

// FSDPUpcastsParameters reports whether accelerate holds a 16-bit model's parameters in float32 when FSDP
// runs with mixed precision.
func (s Set) FSDPUpcastsParameters() bool { return FSDPUpcastsParameters.In(s) }

// MeanKeepsInput reports whether torch's mean over a dimension keeps its input for backward.
func (s Set) MeanKeepsInput() bool { return !MeanSavesSizes.In(s) }

// AdaptersFloat32 reports whether peft makes LoRA weights float32 on a 16-bit base.
func (s Set) AdaptersFloat32() bool { return AdapterDTypeFloat32.In(s) }
