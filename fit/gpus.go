package fit

import (
	"fmt"
	"strings"
)

// A GPU is a card's published peaks, what the cost model divides by. docs/fit.md cites each figure's
// datasheet. Throughputs are dense (without 2:4 sparsity); bandwidths are per direction.
type GPU struct {
	Name   string
	Memory uint64  // bytes
	FP32   float64 // TFLOPS without tensor cores: float32 matmuls (PyTorch's default allow_tf32=False)
	Tensor float64 // TFLOPS of 16-bit tensor-core matmuls with float32 accumulation (bf16, or fp16 without BF16)
	BF16   bool    // the card computes in bf16 (Ampere and later)
	HBM    float64 // device memory bandwidth, GB/s
	PCIe   float64 // host link, GB/s per direction
	// Link is the GPU-to-GPU bandwidth a ring collective moves each rank's bytes at, GB/s per direction:
	// NVLink where the card has it, else PCIe.
	Link float64
}

// GPUs are the profiles --gpu chooses among.
var GPUs = []GPU{
	{Name: "a100-40g", Memory: 40 << 30, FP32: 19.5, Tensor: 312, BF16: true, HBM: 1555, PCIe: 32, Link: 300},
	{Name: "a100-80g", Memory: 80 << 30, FP32: 19.5, Tensor: 312, BF16: true, HBM: 2039, PCIe: 32, Link: 300},
	{Name: "h100", Memory: 80 << 30, FP32: 67, Tensor: 989, BF16: true, HBM: 3350, PCIe: 64, Link: 450},
	{Name: "h200", Memory: 141 << 30, FP32: 67, Tensor: 989, BF16: true, HBM: 4800, PCIe: 64, Link: 450},
	{Name: "rtx4090", Memory: 24 << 30, FP32: 82.6, Tensor: 165.2, BF16: true, HBM: 1008, PCIe: 32, Link: 32},
	{Name: "l4", Memory: 24 << 30, FP32: 30.3, Tensor: 121, BF16: true, HBM: 300, PCIe: 32, Link: 32},
	{Name: "t4", Memory: 16 << 30, FP32: 8.1, Tensor: 65, BF16: false, HBM: 320, PCIe: 16, Link: 16},
}

// DefaultGPU is the profile used without --gpu.
const DefaultGPU = "a100-80g"

// LookupGPU returns the named profile.
func LookupGPU(name string) (GPU, error) {
	var names []string
	for _, g := range GPUs {
		if g.Name == name {
			return g, nil
		}
		names = append(names, g.Name)
	}
	return GPU{}, fmt.Errorf("unknown gpu %q (want one of %s)", name, strings.Join(names, ", "))
}
