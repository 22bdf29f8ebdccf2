package nvml

import (
	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// Device is one reading of a GPU: what `oomdbg devices` lists and the TUI's device pane shows.
type Device struct {
	Index       int          // NVML's index, nvidia-smi's (PCI bus order; CUDA's only with CUDA_DEVICE_ORDER=PCI_BUS_ID)
	Name        string       // e.g. "NVIDIA H100 80GB HBM3"
	UUID        string       // e.g. "GPU-6d6a1c39-...", stable across reboots; usable in CUDA_VISIBLE_DEVICES
	Memory      Memory       // zero if it could not be read (then Err says why)
	Utilization *Utilization // nil when the device does not report it (some MIG and vGPU setups)
	Processes   []Process    // largest first; nil when the device does not report them
	Err         error        // the first reading that failed, if any; the other fields hold what was read
}

// Memory is a device's memory as the driver accounts it, in bytes.
type Memory struct {
	Total uint64 // physical memory
	Used  uint64 // allocated; with Version 1 it also includes Reserved
	Free  uint64 // available for new allocations: comparable across versions
	// Reserved is set aside by the driver and firmware (Version 2 only; 0 with Version 1). It is why Total is
	// more than what any process can allocate.
	Reserved uint64
	// Version is the NVML query that produced the reading: 2 (nvmlDeviceGetMemoryInfo_v2, drivers r510 and
	// later), or 1 (nvmlDeviceGetMemoryInfo, whose Used includes the reserved memory).
	Version int
}

// Utilization is the share of the last sample period (1/6 s to 1 s, by product) in which the device was busy.
type Utilization struct {
	GPU    uint32 // percent of time one or more kernels ran
	Memory uint32 // percent of time device memory was read or written
}

// Devices reads every device. It fails only when the session is closed; a device that cannot be read is
// returned with its Err set, so one lost GPU does not hide the others.
func (s *Session) Devices() ([]Device, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return nil, ErrClosed
	}
	devs := make([]Device, len(s.devices))
	for i := range devs {
		devs[i] = s.read(i)
	}
	return devs, nil
}

// Device reads device index (see [Session.Devices]). The error is [ErrClosed] or an index out of range; other
// failures are in Device.Err.
func (s *Session) Device(index int) (Device, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		return Device{}, ErrClosed
	}
	if index < 0 || index >= len(s.devices) {
		return Device{}, &Error{Op: "select device", Device: index, Code: nvmlib.ERROR_INVALID_ARGUMENT}
	}
	return s.read(index), nil
}

// read reads device i; the caller holds s.mu for reading and has checked i.
func (s *Session) read(i int) Device {
	d := Device{Index: i}
	dev, err := s.device(i)
	if err != nil {
		d.Err = err
		return d
	}
	// fail keeps the first error: the one that explains the rest.
	fail := func(err error) {
		if d.Err == nil {
			d.Err = err
		}
	}
	var ret nvmlib.Return
	if d.Name, ret = dev.GetName(); ret != nvmlib.SUCCESS {
		fail(newError("read name", i, ret))
	}
	if d.UUID, ret = dev.GetUUID(); ret != nvmlib.SUCCESS {
		fail(newError("read UUID", i, ret))
	}
	if d.Memory, err = s.memory(dev, i); err != nil {
		fail(err)
	}
	if u, ret := dev.GetUtilizationRates(); ret == nvmlib.SUCCESS {
		d.Utilization = &Utilization{GPU: u.Gpu, Memory: u.Memory}
	} else if err := newError("read utilization", i, ret); !optional(err) {
		fail(err)
	}
	if d.Processes, err = s.processes(dev, i); err != nil {
		fail(err)
	}
	return d
}

// Sample reads the used and total memory of device index: one NVML call on a handle resolved at Open, cheap
// enough to poll every 100 ms or faster. Used follows [Memory.Used] (whether it includes the driver's
// reserved memory depends on Memory.Version, fixed for a session).
func (s *Session) Sample(index int) (used, total uint64, err error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	dev, err := s.device(index)
	if err != nil {
		return 0, 0, err
	}
	m, err := s.memory(dev, index)
	return m.Used, m.Total, err
}

// memory reads a device's memory with the newest query the driver has; the caller holds s.mu for reading.
func (s *Session) memory(dev nvmlib.Device, i int) (Memory, error) {
	if s.memoryV2 {
		m, ret := dev.GetMemoryInfo_v2()
		switch ret {
		case nvmlib.SUCCESS:
			return Memory{Total: m.Total, Used: m.Used, Free: m.Free, Reserved: m.Reserved, Version: 2}, nil
		case nvmlib.ERROR_NOT_SUPPORTED, nvmlib.ERROR_FUNCTION_NOT_FOUND, nvmlib.ERROR_ARGUMENT_VERSION_MISMATCH:
			// Exported but refused (vGPU guests, a struct version the driver does not know): use v1.
		default:
			return Memory{}, newError("read memory", i, ret)
		}
	}
	m, ret := dev.GetMemoryInfo()
	if ret != nvmlib.SUCCESS {
		return Memory{}, newError("read memory", i, ret)
	}
	return Memory{Total: m.Total, Used: m.Used, Free: m.Free, Version: 1}, nil
}
