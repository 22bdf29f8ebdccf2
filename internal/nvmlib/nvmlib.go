// Package nvmlib calls the NVIDIA driver's NVML library (libnvidia-ml.so.1) without cgo: it dlopens the
// library at Init and calls the dozen entry points tracer/nvml reads through ebitengine/purego. Its names
// follow NVML's and github.com/NVIDIA/go-nvml's.
//
// Why not go-nvml: it binds all of NVML through cgo, so building oomdbg from a fresh cache compiled its
// 16,000 lines of generated C wrappers (a minute and a half) and printed 147 lines of gcc warnings about
// NVML's deprecated functions before the TUI started. oomdbg needs a handful of calls, all of which take
// plain integers, buffers and pointers to flat structs: dlopen and purego serve them with no C compiler.
package nvmlib

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/ebitengine/purego"
)

// Return is an NVML return code (nvmlReturn_t). It is an error, so codes wrap and compare with errors.Is.
type Return int32

// The return codes oomdbg tells apart, from nvml.h.
const (
	SUCCESS                         Return = 0
	ERROR_UNINITIALIZED             Return = 1
	ERROR_INVALID_ARGUMENT          Return = 2
	ERROR_NOT_SUPPORTED             Return = 3
	ERROR_NO_PERMISSION             Return = 4
	ERROR_ALREADY_INITIALIZED       Return = 5
	ERROR_NOT_FOUND                 Return = 6
	ERROR_INSUFFICIENT_SIZE         Return = 7
	ERROR_INSUFFICIENT_POWER        Return = 8
	ERROR_DRIVER_NOT_LOADED         Return = 9
	ERROR_TIMEOUT                   Return = 10
	ERROR_IRQ_ISSUE                 Return = 11
	ERROR_LIBRARY_NOT_FOUND         Return = 12
	ERROR_FUNCTION_NOT_FOUND        Return = 13
	ERROR_CORRUPTED_INFOROM         Return = 14
	ERROR_GPU_IS_LOST               Return = 15
	ERROR_RESET_REQUIRED            Return = 16
	ERROR_OPERATING_SYSTEM          Return = 17
	ERROR_LIB_RM_VERSION_MISMATCH   Return = 18
	ERROR_IN_USE                    Return = 19
	ERROR_MEMORY                    Return = 20
	ERROR_NO_DATA                   Return = 21
	ERROR_VGPU_ECC_NOT_SUPPORTED    Return = 22
	ERROR_INSUFFICIENT_RESOURCES    Return = 23
	ERROR_FREQ_NOT_SUPPORTED        Return = 24
	ERROR_ARGUMENT_VERSION_MISMATCH Return = 25
	ERROR_DEPRECATED                Return = 26
	ERROR_NOT_READY                 Return = 27
	ERROR_GPU_NOT_FOUND             Return = 28
	ERROR_INVALID_STATE             Return = 29
	ERROR_UNKNOWN                   Return = 999
)

var names = map[Return]string{
	SUCCESS: "SUCCESS", ERROR_UNINITIALIZED: "ERROR_UNINITIALIZED", ERROR_INVALID_ARGUMENT: "ERROR_INVALID_ARGUMENT",
	ERROR_NOT_SUPPORTED: "ERROR_NOT_SUPPORTED", ERROR_NO_PERMISSION: "ERROR_NO_PERMISSION",
	ERROR_ALREADY_INITIALIZED: "ERROR_ALREADY_INITIALIZED", ERROR_NOT_FOUND: "ERROR_NOT_FOUND",
	ERROR_INSUFFICIENT_SIZE: "ERROR_INSUFFICIENT_SIZE", ERROR_INSUFFICIENT_POWER: "ERROR_INSUFFICIENT_POWER",
	ERROR_DRIVER_NOT_LOADED: "ERROR_DRIVER_NOT_LOADED", ERROR_TIMEOUT: "ERROR_TIMEOUT", ERROR_IRQ_ISSUE: "ERROR_IRQ_ISSUE",
	ERROR_LIBRARY_NOT_FOUND: "ERROR_LIBRARY_NOT_FOUND", ERROR_FUNCTION_NOT_FOUND: "ERROR_FUNCTION_NOT_FOUND",
	ERROR_CORRUPTED_INFOROM: "ERROR_CORRUPTED_INFOROM", ERROR_GPU_IS_LOST: "ERROR_GPU_IS_LOST",
	ERROR_RESET_REQUIRED: "ERROR_RESET_REQUIRED", ERROR_OPERATING_SYSTEM: "ERROR_OPERATING_SYSTEM",
	ERROR_LIB_RM_VERSION_MISMATCH: "ERROR_LIB_RM_VERSION_MISMATCH", ERROR_IN_USE: "ERROR_IN_USE",
	ERROR_MEMORY: "ERROR_MEMORY", ERROR_NO_DATA: "ERROR_NO_DATA", ERROR_VGPU_ECC_NOT_SUPPORTED: "ERROR_VGPU_ECC_NOT_SUPPORTED",
	ERROR_INSUFFICIENT_RESOURCES: "ERROR_INSUFFICIENT_RESOURCES", ERROR_FREQ_NOT_SUPPORTED: "ERROR_FREQ_NOT_SUPPORTED",
	ERROR_ARGUMENT_VERSION_MISMATCH: "ERROR_ARGUMENT_VERSION_MISMATCH", ERROR_DEPRECATED: "ERROR_DEPRECATED",
	ERROR_NOT_READY: "ERROR_NOT_READY", ERROR_GPU_NOT_FOUND: "ERROR_GPU_NOT_FOUND", ERROR_INVALID_STATE: "ERROR_INVALID_STATE",
	ERROR_UNKNOWN: "ERROR_UNKNOWN",
}

// Error is ErrorString(r).
func (r Return) Error() string { return ErrorString(r) }

// String is the code's name in nvml.h without its NVML_ prefix, e.g. "ERROR_GPU_IS_LOST".
func (r Return) String() string {
	if n, ok := names[r]; ok {
		return n
	}
	return "Return(" + strconv.Itoa(int(r)) + ")"
}

// loaded is the library Init loaded last, until its Shutdown, for ErrorString.
var loaded atomic.Pointer[library]

// ErrorString is NVML's description of r (nvmlErrorString) from the library loaded last and not shut down;
// without one, the code's name.
func ErrorString(r Return) string {
	if l := loaded.Load(); l != nil && l.errorString != nil {
		if p := l.errorString(r); p != nil {
			return goString(p, 256)
		}
	}
	return r.String()
}

// The structs NVML fills in, laid out as nvml.h declares them.
type (
	// Memory is nvmlMemory_t: Used includes the memory the driver reserves.
	Memory struct{ Total, Free, Used uint64 }
	// Memory_v2 is nvmlMemory_v2_t: Used excludes Reserved. Version must be set to Memory_v2Version.
	Memory_v2 struct {
		Version                     uint32
		Total, Reserved, Free, Used uint64
	}
	// Utilization is nvmlUtilization_t, in percent over the last sample period.
	Utilization struct{ Gpu, Memory uint32 }
	// ProcessInfo is nvmlProcessInfo_t as the _v3 process lists fill it.
	ProcessInfo struct {
		Pid               uint32
		UsedGpuMemory     uint64 // ^uint64(0) (NVML_VALUE_NOT_AVAILABLE) when the driver cannot say
		GpuInstanceId     uint32
		ComputeInstanceId uint32
	}
)

// Memory_v2Version is nvmlMemory_v2 (NVML_STRUCT_VERSION(Memory, 2)): the struct's size with the version in
// the top byte.
const Memory_v2Version = uint32(unsafe.Sizeof(Memory_v2{})) | 2<<24

// Interface is what oomdbg asks of NVML. New returns the real library; tests pass their own.
type Interface interface {
	// Init loads the library and initialises NVML (nvmlInit_v2); ERROR_LIBRARY_NOT_FOUND when it cannot
	// be loaded. Shutdown must follow only a successful Init.
	Init() Return
	Shutdown() Return
	SystemGetDriverVersion() (string, Return)
	DeviceGetCount() (int, Return)
	DeviceGetHandleByIndex(index int) (Device, Return)
	// LookupSymbol reports whether the loaded library has an entry point, as an error when it has not.
	LookupSymbol(name string) error
}

// Device is a GPU's handle.
type Device interface {
	GetName() (string, Return)
	GetUUID() (string, Return)
	GetMemoryInfo() (Memory, Return)
	GetMemoryInfo_v2() (Memory_v2, Return)
	GetUtilizationRates() (Utilization, Return)
	GetComputeRunningProcesses() ([]ProcessInfo, Return)
	GetGraphicsRunningProcesses() ([]ProcessInfo, Return)
}

// New returns the NVML library at path (a file name is looked up as dlopen does: ld.so.cache,
// LD_LIBRARY_PATH). Nothing is loaded until Init.
func New(path string) Interface { return &library{path: path} }

// library is NVML loaded with dlopen; its entry points are bound at Init.
type library struct {
	path   string
	mu     sync.Mutex
	handle uintptr

	init, shutdown   func() Return
	errorString      func(Return) *byte
	driverVersion    func(*byte, uint32) Return
	count            func(*uint32) Return
	handleByIndex    func(uint32, *uintptr) Return
	name, uuid       func(uintptr, *byte, uint32) Return
	memory           func(uintptr, *Memory) Return
	memoryV2         func(uintptr, *Memory_v2) Return
	utilization      func(uintptr, *Utilization) Return
	compute, graphic func(uintptr, *uint32, *ProcessInfo) Return
}

// The entry points Init binds, each with the variable it sets. Any of them may be missing from an old or
// partial driver: the call then returns ERROR_FUNCTION_NOT_FOUND, as go-nvml does.
func (l *library) entryPoints() map[string]any {
	return map[string]any{
		"nvmlInit_v2": &l.init, "nvmlShutdown": &l.shutdown, "nvmlErrorString": &l.errorString,
		"nvmlSystemGetDriverVersion": &l.driverVersion, "nvmlDeviceGetCount_v2": &l.count,
		"nvmlDeviceGetHandleByIndex_v2": &l.handleByIndex, "nvmlDeviceGetName": &l.name, "nvmlDeviceGetUUID": &l.uuid,
		"nvmlDeviceGetMemoryInfo": &l.memory, "nvmlDeviceGetMemoryInfo_v2": &l.memoryV2,
		"nvmlDeviceGetUtilizationRates":            &l.utilization,
		"nvmlDeviceGetComputeRunningProcesses_v3":  &l.compute,
		"nvmlDeviceGetGraphicsRunningProcesses_v3": &l.graphic,
	}
}

func (l *library) Init() Return {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.handle == 0 {
		h, err := purego.Dlopen(l.path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
		if err != nil {
			return ERROR_LIBRARY_NOT_FOUND
		}
		l.handle = h
		for name, fn := range l.entryPoints() {
			if sym, err := purego.Dlsym(h, name); err == nil {
				purego.RegisterFunc(fn, sym)
			}
		}
	}
	loaded.Store(l)
	if l.init == nil {
		return ERROR_FUNCTION_NOT_FOUND
	}
	return l.init()
}

// Shutdown shuts NVML down. The library stays mapped (a later Init binds to it again), but ErrorString no
// longer asks it.
func (l *library) Shutdown() Return {
	if l.shutdown == nil {
		return ERROR_UNINITIALIZED
	}
	ret := l.shutdown()
	if ret == SUCCESS {
		loaded.CompareAndSwap(l, nil)
	}
	return ret
}

func (l *library) LookupSymbol(name string) error {
	if l.handle == 0 {
		return errors.New("nvmlib: the library is not loaded")
	}
	if _, err := purego.Dlsym(l.handle, name); err != nil {
		return fmt.Errorf("nvmlib: %s: %w", name, err)
	}
	return nil
}

// Buffer sizes from nvml.h.
const (
	systemDriverVersionBufferSize = 80
	deviceNameBufferSize          = 96
	deviceUUIDBufferSize          = 96
)

func (l *library) SystemGetDriverVersion() (string, Return) {
	if l.driverVersion == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return readString(systemDriverVersionBufferSize, l.driverVersion)
}

func (l *library) DeviceGetCount() (int, Return) {
	if l.count == nil {
		return 0, ERROR_FUNCTION_NOT_FOUND
	}
	var n uint32
	ret := l.count(&n)
	return int(n), ret
}

func (l *library) DeviceGetHandleByIndex(index int) (Device, Return) {
	if l.handleByIndex == nil {
		return nil, ERROR_FUNCTION_NOT_FOUND
	}
	if index < 0 || int64(index) > int64(^uint32(0)) {
		return nil, ERROR_INVALID_ARGUMENT
	}
	var h uintptr
	if ret := l.handleByIndex(uint32(index), &h); ret != SUCCESS {
		return nil, ret
	}
	return device{l, h}, SUCCESS
}

// device is an nvmlDevice_t of a loaded library.
type device struct {
	l *library
	h uintptr
}

func (d device) GetName() (string, Return) {
	if d.l.name == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return readString(deviceNameBufferSize, func(b *byte, n uint32) Return { return d.l.name(d.h, b, n) })
}

func (d device) GetUUID() (string, Return) {
	if d.l.uuid == nil {
		return "", ERROR_FUNCTION_NOT_FOUND
	}
	return readString(deviceUUIDBufferSize, func(b *byte, n uint32) Return { return d.l.uuid(d.h, b, n) })
}

func (d device) GetMemoryInfo() (Memory, Return) {
	var m Memory
	if d.l.memory == nil {
		return m, ERROR_FUNCTION_NOT_FOUND
	}
	return m, d.l.memory(d.h, &m)
}

func (d device) GetMemoryInfo_v2() (Memory_v2, Return) {
	m := Memory_v2{Version: Memory_v2Version}
	if d.l.memoryV2 == nil {
		return m, ERROR_FUNCTION_NOT_FOUND
	}
	return m, d.l.memoryV2(d.h, &m)
}

func (d device) GetUtilizationRates() (Utilization, Return) {
	var u Utilization
	if d.l.utilization == nil {
		return u, ERROR_FUNCTION_NOT_FOUND
	}
	return u, d.l.utilization(d.h, &u)
}

func (d device) GetComputeRunningProcesses() ([]ProcessInfo, Return) {
	return processes(d.h, d.l.compute)
}

func (d device) GetGraphicsRunningProcesses() ([]ProcessInfo, Return) {
	return processes(d.h, d.l.graphic)
}

// maxProcesses bounds the list a driver may ask room for, against a broken or hostile library.
const maxProcesses = 1 << 16

// processes calls a _v3 process list with growing room: NVML answers ERROR_INSUFFICIENT_SIZE with the count
// it needs.
func processes(h uintptr, list func(uintptr, *uint32, *ProcessInfo) Return) ([]ProcessInfo, Return) {
	if list == nil {
		return nil, ERROR_FUNCTION_NOT_FOUND
	}
	n := uint32(8)
	for {
		infos := make([]ProcessInfo, n)
		count := n
		ret := list(h, &count, &infos[0])
		switch {
		case ret == SUCCESS:
			return infos[:min(count, n)], SUCCESS
		case ret != ERROR_INSUFFICIENT_SIZE:
			return nil, ret
		case n >= maxProcesses:
			return nil, ERROR_INSUFFICIENT_SIZE
		}
		n = min(max(count, 2*n), maxProcesses)
	}
}

// readString calls fill with a buffer of n bytes and returns the NUL-terminated string it wrote.
func readString(n uint32, fill func(*byte, uint32) Return) (string, Return) {
	buf := make([]byte, n)
	ret := fill(&buf[0], n)
	if ret != SUCCESS {
		return "", ret
	}
	for i, c := range buf {
		if c == 0 {
			return string(buf[:i]), SUCCESS
		}
	}
	return string(buf), SUCCESS
}

// goString copies a NUL-terminated C string of at most max bytes.
func goString(p *byte, max int) string {
	var b []byte
	for i := 0; i < max; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}
