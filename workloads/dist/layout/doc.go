// Package layout gives the per-rank memory of Megatron-style model-parallel layouts of a GPT/Llama-shaped
// transformer as closed-form formulas: data (DP), tensor (TP, with or without sequence parallelism),
// pipeline (PP: GPipe, 1F1B, interleaved) and context (CP) parallelism, Megatron's distributed optimizer
// (ZeRO-1) and activation recomputation.
//
// Parameters, gradients and optimizer states follow Megatron's mixed precision (bf16 weights, fp32 main
// gradients, fp32 master weights and Adam's two moments); activations follow Korthikanti et al. 2022,
// "Reducing Activation Recomputation in Large Transformer Models" (arXiv:2205.05198), held for as many
// micro-batches as each pipeline stage's schedule keeps in flight. Estimate gives every stage's rank;
// Megatron reproduces Megatron-LM's own estimate (megatron/training/theoretical_memory_usage.py), which
// is a special case of Estimate with the simplifications its doc comment lists.
//
// It is arithmetic on shapes: nothing is allocated, and the runtime's own ranks (package dist) are not
// involved. docs/distributed.md ("Model-parallel layouts") states each formula with its source.
package layout
