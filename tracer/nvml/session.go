package nvml

import (
	"errors"
	"sync"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// DefaultLibrary is the NVML library loaded unless told otherwise, found through the dynamic linker's search
// path (ld.so.cache, LD_LIBRARY_PATH).
const DefaultLibrary = "libnvidia-ml.so.1"

// Option configures [Open].
type Option func(*options)

type options struct {
	path     string           // library to dlopen; "" means DefaultLibrary
	lib      nvmlib.Interface // a binding to use as is (mocks); overrides path
	procRoot string           // where procfs is mounted; "" means /proc
}

// WithLibraryPath loads NVML from path instead of [DefaultLibrary], e.g. a driver installed outside the
// linker's search path. A path without a slash is searched for like DefaultLibrary.
func WithLibraryPath(path string) Option {
	return func(o *options) { o.path = path }
}

// WithLibrary makes the session use lib, an NVML binding such as a test's fake, instead of loading the
// driver's library.
func WithLibrary(lib nvmlib.Interface) Option {
	return func(o *options) { o.lib = lib }
}

// WithProcRoot names where procfs is mounted for looking up the processes NVML reports (default /proc). NVML
// reports host PIDs, so inside a container pass the host's procfs mounted read-only, e.g. /host/proc; the
// PIDs under it are then trusted to be host PIDs.
func WithProcRoot(dir string) Option {
	return func(o *options) { o.procRoot = dir }
}

// Session is an open connection to NVML. Its methods are safe for concurrent use; after [Session.Close] they
// return [ErrClosed] instead of calling into an unloaded library.
//
// Open one session per process and keep it: NVML's initialisation probes every GPU and takes a noticeable
// fraction of a second on large machines.
type Session struct {
	mu     sync.RWMutex // held for reading around every NVML call, for writing by Close
	lib    nvmlib.Interface
	closed bool

	driverVersion string
	devices       []handle // by index, resolved at Open
	memoryV2      bool     // the driver has nvmlDeviceGetMemoryInfo_v2
	procs         procLookup
}

// handle is a device handle, or the error NVML gave instead of one (e.g. a GPU lost since boot).
type handle struct {
	dev nvmlib.Device
	err error
}

// Open initialises NVML and resolves the devices. Without an NVIDIA driver it returns a *[NoDriverError]
// (errors.Is(err, ErrNoDriver)); other failures are *[Error]s.
func Open(opts ...Option) (*Session, error) {
	o := options{}
	for _, opt := range opts {
		opt(&o)
	}
	lib, library := o.lib, o.path
	if library == "" {
		library = DefaultLibrary
	}
	if lib == nil {
		lib = nvmlib.New(library)
	}

	// A failed Init leaves NVML half set up; Shutdown after it misbehaves, so return at once.
	switch ret := lib.Init(); ret {
	case nvmlib.SUCCESS:
	case nvmlib.ERROR_LIBRARY_NOT_FOUND, nvmlib.ERROR_DRIVER_NOT_LOADED:
		return nil, &NoDriverError{Library: library, Code: ret}
	default:
		return nil, &Error{Op: "initialise NVML", Device: -1, Code: ret}
	}

	s := &Session{lib: lib, procs: newProcLookup(o.procRoot)}
	if err := s.resolve(); err != nil {
		_ = lib.Shutdown() // Init succeeded, so this Shutdown is its pair
		return nil, err
	}
	return s, nil
}

// resolve reads what does not change while the session is open: the driver version, the device handles and
// which versions of the memory query the driver offers.
func (s *Session) resolve() error {
	if v, ret := s.lib.SystemGetDriverVersion(); ret == nvmlib.SUCCESS {
		s.driverVersion = v
	}
	n, ret := s.lib.DeviceGetCount()
	if ret != nvmlib.SUCCESS {
		return newError("count devices", -1, ret)
	}
	s.devices = make([]handle, n)
	for i := range s.devices {
		dev, ret := s.lib.DeviceGetHandleByIndex(i)
		s.devices[i] = handle{dev: dev, err: newError("get handle", i, ret)}
	}
	// Drivers before r510 lack nvmlDeviceGetMemoryInfo_v2.
	s.memoryV2 = s.lib.LookupSymbol("nvmlDeviceGetMemoryInfo_v2") == nil
	return nil
}

// Close shuts NVML down. It is safe to call more than once; readings after it return [ErrClosed].
func (s *Session) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	return newError("shut down NVML", -1, s.lib.Shutdown())
}

// DriverVersion is the NVIDIA driver's version, e.g. "550.54.15", or "" if the driver did not say.
func (s *Session) DriverVersion() string { return s.driverVersion }

// Count is the number of devices NVML reports, including any it could not open.
func (s *Session) Count() int { return len(s.devices) }

// device returns the handle of device index; the caller holds s.mu for reading.
func (s *Session) device(index int) (nvmlib.Device, error) {
	if s.closed {
		return nil, ErrClosed
	}
	if index < 0 || index >= len(s.devices) {
		return nil, &Error{Op: "select device", Device: index, Code: nvmlib.ERROR_INVALID_ARGUMENT}
	}
	h := s.devices[index]
	return h.dev, h.err
}

// optional reports whether err only says that a device does not offer a reading, which is then left out rather
// than reported as a failure.
func optional(err error) bool {
	return errors.Is(err, nvmlib.ERROR_NOT_SUPPORTED) || errors.Is(err, nvmlib.ERROR_FUNCTION_NOT_FOUND)
}
