// Package nvmlibtest is a fake NVML for tests: a Server of Devices whose every call can be replaced and is
// counted. NewH100 sets it up like a DGX H100 (driver 550.54.15, NVIDIA H100 80GB HBM3 cards). The real
// library is tested against testdata/fakenvml in tracer/nvml, a fake libnvidia-ml built from C.
package nvmlibtest

import (
	"fmt"
	"sync"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// Config is what a Device is: its name and its memory in MiB.
type Config struct {
	Name     string
	MemoryMB uint64
}

// H100 is the H100 SXM5 80GB.
var H100 = Config{Name: "NVIDIA H100 80GB HBM3", MemoryMB: 81920}

// Server is an nvmlib.Interface. Each call goes to its Func; NewH100 sets them all to answer from the
// Server's fields, so that a test can replace or wrap one. A nil Func answers the same way.
type Server struct {
	Devices       []nvmlib.Device
	DriverVersion string

	InitFunc                   func() nvmlib.Return
	ShutdownFunc               func() nvmlib.Return
	DeviceGetCountFunc         func() (int, nvmlib.Return)
	DeviceGetHandleByIndexFunc func(int) (nvmlib.Device, nvmlib.Return)
	LookupSymbolFunc           func(string) error

	mu                           sync.Mutex
	inits, shutdowns, getHandles int
}

// NewH100 returns a server with n H100s, numbered from 0, each with the UUID UUID(i).
func NewH100(n int) *Server {
	s := &Server{DriverVersion: "550.54.15"}
	for i := range n {
		s.Devices = append(s.Devices, NewDevice(H100, i))
	}
	s.InitFunc = func() nvmlib.Return { return nvmlib.SUCCESS }
	s.ShutdownFunc = func() nvmlib.Return { return nvmlib.SUCCESS }
	s.DeviceGetCountFunc = func() (int, nvmlib.Return) { return len(s.Devices), nvmlib.SUCCESS }
	s.DeviceGetHandleByIndexFunc = s.handle
	s.LookupSymbolFunc = func(string) error { return nil }
	return s
}

// UUID is the UUID NewH100 gives device i.
func UUID(i int) string { return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i) }

func (s *Server) Init() nvmlib.Return {
	s.mu.Lock()
	s.inits++
	s.mu.Unlock()
	if s.InitFunc != nil {
		return s.InitFunc()
	}
	return nvmlib.SUCCESS
}

func (s *Server) Shutdown() nvmlib.Return {
	s.mu.Lock()
	s.shutdowns++
	s.mu.Unlock()
	if s.ShutdownFunc != nil {
		return s.ShutdownFunc()
	}
	return nvmlib.SUCCESS
}

func (s *Server) SystemGetDriverVersion() (string, nvmlib.Return) {
	return s.DriverVersion, nvmlib.SUCCESS
}

func (s *Server) DeviceGetCount() (int, nvmlib.Return) {
	if s.DeviceGetCountFunc != nil {
		return s.DeviceGetCountFunc()
	}
	return len(s.Devices), nvmlib.SUCCESS
}

func (s *Server) DeviceGetHandleByIndex(i int) (nvmlib.Device, nvmlib.Return) {
	s.mu.Lock()
	s.getHandles++
	s.mu.Unlock()
	if s.DeviceGetHandleByIndexFunc != nil {
		return s.DeviceGetHandleByIndexFunc(i)
	}
	return s.handle(i)
}

func (s *Server) handle(i int) (nvmlib.Device, nvmlib.Return) {
	if i < 0 || i >= len(s.Devices) {
		return nil, nvmlib.ERROR_INVALID_ARGUMENT
	}
	return s.Devices[i], nvmlib.SUCCESS
}

func (s *Server) LookupSymbol(name string) error {
	if s.LookupSymbolFunc != nil {
		return s.LookupSymbolFunc(name)
	}
	return nil
}

// InitCalls, ShutdownCalls and DeviceGetHandleByIndexCalls count the calls so far.
func (s *Server) InitCalls() int     { s.mu.Lock(); defer s.mu.Unlock(); return s.inits }
func (s *Server) ShutdownCalls() int { s.mu.Lock(); defer s.mu.Unlock(); return s.shutdowns }
func (s *Server) DeviceGetHandleByIndexCalls() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.getHandles
}

// Device is an nvmlib.Device. Each call goes to its Func; NewDevice sets them to answer from the Device's
// fields (its name, UUID and memory, utilisation not supported, no processes), and a nil Func answers the
// same way.
type Device struct {
	Config     Config
	UUID       string
	MemoryInfo nvmlib.Memory

	GetNameFunc                     func() (string, nvmlib.Return)
	GetUUIDFunc                     func() (string, nvmlib.Return)
	GetMemoryInfoFunc               func() (nvmlib.Memory, nvmlib.Return)
	GetMemoryInfo_v2Func            func() (nvmlib.Memory_v2, nvmlib.Return)
	GetUtilizationRatesFunc         func() (nvmlib.Utilization, nvmlib.Return)
	GetComputeRunningProcessesFunc  func() ([]nvmlib.ProcessInfo, nvmlib.Return)
	GetGraphicsRunningProcessesFunc func() ([]nvmlib.ProcessInfo, nvmlib.Return)

	mu        sync.Mutex
	memoryV2s int
}

// NewDevice returns device index of kind c, all its memory free.
func NewDevice(c Config, index int) *Device {
	total := c.MemoryMB << 20
	d := &Device{Config: c, UUID: UUID(index), MemoryInfo: nvmlib.Memory{Total: total, Free: total}}
	d.GetNameFunc = func() (string, nvmlib.Return) { return d.Config.Name, nvmlib.SUCCESS }
	d.GetUUIDFunc = func() (string, nvmlib.Return) { return d.UUID, nvmlib.SUCCESS }
	d.GetMemoryInfoFunc = func() (nvmlib.Memory, nvmlib.Return) { return d.MemoryInfo, nvmlib.SUCCESS }
	d.GetMemoryInfo_v2Func = d.memoryV2
	d.GetUtilizationRatesFunc = func() (nvmlib.Utilization, nvmlib.Return) { return nvmlib.Utilization{}, nvmlib.ERROR_NOT_SUPPORTED }
	d.GetComputeRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, nvmlib.SUCCESS }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, nvmlib.SUCCESS }
	return d
}

func (d *Device) GetName() (string, nvmlib.Return) {
	if d.GetNameFunc != nil {
		return d.GetNameFunc()
	}
	return d.Config.Name, nvmlib.SUCCESS
}

func (d *Device) GetUUID() (string, nvmlib.Return) {
	if d.GetUUIDFunc != nil {
		return d.GetUUIDFunc()
	}
	return d.UUID, nvmlib.SUCCESS
}

func (d *Device) GetMemoryInfo() (nvmlib.Memory, nvmlib.Return) {
	if d.GetMemoryInfoFunc != nil {
		return d.GetMemoryInfoFunc()
	}
	return d.MemoryInfo, nvmlib.SUCCESS
}

func (d *Device) GetMemoryInfo_v2() (nvmlib.Memory_v2, nvmlib.Return) {
	d.mu.Lock()
	d.memoryV2s++
	d.mu.Unlock()
	if d.GetMemoryInfo_v2Func != nil {
		return d.GetMemoryInfo_v2Func()
	}
	return d.memoryV2()
}

func (d *Device) memoryV2() (nvmlib.Memory_v2, nvmlib.Return) {
	m := d.MemoryInfo
	return nvmlib.Memory_v2{Version: nvmlib.Memory_v2Version, Total: m.Total, Free: m.Free, Used: m.Used}, nvmlib.SUCCESS
}

// GetMemoryInfo_v2Calls counts the calls of GetMemoryInfo_v2 so far.
func (d *Device) GetMemoryInfo_v2Calls() int { d.mu.Lock(); defer d.mu.Unlock(); return d.memoryV2s }

func (d *Device) GetUtilizationRates() (nvmlib.Utilization, nvmlib.Return) {
	if d.GetUtilizationRatesFunc != nil {
		return d.GetUtilizationRatesFunc()
	}
	return nvmlib.Utilization{}, nvmlib.ERROR_NOT_SUPPORTED
}

func (d *Device) GetComputeRunningProcesses() ([]nvmlib.ProcessInfo, nvmlib.Return) {
	if d.GetComputeRunningProcessesFunc != nil {
		return d.GetComputeRunningProcessesFunc()
	}
	return nil, nvmlib.SUCCESS
}

func (d *Device) GetGraphicsRunningProcesses() ([]nvmlib.ProcessInfo, nvmlib.Return) {
	if d.GetGraphicsRunningProcessesFunc != nil {
		return d.GetGraphicsRunningProcessesFunc()
	}
	return nil, nvmlib.SUCCESS
}
