package allocator

import (
	"errors"

	"github.com/oomdbg/oomdbg/internal/torchrules"
)

// ErrOutOfMemory is what a Device returns (possibly wrapped) when it has no memory left for a request,
// like cudaErrorMemoryAllocation from cudaMalloc or CUDA_ERROR_OUT_OF_MEMORY from cuMemCreate. The
// allocator treats it as a reason to release cached memory and retry; any other error is passed up.
var ErrOutOfMemory = errors.New("out of memory")

// PhysicalHandle names a piece of physical device memory created for an expandable segment
// (CUmemGenericAllocationHandle).
type PhysicalHandle uint64

// ProcessMemory is one process's use of a device, as NVML's nvmlDeviceGetComputeRunningProcesses reports it.
type ProcessMemory = torchrules.ProcessMemory

// Device is the memory of one GPU as the caching allocator sees it. Its methods mirror the CUDA calls
// PyTorch makes, so that a real device is a thin layer over cudaMalloc/cudaFree (cuMemAlloc/cuMemFree),
// cudaMemGetInfo (cuMemGetInfo), NVML and the virtual memory management API.
//
// The allocator calls a Device with its own lock held and never concurrently.
type Device interface {
	// Index is the device ordinal, printed in the OOM message ("GPU 0 has a total capacity of ...").
	Index() int
	// TotalMemory is cudaDeviceProp.totalGlobalMem: the base of memory fractions and of the address
	// space an expandable segment reserves.
	TotalMemory() uint64
	// MemGetInfo is cudaMemGetInfo: free and total bytes on the device right now.
	MemGetInfo() (free, total uint64, err error)
	// Processes lists the processes using the device, for the OOM message. It returns nil when that is
	// unknown (no NVML), and the message then says nothing about processes.
	Processes() []ProcessMemory

	// Malloc is cudaMalloc: a new segment of size bytes. It returns ErrOutOfMemory when the device
	// cannot provide it.
	Malloc(size uint64) (addr uint64, err error)
	// Free is cudaFree of a segment returned by Malloc.
	Free(addr uint64) error

	// ReserveAddressRange is cuMemAddressReserve: size bytes of virtual address space, no memory behind it.
	ReserveAddressRange(size uint64) (addr uint64, err error)
	// FreeAddressRange is cuMemAddressFree of a whole reservation.
	FreeAddressRange(addr, size uint64) error
	// CreatePhysical is cuMemCreate: size bytes of physical memory. It returns ErrOutOfMemory when the
	// device cannot provide them.
	CreatePhysical(size uint64) (PhysicalHandle, error)
	// ReleasePhysical is cuMemRelease.
	ReleasePhysical(h PhysicalHandle) error
	// Map is cuMemMap followed by cuMemSetAccess: back [addr, addr+size) of a reservation with h.
	Map(addr, size uint64, h PhysicalHandle) error
	// Unmap is cuMemUnmap of a range mapped by Map.
	Unmap(addr, size uint64) error
}
