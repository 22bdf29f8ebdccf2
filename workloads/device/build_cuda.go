//go:build cuda

package device

import "github.com/oomdbg/oomdbg/allocator"

// cudaBuilt reports whether this binary can run the cuda device.
const cudaBuilt = true

// newCUDA opens GPU ordinal through the CUDA driver.
func newCUDA(ordinal int, cfg allocator.Config) (*Device, error) { return NewCUDA(ordinal, cfg) }
