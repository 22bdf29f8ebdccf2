package device

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
)

// Kind is the kind of a device: what it does with the math.
type Kind string

// The device kinds.
const (
	Meta Kind = "meta" // no math: shapes and memory only
	CPU  Kind = "cpu"  // float32 math on the host; device memory simulated
	CUDA Kind = "cuda" // device memory on a real GPU (build tag cuda); math as on meta
)

// ParseKind returns the kind named s, which this build can open.
func ParseKind(s string) (Kind, error) {
	k, err := parseName(s)
	if err != nil {
		return "", err
	}
	return k, k.Available()
}

func parseName(s string) (Kind, error) {
	switch k := Kind(s); k {
	case Meta, CPU, CUDA:
		return k, nil
	}
	return "", fmt.Errorf("unknown device %q (want meta, cpu or cuda)", s)
}

// Available reports whether this build can open devices of kind k: cuda needs a build with -tags cuda.
func (k Kind) Available() error {
	switch k {
	case Meta, CPU:
		return nil
	case CUDA:
		if !cudaBuilt {
			return fmt.Errorf("device %q needs a build with -tags cuda", string(k))
		}
		return nil
	}
	_, err := parseName(string(k))
	return err
}

// MarshalText returns the kind's name.
func (k Kind) MarshalText() ([]byte, error) { return []byte(k), nil }

// UnmarshalText reads a kind's name: meta, cpu or cuda. A recording made on cuda reads back in any build;
// Available says whether this one can run it.
func (k *Kind) UnmarshalText(text []byte) error {
	v, err := parseName(string(text))
	if err != nil {
		return err
	}
	*k = v
	return nil
}

// The defaults of a simulated device: a 24 GiB card, of which the CUDA context, cuBLAS workspaces and the like
// take 512 MiB before the allocator gets anything (PyTorch processes typically show 300-600 MiB there).
const (
	DefaultCapacity       = 24 << 30
	DefaultContextReserve = 512 << 20
)

// Device is one device of a workload: its caching allocator, and whether it computes.
type Device struct {
	kind    Kind
	mem     allocator.Device
	alloc   *allocator.Allocator
	streams *Streams                 // nil for host memory
	host    *allocator.HostAllocator // a host device's memory (NewHost); nil on a GPU
}

// HostIndex is the device index of host memory: PyTorch's CPU device has no ordinal. It is the index
// recordings give the host device (snapshot.HostDeviceIndex, which this package is below).
const HostIndex = -1

// NewHost returns the host memory of a process whose GPU is of kind k (meta or cpu: whether ops on host
// tensors compute), allocated through h: where CPU offload keeps optimizer state, master weights and
// gradients. It has no caching allocator (Allocator returns nil) and no unified memory.
func NewHost(kind Kind, h *allocator.HostAllocator) *Device {
	return &Device{kind: kind, host: h}
}

// Host returns a host device's allocator, or nil for a GPU.
func (d *Device) Host() *allocator.HostAllocator { return d.host }

// New returns a device of kind whose segments come from mem, allocated through a caching allocator with
// settings cfg.
func New(kind Kind, mem allocator.Device, cfg allocator.Config) *Device {
	d := &Device{kind: kind, mem: mem, alloc: allocator.New(mem, cfg), streams: NewStreams()}
	d.alloc.SetStreams(d.streams)
	return d
}

// NewSimulated returns a meta or cpu device with a simulated GPU memory of capacity bytes, contextReserve of
// which the CUDA context takes.
func NewSimulated(kind Kind, index int, capacity, contextReserve uint64, cfg allocator.Config) *Device {
	return New(kind, allocator.NewSimDevice(index, capacity, contextReserve), cfg)
}

// Open returns a device of kind: a simulated GPU of capacity bytes (contextReserve of them taken by the CUDA
// context) for meta and cpu, or GPU ordinal through the CUDA driver for cuda (whose own capacity applies).
func Open(kind Kind, ordinal int, capacity, contextReserve uint64, cfg allocator.Config) (*Device, error) {
	if kind == CUDA {
		return newCUDA(ordinal, cfg)
	}
	return NewSimulated(kind, ordinal, capacity, contextReserve, cfg), nil
}

// Kind returns the device's kind.
func (d *Device) Kind() Kind { return d.kind }

// Index returns the device ordinal (HostIndex for host memory).
func (d *Device) Index() int {
	if d.host != nil {
		return HostIndex
	}
	return d.mem.Index()
}

// Computes reports whether ops compute values on this device (cpu), or only shapes and memory.
func (d *Device) Computes() bool { return d.kind == CPU }

// Allocator returns the device's caching allocator (nil for host memory).
func (d *Device) Allocator() *allocator.Allocator { return d.alloc }

// Memory returns where the allocator's segments come from.
func (d *Device) Memory() allocator.Device { return d.mem }

// Managed returns the device's unified memory (cudaMallocManaged), when it has one: the simulated devices
// do; the cuda device does not yet.
func (d *Device) Managed() (allocator.ManagedMemory, bool) {
	m, ok := d.mem.(allocator.ManagedMemory)
	return m, ok
}

// Malloc allocates bytes on the default stream through the caching allocator. The error of a failed
// allocation is the allocator's *allocator.OutOfMemoryError, whose text is PyTorch's OOM message.
func (d *Device) Malloc(bytes uint64) (uint64, error) { return d.MallocOn(bytes, DefaultStream) }

// MallocOn allocates bytes for use on stream, as an op running under torch.cuda.stream(stream) does: the
// block belongs to that stream's pools, and the op's kernel is queued there. Host memory has no streams.
func (d *Device) MallocOn(bytes uint64, stream int64) (uint64, error) {
	if d.host != nil {
		return d.host.Malloc(bytes, false)
	}
	addr, err := d.alloc.Malloc(bytes, stream)
	if err == nil {
		d.streams.Launch(stream)
	}
	return addr, err
}

// RecordStream marks the block at addr as used on stream (Tensor.record_stream): freeing it waits for that
// stream's work. It does nothing on a host device.
func (d *Device) RecordStream(addr uint64, stream int64) error {
	if d.host != nil {
		return nil
	}
	return d.alloc.RecordStream(addr, stream)
}

// Streams returns the progress model of the device's streams (nil for host memory).
func (d *Device) Streams() *Streams { return d.streams }

// MallocPinned allocates page-locked memory on a host device (through the caching host allocator); on a GPU
// it is Malloc.
func (d *Device) MallocPinned(bytes uint64) (uint64, error) {
	if d.host != nil {
		return d.host.Malloc(bytes, true)
	}
	return d.Malloc(bytes)
}

// Free returns a block to the caching allocator. Freeing what was not allocated is a bug in the runtime.
func (d *Device) Free(addr uint64) {
	free := d.alloc.Free
	if d.host != nil {
		free = d.host.Free
	}
	if err := free(addr); err != nil {
		panic(fmt.Sprintf("device: %v", err))
	}
}

func (d *Device) String() string { return fmt.Sprintf("%s:%d", d.kind, d.Index()) }
