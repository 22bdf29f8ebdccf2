package nvml

import (
	"errors"
	"fmt"

	gonvml "github.com/NVIDIA/go-nvml/pkg/nvml"
)

// ErrNoDriver matches (with errors.Is) the error of [Open] on a machine without a usable NVIDIA driver:
// libnvidia-ml could not be loaded, or it loaded but the kernel driver is not running.
var ErrNoDriver = errors.New("no NVIDIA driver found")

// ErrClosed is returned by the readings of a [Session] after [Session.Close].
var ErrClosed = errors.New("nvml: session is closed")

// NoDriverError is the error of [Open] when there is no NVIDIA driver to talk to. It matches [ErrNoDriver].
type NoDriverError struct {
	Library string        // the library go-nvml tried to load, e.g. "libnvidia-ml.so.1"
	Code    gonvml.Return // ERROR_LIBRARY_NOT_FOUND or ERROR_DRIVER_NOT_LOADED
}

// Error returns the one line a user sees: what is missing and what it means for them.
func (e *NoDriverError) Error() string {
	if e.Code == gonvml.ERROR_DRIVER_NOT_LOADED {
		return fmt.Sprintf("no NVIDIA driver loaded (%s is installed but the kernel driver is not running); GPU readings are unavailable", e.Library)
	}
	return fmt.Sprintf("no NVIDIA driver found (%s could not be loaded); GPU readings are unavailable", e.Library)
}

// Is reports whether target is [ErrNoDriver].
func (e *NoDriverError) Is(target error) bool { return target == ErrNoDriver }

// Unwrap returns the NVML return code, so errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) works too.
func (e *NoDriverError) Unwrap() error { return e.Code }

// Error is an NVML call that failed. It unwraps to the go-nvml return code, so callers can test for one with
// errors.Is(err, gonvml.ERROR_GPU_IS_LOST).
type Error struct {
	Op     string        // what was being done, e.g. "read memory"
	Device int           // the device index, or -1 when the call concerns no single device
	Code   gonvml.Return // NVML's return code
}

// Error says what failed, on which device, and why, in NVML's words or clearer ones.
func (e *Error) Error() string {
	if e.Device < 0 {
		return fmt.Sprintf("nvml: %s: %s", e.Op, describe(e.Code))
	}
	return fmt.Sprintf("nvml: %s of GPU %d: %s", e.Op, e.Device, describe(e.Code))
}

// Unwrap returns the NVML return code.
func (e *Error) Unwrap() error { return e.Code }

// newError returns nil for SUCCESS, else an *Error.
func newError(op string, device int, code gonvml.Return) error {
	if code == gonvml.SUCCESS {
		return nil
	}
	return &Error{Op: op, Device: device, Code: code}
}

// describe explains the return codes a user can do something about; the rest keep NVML's own wording.
func describe(code gonvml.Return) string {
	switch code {
	case gonvml.ERROR_UNINITIALIZED:
		return "NVML is not initialized"
	case gonvml.ERROR_INVALID_ARGUMENT:
		return "invalid argument (no such device?)"
	case gonvml.ERROR_NOT_SUPPORTED:
		return "not supported by this device or driver"
	case gonvml.ERROR_NO_PERMISSION:
		return "permission denied (the device may be restricted to another user or cgroup)"
	case gonvml.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case gonvml.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 could not be loaded"
	case gonvml.ERROR_FUNCTION_NOT_FOUND:
		return "this driver's NVML lacks the function (driver too old?)"
	case gonvml.ERROR_GPU_IS_LOST:
		return "the GPU has fallen off the bus or is otherwise inaccessible (check dmesg for Xid errors)"
	case gonvml.ERROR_RESET_REQUIRED:
		return "the GPU needs a reset (nvidia-smi --gpu-reset) or a reboot"
	case gonvml.ERROR_OPERATING_SYSTEM:
		return "the operating system or a cgroup blocked access to the GPU"
	case gonvml.ERROR_LIB_RM_VERSION_MISMATCH:
		return "NVIDIA driver/library version mismatch (the driver was updated: reload the kernel module or reboot)"
	case gonvml.ERROR_TIMEOUT:
		return "the driver timed out"
	case gonvml.ERROR_INSUFFICIENT_POWER:
		return "the GPU's external power cables are not properly attached"
	}
	// nvml.ErrorString asks the loaded library; without one go-nvml falls back to the constant's name.
	return gonvml.ErrorString(code)
}
