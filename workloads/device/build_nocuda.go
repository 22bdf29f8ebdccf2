//go:build !cuda

package device

// cudaBuilt reports whether this binary can run the cuda device.
const cudaBuilt = false
