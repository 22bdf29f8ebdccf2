// Package dist is one rank of a data-parallel training job: the training loop's step plus what a strategy
// does to parameters, gradients and the optimizer, its communication buffers and its CPU offload, so that a
// rank's memory is what the real implementation's would be.
//
// The strategies follow their implementations, read at these versions:
//
//   - DDP: torch/nn/parallel/distributed.py and torch/csrc/distributed/c10d/reducer.cpp (pytorch/pytorch
//     ad78a7b3): bucket_cap_mb 25, the first bucket of _DEFAULT_FIRST_BUCKET_BYTES (1 MiB) after the buckets
//     are rebuilt in gradient order, gradient_as_bucket_view.
//   - ZeRO-1, 2 and 3: DeepSpeed's runtime/zero/stage_1_and_2.py, stage3.py, partition_parameters.py,
//     partitioned_param_coordinator.py, config.py and offload_config.py (deepspeedai/DeepSpeed edaa7221).
//   - FSDP: torch/distributed/fsdp/_flat_param.py, _runtime_utils.py and _limiter_utils.py (FULL_SHARD,
//     SHARD_GRAD_OP, HYBRID_SHARD; limit_all_gathers, BACKWARD_PRE prefetching).
//   - Pinned host memory: aten/src/ATen/core/CachingHostAllocator.h (pytorch/pytorch dd2a7efe), in
//     package allocator.
//
// A Rank is driven by workloads/train: it is told of each block as the model is built, wraps the model,
// and takes the forward, backward, step and zero_grad in turn; what it moves is counted per step as Traffic
// and noted in the recording. Settings is the job, every choice a typed value a planner can enumerate
// (Strategies, Offloads, Wraps).
package dist
