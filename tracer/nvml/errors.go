package nvml

import (
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// ErrNoDriver matches (with errors.Is) the error of [Open] on a machine without a usable NVIDIA driver:
// libnvidia-ml could not be loaded, or it loaded but the kernel driver is not running.
var ErrNoDriver = errors.New("no NVIDIA driver found")

// ErrClosed is returned by the readings of a [Session] after [Session.Close].
var ErrClosed = errors.New("nvml: session is closed")

// NoDriverError is the error of [Open] when there is no NVIDIA driver to talk to. It matches [ErrNoDriver].
type NoDriverError struct {
	Library string        // the library that could not be used, e.g. "libnvidia-ml.so.1"
	Code    nvmlib.Return // ERROR_LIBRARY_NOT_FOUND or ERROR_DRIVER_NOT_LOADED
}

// Error returns the one line a user sees: what is missing and what it means for them.
func (e *NoDriverError) Error() string {
	if e.Code == nvmlib.ERROR_DRIVER_NOT_LOADED {
		return fmt.Sprintf("no NVIDIA driver loaded (%s is installed but the kernel driver is not running); GPU readings are unavailable", e.Library)
	}
	return fmt.Sprintf("no NVIDIA driver found (%s could not be loaded); GPU readings are unavailable", e.Library)
}

// Is reports whether target is [ErrNoDriver].
func (e *NoDriverError) Is(target error) bool { return target == ErrNoDriver }

// Unwrap returns the NVML return code, so errors.Is(err, nvml.ERROR_LIBRARY_NOT_FOUND) works too.
func (e *NoDriverError) Unwrap() error { return e.Code }

// Error is an NVML call that failed. It unwraps to NVML's return code, so callers can test for one with
// errors.Is(err, nvmlib.ERROR_GPU_IS_LOST).
type Error struct {
	Op     string        // what was being done, e.g. "read memory"
	Device int           // the device index, or -1 when the call concerns no single device
	Code   nvmlib.Return // NVML's return code
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
func newError(op string, device int, code nvmlib.Return) error {
	if code == nvmlib.SUCCESS {
		return nil
	}
	return &Error{Op: op, Device: device, Code: code}
}

// describe explains the return codes a user can do something about; the rest keep NVML's own wording.
func describe(code nvmlib.Return) string {
	switch code {
	case nvmlib.ERROR_UNINITIALIZED:
		return "NVML is not initialized"
	case nvmlib.ERROR_INVALID_ARGUMENT:
		return "invalid argument (no such device?)"
	case nvmlib.ERROR_NOT_SUPPORTED:
		return "not supported by this device or driver"
	case nvmlib.ERROR_NO_PERMISSION:
		return "permission denied (the device may be restricted to another user or cgroup)"
	case nvmlib.ERROR_DRIVER_NOT_LOADED:
		return "the NVIDIA kernel driver is not loaded"
	case nvmlib.ERROR_LIBRARY_NOT_FOUND:
		return "libnvidia-ml.so.1 could not be loaded"
	case nvmlib.ERROR_FUNCTION_NOT_FOUND:
		return "this driver's NVML lacks the function (driver too old?)"
	case nvmlib.ERROR_GPU_IS_LOST:
		return "the GPU has fallen off the bus or is otherwise inaccessible (check dmesg for Xid errors)"
	case nvmlib.ERROR_RESET_REQUIRED:
		return "the GPU needs a reset (nvidia-smi --gpu-reset) or a reboot"
	case nvmlib.ERROR_OPERATING_SYSTEM:
		return "the operating system or a cgroup blocked access to the GPU"
	case nvmlib.ERROR_LIB_RM_VERSION_MISMATCH:
		return "NVIDIA driver/library version mismatch (the driver was updated: reload the kernel module or reboot)"
	case nvmlib.ERROR_TIMEOUT:
		return "the driver timed out"
	case nvmlib.ERROR_INSUFFICIENT_POWER:
		return "the GPU's external power cables are not properly attached"
	}
	// nvmlib.ErrorString asks the loaded library; without one it gives the constant's name.
	return nvmlib.ErrorString(code)
}
