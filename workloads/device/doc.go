// Package device provides the devices a workload runs on and their math.
//
// Every device accounts memory through the caching-allocator model (package allocator) against its capacity, so
// out-of-memory errors happen where they would on a GPU of that size. What differs is the math: the meta device
// computes nothing (shapes only, any model size in milliseconds), the cpu device computes real float32 results
// with the kernels of this package (half precision rounded to fp16 or bf16, two bytes accounted), and the cuda
// device (build tag cuda) puts the memory on a real GPU.
package device
