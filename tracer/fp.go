//go:build amd64 || arm64

package tracer

import "unsafe"

// framePointers says whether this architecture keeps a chain of frame pointers that walkFrames can follow.
// Go has kept one on amd64 and arm64 since 1.7 and 1.12; the runtime's execution tracer and block profiler
// unwind the same way.
const framePointers = true

// framePointer returns its caller's frame pointer: the address where the caller saved its own caller's frame
// pointer, one word below the caller's return address.
func framePointer() unsafe.Pointer
