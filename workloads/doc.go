// Package workloads is the simulated PyTorch that oomdbg's own training workloads run on, and nothing else:
// tensors with autograd and autocast (workloads/tensor), modules and models (workloads/nn), optimizers
// (workloads/optim), devices (workloads/device), data-parallel ranks (workloads/dist) and the training loop
// with its configuration, presets and leak bugs (workloads/train). It asks the caching-allocator model
// (package allocator) for memory as PyTorch asks CUDACachingAllocator, and tags what it allocates with
// the snapshot's vocabulary so that tracer can record it. The what-if on recorded traces (package whatif),
// the planner (fit) and the analyses (triage, leaks) live outside it, and use it like any client.
package workloads
