package allocator_test

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchrules"
)

// A 16 GiB card whose CUDA context takes 512 MiB, with max_split_size_mb set: a 13 GiB request after a
// 3 GiB one runs out of memory with PyTorch's message.
func Example() {
	cfg, err := allocator.ParseConfig("max_split_size_mb:256")
	if err != nil {
		fmt.Println(err)
		return
	}
	a := allocator.New(allocator.NewSimDevice(0, 16<<30, 512<<20), cfg)
	x, _ := a.Malloc(3<<30, 0)
	size, _ := a.BlockSize(x)
	fmt.Println("block:", torchrules.FormatSize(size))
	if _, err := a.Malloc(13<<30, 0); err != nil {
		fmt.Println(err)
	}
	st := a.Stats()
	fmt.Println("retries:", st.NumAllocRetries, "ooms:", st.NumOOMs)
	// Output:
	// block: 3.00 GiB
	// CUDA out of memory. Tried to allocate 13.00 GiB. GPU 0 has a total capacity of 16.00 GiB of which 12.50 GiB is free. Including non-PyTorch memory, this process has 3.50 GiB memory in use. Of the allocated memory 3.00 GiB is allocated by PyTorch, and 0 bytes is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)
	// retries: 1 ooms: 1
}
