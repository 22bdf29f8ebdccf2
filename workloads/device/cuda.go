//go:build cuda

package device

// The cuda device: segments of real GPU memory from the CUDA driver API, through gorgonia.org/cu for what it
// wraps (devices, the primary context, cuMemGetInfo, cuMemAlloc, cuMemFree, cuMemsetD8) and through cgo for
// the virtual memory management calls of expandable segments, which gorgonia.org/cu v0.9.6 does not wrap.
//
// Importing gorgonia.org/cu runs its init, which calls cuInit and exits the process (status 1, a message on
// stdout) when that fails; and the binary links libcuda.so.1, so it does not start at all without one. That
// is why this file is behind the cuda build tag and nothing in the default build imports it.

/*
#cgo LDFLAGS: -lcuda
#cgo linux CFLAGS: -I/usr/local/cuda/include
#cgo linux LDFLAGS: -L/usr/local/cuda/lib64 -L/usr/local/cuda/lib64/stubs

#include <cuda.h>
*/
import "C"

import (
	"fmt"
	"math"
	"reflect"
	"runtime"
	"sync"

	"gorgonia.org/cu"

	"github.com/oomdbg/oomdbg/allocator"
)

// NewCUDA returns a cuda device on the GPU with the given ordinal: its caching allocator, with settings cfg,
// takes segments of real device memory from the CUDA driver. Ops compute nothing, as on meta; the memory is
// real. The error says what is missing when the driver has no such device or cannot give it a context.
//
// A binary built with the cuda tag needs the driver to start at all: without libcuda.so.1 the dynamic
// loader refuses it, and when cuInit fails (no device, a broken driver) gorgonia.org/cu's package init exits
// the process before main.
func NewCUDA(ordinal int, cfg allocator.Config) (*Device, error) {
	mem, err := OpenCUDAMemory(ordinal)
	if err != nil {
		return nil, err
	}
	return New(CUDA, mem, cfg), nil
}

// CUDAMemory is the memory of one GPU, as the caching allocator sees it (an allocator.Device), taken from the
// CUDA driver in the device's primary context: the context the CUDA runtime, and so PyTorch, uses, so that
// nvidia-smi shows one context per process, as with PyTorch.
//
// Every segment is written once (cuMemsetD8) when it is allocated, so that the memory is resident on the card
// and not a mapping the driver might back lazily. A driver out-of-memory error (CUDA_ERROR_OUT_OF_MEMORY) is
// an allocator.ErrOutOfMemory: the allocator then releases its cache, retries, and finally fails with PyTorch's
// OOM message, exactly as on a simulated device.
//
// It is safe for concurrent use: each call binds the context to the calling thread, and the driver is
// thread-safe.
type CUDAMemory struct {
	ordinal int
	dev     cu.Device
	ctx     cu.CUContext // the primary context, retained until Close
	total   uint64       // cuDeviceTotalMem

	// vmm is whether the device supports the virtual memory management API (expandable segments), and
	// granularity the size physical allocations and reservations must be multiples of.
	vmm         bool
	granularity uint64

	closeOnce sync.Once
	closeErr  error
}

// OpenCUDAMemory retains the primary context of the GPU with the given ordinal and returns its memory.
// Call Close when done.
func OpenCUDAMemory(ordinal int) (*CUDAMemory, error) {
	n, err := cu.NumDevices()
	if err != nil {
		return nil, cuError(ordinal, "cuDeviceGetCount()", err)
	}
	if ordinal < 0 || ordinal >= n {
		return nil, fmt.Errorf("cuda: no GPU %d: the CUDA driver sees %d device(s)", ordinal, n)
	}
	dev, err := cu.GetDevice(ordinal)
	if err != nil {
		return nil, cuError(ordinal, fmt.Sprintf("cuDeviceGet(%d)", ordinal), err)
	}
	total, err := dev.TotalMem()
	if err != nil {
		return nil, cuError(ordinal, "cuDeviceTotalMem()", err)
	}
	vmm, err := dev.Attribute(cu.DeviceAttribute(C.CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED))
	if err != nil {
		return nil, cuError(ordinal, "cuDeviceGetAttribute(VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)", err)
	}
	ctx, err := dev.RetainPrimaryCtx()
	if err != nil {
		return nil, cuError(ordinal, "cuDevicePrimaryCtxRetain()", err)
	}
	m := &CUDAMemory{ordinal: ordinal, dev: dev, ctx: ctx, total: uint64(total), vmm: vmm != 0}
	if m.vmm {
		prop := m.allocationProp()
		var g C.size_t
		if r := C.cuMemGetAllocationGranularity(&g, &prop, C.CU_MEM_ALLOC_GRANULARITY_MINIMUM); r != C.CUDA_SUCCESS {
			m.Close()
			return nil, driverError(ordinal, "cuMemGetAllocationGranularity()", r)
		}
		m.granularity = uint64(g)
	}
	return m, nil
}

// Close releases the primary context. Once no one else holds it, the driver destroys it and frees every
// byte allocated in it, so the allocator of this memory must not be used afterwards.
func (m *CUDAMemory) Close() error {
	m.closeOnce.Do(func() {
		if err := m.dev.ReleasePrimaryCtx(); err != nil {
			m.closeErr = cuError(m.ordinal, "cuDevicePrimaryCtxRelease()", err)
		}
	})
	return m.closeErr
}

// Name returns the device's name as the driver reports it, e.g. "NVIDIA GeForce RTX 4090".
func (m *CUDAMemory) Name() (string, error) {
	name, err := m.dev.Name()
	if err != nil {
		return "", cuError(m.ordinal, "cuDeviceGetName()", err)
	}
	return name, nil
}

// SupportsExpandableSegments reports whether the device has the virtual memory management API that
// expandable segments (expandable_segments:True) are built on.
func (m *CUDAMemory) SupportsExpandableSegments() bool { return m.vmm }

// Index implements allocator.Device.
func (m *CUDAMemory) Index() int { return m.ordinal }

// TotalMemory implements allocator.Device: cuDeviceTotalMem, the card's whole memory.
func (m *CUDAMemory) TotalMemory() uint64 { return m.total }

// MemGetInfo implements allocator.Device with cuMemGetInfo: what the driver says is free and in total now,
// after every context and process on the card took its share.
func (m *CUDAMemory) MemGetInfo() (free, total uint64, err error) {
	err = m.do(func() error {
		f, t, err := cu.MemInfo()
		if err != nil {
			return cuError(m.ordinal, "cuMemGetInfo()", err)
		}
		free, total = uint64(f), uint64(t)
		return nil
	})
	return free, total, err
}

// Processes implements allocator.Device. The driver API does not list the processes on a device (that is
// NVML's), so it returns nil and the OOM message says nothing about them.
func (m *CUDAMemory) Processes() []allocator.ProcessMemory { return nil }

// Malloc implements allocator.Device with cuMemAlloc, then writes the whole segment once so that it is
// resident.
func (m *CUDAMemory) Malloc(size uint64) (uint64, error) {
	if size == 0 || size > math.MaxInt64 {
		return 0, fmt.Errorf("cuda:%d: cuMemAlloc(%d): invalid size", m.ordinal, size)
	}
	var addr uint64
	err := m.do(func() error {
		p, err := cu.MemAlloc(int64(size))
		if err != nil {
			return cuError(m.ordinal, fmt.Sprintf("cuMemAlloc(%d)", size), err)
		}
		if err := cu.MemsetD8(p, 0, int64(size)); err != nil {
			cu.MemFree(p) // best effort: the memset's error is the one to report
			return cuError(m.ordinal, fmt.Sprintf("cuMemsetD8(%#x, 0, %d)", uint64(p), size), err)
		}
		addr = uint64(p)
		return nil
	})
	return addr, err
}

// Free implements allocator.Device with cuMemFree.
func (m *CUDAMemory) Free(addr uint64) error {
	return m.do(func() error {
		if err := cu.MemFree(cu.DevicePtr(addr)); err != nil {
			return cuError(m.ordinal, fmt.Sprintf("cuMemFree(%#x)", addr), err)
		}
		return nil
	})
}

// ReserveAddressRange implements allocator.Device with cuMemAddressReserve.
func (m *CUDAMemory) ReserveAddressRange(size uint64) (uint64, error) {
	if err := m.checkVMM("cuMemAddressReserve", size); err != nil {
		return 0, err
	}
	var addr C.CUdeviceptr
	err := m.do(func() error {
		if r := C.cuMemAddressReserve(&addr, C.size_t(size), 0, 0, 0); r != C.CUDA_SUCCESS {
			return driverError(m.ordinal, fmt.Sprintf("cuMemAddressReserve(%d)", size), r)
		}
		return nil
	})
	return uint64(addr), err
}

// FreeAddressRange implements allocator.Device with cuMemAddressFree.
func (m *CUDAMemory) FreeAddressRange(addr, size uint64) error {
	return m.do(func() error {
		if r := C.cuMemAddressFree(C.CUdeviceptr(addr), C.size_t(size)); r != C.CUDA_SUCCESS {
			return driverError(m.ordinal, fmt.Sprintf("cuMemAddressFree(%#x, %d)", addr, size), r)
		}
		return nil
	})
}

// CreatePhysical implements allocator.Device with cuMemCreate of pinned memory on this device.
func (m *CUDAMemory) CreatePhysical(size uint64) (allocator.PhysicalHandle, error) {
	if err := m.checkVMM("cuMemCreate", size); err != nil {
		return 0, err
	}
	var h C.CUmemGenericAllocationHandle
	err := m.do(func() error {
		prop := m.allocationProp()
		if r := C.cuMemCreate(&h, C.size_t(size), &prop, 0); r != C.CUDA_SUCCESS {
			return driverError(m.ordinal, fmt.Sprintf("cuMemCreate(%d)", size), r)
		}
		return nil
	})
	return allocator.PhysicalHandle(h), err
}

// ReleasePhysical implements allocator.Device with cuMemRelease.
func (m *CUDAMemory) ReleasePhysical(h allocator.PhysicalHandle) error {
	return m.do(func() error {
		if r := C.cuMemRelease(C.CUmemGenericAllocationHandle(h)); r != C.CUDA_SUCCESS {
			return driverError(m.ordinal, fmt.Sprintf("cuMemRelease(%d)", h), r)
		}
		return nil
	})
}

// Map implements allocator.Device: cuMemMap, cuMemSetAccess for this device (read and write), then one write
// of the range so that it is resident, as Malloc does.
func (m *CUDAMemory) Map(addr, size uint64, h allocator.PhysicalHandle) error {
	if size > math.MaxInt64 {
		return fmt.Errorf("cuda:%d: cuMemMap(%#x, %d): invalid size", m.ordinal, addr, size)
	}
	return m.do(func() error {
		ptr, n := C.CUdeviceptr(addr), C.size_t(size)
		if r := C.cuMemMap(ptr, n, 0, C.CUmemGenericAllocationHandle(h), 0); r != C.CUDA_SUCCESS {
			return driverError(m.ordinal, fmt.Sprintf("cuMemMap(%#x, %d, %d)", addr, size, h), r)
		}
		var access C.CUmemAccessDesc
		access.location._type = C.CU_MEM_LOCATION_TYPE_DEVICE
		access.location.id = C.int(m.ordinal)
		access.flags = C.CU_MEM_ACCESS_FLAGS_PROT_READWRITE
		if r := C.cuMemSetAccess(ptr, n, &access, 1); r != C.CUDA_SUCCESS {
			C.cuMemUnmap(ptr, n) // leave nothing half mapped
			return driverError(m.ordinal, fmt.Sprintf("cuMemSetAccess(%#x, %d)", addr, size), r)
		}
		if err := cu.MemsetD8(cu.DevicePtr(addr), 0, int64(size)); err != nil {
			C.cuMemUnmap(ptr, n)
			return cuError(m.ordinal, fmt.Sprintf("cuMemsetD8(%#x, 0, %d)", addr, size), err)
		}
		return nil
	})
}

// Unmap implements allocator.Device with cuMemUnmap.
func (m *CUDAMemory) Unmap(addr, size uint64) error {
	return m.do(func() error {
		if r := C.cuMemUnmap(C.CUdeviceptr(addr), C.size_t(size)); r != C.CUDA_SUCCESS {
			return driverError(m.ordinal, fmt.Sprintf("cuMemUnmap(%#x, %d)", addr, size), r)
		}
		return nil
	})
}

// do runs f on a thread with the primary context current. The context is per thread in the driver API and
// goroutines move between threads, so the goroutine stays on its thread while f runs.
func (m *CUDAMemory) do(f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if err := cu.SetCurrentContext(m.ctx); err != nil {
		return cuError(m.ordinal, "cuCtxSetCurrent()", err)
	}
	return f()
}

// checkVMM refuses a virtual memory management call the device cannot serve, with a message that says
// what to do, rather than the driver's bare CUDA_ERROR_NOT_SUPPORTED.
func (m *CUDAMemory) checkVMM(call string, size uint64) error {
	if !m.vmm {
		return fmt.Errorf("cuda:%d: %s: expandable segments need the CUDA virtual memory management API, which this device or driver does not support; set expandable_segments:False", m.ordinal, call)
	}
	if size == 0 || size%m.granularity != 0 {
		return fmt.Errorf("cuda:%d: %s(%d): size is not a multiple of the allocation granularity (%d bytes)", m.ordinal, call, size, m.granularity)
	}
	return nil
}

// allocationProp describes the physical memory of expandable segments: pinned device memory on this GPU,
// as PyTorch's ExpandableSegment asks for.
func (m *CUDAMemory) allocationProp() C.CUmemAllocationProp {
	var prop C.CUmemAllocationProp
	prop._type = C.CU_MEM_ALLOCATION_TYPE_PINNED
	prop.location._type = C.CU_MEM_LOCATION_TYPE_DEVICE
	prop.location.id = C.int(m.ordinal)
	return prop
}

// DriverError is a CUDA driver call that failed. A CUDA_ERROR_OUT_OF_MEMORY unwraps to
// allocator.ErrOutOfMemory, which sends the caching allocator down its release-and-retry path.
type DriverError struct {
	Device int    // the device ordinal
	Call   string // the call and its arguments, e.g. "cuMemAlloc(20971520)"
	Code   int    // the CUresult
	Name   string // cuGetErrorName, e.g. "CUDA_ERROR_OUT_OF_MEMORY"
	Text   string // cuGetErrorString, e.g. "out of memory"
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("cuda:%d: %s: %s (%s)", e.Device, e.Call, e.Text, e.Name)
}

// Unwrap returns allocator.ErrOutOfMemory for CUDA_ERROR_OUT_OF_MEMORY, nil otherwise.
func (e *DriverError) Unwrap() error {
	if e.Code == C.CUDA_ERROR_OUT_OF_MEMORY {
		return allocator.ErrOutOfMemory
	}
	return nil
}

// driverError describes CUresult r of call with the driver's own words.
func driverError(device int, call string, r C.CUresult) *DriverError {
	e := &DriverError{Device: device, Call: call, Code: int(r), Name: fmt.Sprintf("CUresult %d", int(r)), Text: "unknown error"}
	var s *C.char
	if C.cuGetErrorName(r, &s) == C.CUDA_SUCCESS && s != nil {
		e.Name = C.GoString(s)
	}
	s = nil
	if C.cuGetErrorString(r, &s) == C.CUDA_SUCCESS && s != nil {
		e.Text = C.GoString(s)
	}
	return e
}

// cuError turns an error from gorgonia.org/cu into a *DriverError. The package returns the CUresult as a
// value of an unexported int type, so the code is read through reflection.
func cuError(device int, call string, err error) error {
	if v := reflect.ValueOf(err); v.Kind() == reflect.Int {
		return driverError(device, call, C.CUresult(v.Int()))
	}
	return fmt.Errorf("cuda:%d: %s: %w", device, call, err)
}
