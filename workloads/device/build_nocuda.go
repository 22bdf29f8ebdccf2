//go:build !cuda

package device

import (
	"errors"

	"github.com/oomdbg/oomdbg/allocator"
)

// cudaBuilt reports whether this binary can run the cuda device.
const cudaBuilt = false

// newCUDA is unavailable without the cuda build tag.
func newCUDA(int, allocator.Config) (*Device, error) {
	return nil, errors.New("device cuda needs a build with -tags cuda")
}
