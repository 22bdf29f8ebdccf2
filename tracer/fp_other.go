//go:build !amd64 && !arm64

package tracer

import "unsafe"

// framePointers is false where Go keeps no frame-pointer chain: every stack is captured with runtime.Callers.
const framePointers = false

func framePointer() unsafe.Pointer { return nil }
