package nvml

import (
	"errors"
	"path/filepath"
	"testing"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// No machine of the project has a driver: the default library must fail to load, and say so in one line.
func TestOpenWithoutDriver(t *testing.T) {
	s, err := Open()
	if err == nil {
		s.Close()
		t.Skip("an NVIDIA driver is installed here; the no-driver path cannot be exercised")
	}
	if !errors.Is(err, ErrNoDriver) {
		t.Fatalf("Open() = %v, want an error matching ErrNoDriver", err)
	}
	const want = "no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded); GPU readings are unavailable"
	if err.Error() != want {
		t.Errorf("Open() error\n got %q\nwant %q", err, want)
	}
	var nd *NoDriverError
	if !errors.As(err, &nd) || nd.Code != nvmlib.ERROR_LIBRARY_NOT_FOUND || nd.Library != DefaultLibrary {
		t.Errorf("Open() error = %#v, want a *NoDriverError for %s with ERROR_LIBRARY_NOT_FOUND", err, DefaultLibrary)
	}
}

func TestOpenWithLibraryPathMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "libnvidia-ml.so.1")
	_, err := Open(WithLibraryPath(path))
	want := "no NVIDIA driver found (" + path + " could not be loaded); GPU readings are unavailable"
	if !errors.Is(err, ErrNoDriver) || err.Error() != want {
		t.Fatalf("Open(WithLibraryPath(missing)) = %v, want %q", err, want)
	}
}

// A failed Init must never be followed by Shutdown, whatever the reason it failed.
func TestOpenFailedInitNeverShutsDown(t *testing.T) {
	tests := map[string]struct {
		ret      nvmlib.Return
		noDriver bool
		msg      string
	}{
		"library missing": {nvmlib.ERROR_LIBRARY_NOT_FOUND, true,
			"no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded); GPU readings are unavailable"},
		"kernel driver not loaded": {nvmlib.ERROR_DRIVER_NOT_LOADED, true,
			"no NVIDIA driver loaded (libnvidia-ml.so.1 is installed but the kernel driver is not running); GPU readings are unavailable"},
		"no permission": {nvmlib.ERROR_NO_PERMISSION, false,
			"nvml: initialise NVML: permission denied (the device may be restricted to another user or cgroup)"},
		"version mismatch": {nvmlib.ERROR_LIB_RM_VERSION_MISMATCH, false,
			"nvml: initialise NVML: NVIDIA driver/library version mismatch (the driver was updated: reload the kernel module or reboot)"},
		"unknown": {nvmlib.ERROR_UNKNOWN, false, "nvml: initialise NVML: ERROR_UNKNOWN"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			lib := failingInit(tc.ret)
			s, err := Open(WithLibrary(lib))
			if s != nil || err == nil {
				t.Fatalf("Open() = %v, %v; want an error", s, err)
			}
			if got := lib.InitCalls(); got != 1 {
				t.Errorf("Init called %d times, want 1", got)
			}
			if got := lib.ShutdownCalls(); got != 0 {
				t.Errorf("Shutdown called %d times after a failed Init, want 0", got)
			}
			if errors.Is(err, ErrNoDriver) != tc.noDriver {
				t.Errorf("errors.Is(%v, ErrNoDriver) = %v, want %v", err, !tc.noDriver, tc.noDriver)
			}
			if !errors.Is(err, tc.ret) {
				t.Errorf("errors.Is(%v, %d) = false: the NVML code is lost", err, tc.ret)
			}
			if err.Error() != tc.msg {
				t.Errorf("error\n got %q\nwant %q", err, tc.msg)
			}
		})
	}
}

// Once Init has succeeded, a failure later in Open pairs it with exactly one Shutdown.
func TestOpenFailureAfterInitShutsDown(t *testing.T) {
	lib := newH100(t, gpuState{})
	lib.DeviceGetCountFunc = func() (int, nvmlib.Return) { return 0, nvmlib.ERROR_UNKNOWN }
	_, err := Open(WithLibrary(lib))
	var e *Error
	if !errors.As(err, &e) || e.Op != "count devices" || e.Code != nvmlib.ERROR_UNKNOWN {
		t.Fatalf("Open() = %v, want a count-devices *Error", err)
	}
	if got := lib.ShutdownCalls(); got != 1 {
		t.Errorf("Shutdown called %d times, want 1", got)
	}
}

func TestCloseIsIdempotentAndFinal(t *testing.T) {
	lib := newH100(t, gpuState{used: gib})
	s, err := Open(WithLibrary(lib))
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if err := s.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
	}
	if got := lib.ShutdownCalls(); got != 1 {
		t.Errorf("Shutdown called %d times for 3 Close calls, want 1", got)
	}
	if _, _, err := s.Sample(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Sample after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Devices(); !errors.Is(err, ErrClosed) {
		t.Errorf("Devices after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Device(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Device after Close = %v, want ErrClosed", err)
	}
	if _, err := s.Processes(0); !errors.Is(err, ErrClosed) {
		t.Errorf("Processes after Close = %v, want ErrClosed", err)
	}
}

func TestSessionFacts(t *testing.T) {
	s := openMock(t, newH100(t, gpuState{}, gpuState{}, gpuState{}))
	if got, want := s.DriverVersion(), "550.54.15"; got != want {
		t.Errorf("DriverVersion() = %q, want %q (the DGX H100 mock's)", got, want)
	}
	if got := s.Count(); got != 3 {
		t.Errorf("Count() = %d, want 3", got)
	}
	if got := openMock(t, newH100(t, make([]gpuState, 8)...)).Count(); got != 8 {
		t.Errorf("Count() of a full DGX H100 = %d, want 8", got)
	}
}

func TestErrorMessages(t *testing.T) {
	tests := map[string]struct {
		err  error
		want string
	}{
		"device":        {&Error{Op: "read memory", Device: 3, Code: nvmlib.ERROR_GPU_IS_LOST}, "nvml: read memory of GPU 3: the GPU has fallen off the bus or is otherwise inaccessible (check dmesg for Xid errors)"},
		"no device":     {&Error{Op: "count devices", Device: -1, Code: nvmlib.ERROR_UNINITIALIZED}, "nvml: count devices: NVML is not initialized"},
		"nvml's string": {&Error{Op: "x", Device: -1, Code: nvmlib.ERROR_IN_USE}, "nvml: x: " + nvmlib.ErrorString(nvmlib.ERROR_IN_USE)},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.err.Error(); got != tc.want {
				t.Errorf("Error()\n got %q\nwant %q", got, tc.want)
			}
		})
	}
}
