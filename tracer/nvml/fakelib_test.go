package nvml

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// The readings of testdata/fakenvml/fakenvml.c, from its device table.
var (
	fakeTotal    = 80 * gib
	fakeReserved = 512 * mib
	fakeUsed     = [2]uint64{12 * gib, 1*gib + 300*mib}
	fakeUUID     = [2]string{"GPU-fa4e0000-0000-4000-8000-000000000000", "GPU-fa4e0000-0000-4000-8000-000000000001"}
)

const (
	fakeHiddenPID         = 4194309 // above any pid_max: never in /proc
	fakeHiddenGraphicsPID = 4194310
)

// buildFakeNVML compiles testdata/fakenvml into dir as libnvidia-ml.so.1, or skips the test without a C compiler.
func buildFakeNVML(t testing.TB, dir string) string {
	t.Helper()
	cc := os.Getenv("CC")
	if cc == "" {
		cc = "gcc"
	}
	if _, err := exec.LookPath(cc); err != nil {
		t.Skipf("no C compiler (%s) to build the fake libnvidia-ml: %v", cc, err)
	}
	lib := filepath.Join(dir, "libnvidia-ml.so.1")
	// No soname: a later dlopen("libnvidia-ml.so.1") by name must not find the fake.
	cmd := exec.Command(cc, "-shared", "-fPIC", "-Wall", "-Werror", "-o", lib,
		filepath.Join("testdata", "fakenvml", "fakenvml.c"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the fake libnvidia-ml: %v\n%s", err, out)
	}
	return lib
}

// The real binding: nvmlib dlopens a fake libnvidia-ml built from C, resolves its versioned symbols and calls
// into it, so every conversion between NVML's C structs and oomdbg's readings is exercised.
func TestFakeLibrary(t *testing.T) {
	dir := t.TempDir()
	lib := buildFakeNVML(t, dir)
	calls := filepath.Join(dir, "calls.log")
	t.Setenv("FAKENVML_LOG", calls)
	logged := func(t *testing.T) string {
		t.Helper()
		b, err := os.ReadFile(calls)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			t.Fatal(err)
		}
		os.Remove(calls)
		return string(b)
	}

	// Library present, kernel driver absent: the most common broken GPU box.
	t.Run("driver not loaded", func(t *testing.T) {
		t.Setenv("FAKENVML_INIT_RESULT", "9") // NVML_ERROR_DRIVER_NOT_LOADED
		_, err := Open(WithLibraryPath(lib))
		if !errors.Is(err, ErrNoDriver) || !errors.Is(err, nvmlib.ERROR_DRIVER_NOT_LOADED) {
			t.Fatalf("Open = %v, want ErrNoDriver with ERROR_DRIVER_NOT_LOADED", err)
		}
		want := "no NVIDIA driver loaded (" + lib + " is installed but the kernel driver is not running); GPU readings are unavailable"
		if err.Error() != want {
			t.Errorf("error\n got %q\nwant %q", err, want)
		}
		if got := logged(t); got != "nvmlInit_v2 9\n" {
			t.Errorf("calls into the library: %q; want only the failed nvmlInit_v2, never nvmlShutdown", got)
		}
	})

	t.Run("readings", func(t *testing.T) {
		s, err := Open(WithLibraryPath(lib))
		if err != nil {
			t.Fatalf("Open: %v", err)
		}
		defer func() {
			if err := s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
			if got := logged(t); got != "nvmlInit_v2 0\nnvmlShutdown 0\n" {
				t.Errorf("calls into the library: %q; want one nvmlInit_v2 and its nvmlShutdown", got)
			}
		}()
		if got := s.DriverVersion(); got != "999.99.01" {
			t.Errorf("DriverVersion() = %q, want the fake's 999.99.01", got)
		}
		devs, err := s.Devices()
		if err != nil {
			t.Fatal(err)
		}
		if len(devs) != 2 {
			t.Fatalf("%d devices, want the fake's 2", len(devs))
		}
		self := uint32(os.Getpid())
		selfName, selfVisible := s.procs.name(self) // visible unless this test runs in a container's PID namespace
		want := []Device{
			{Index: 0, Name: "Fake GPU 80GB", UUID: fakeUUID[0],
				Memory: Memory{Total: fakeTotal, Used: fakeUsed[0], Reserved: fakeReserved,
					Free: fakeTotal - fakeReserved - fakeUsed[0], Version: 2},
				Utilization: &Utilization{GPU: 87, Memory: 41},
				Processes: []Process{
					{PID: self, Used: 8 * gib, UsedKnown: true, Type: Compute, Visible: selfVisible, Name: selfName},
					{PID: fakeHiddenPID, Used: 2 * gib, UsedKnown: true, Type: Compute | Graphics},
				}},
			{Index: 1, Name: "Fake GPU 80GB", UUID: fakeUUID[1],
				Memory: Memory{Total: fakeTotal, Used: fakeUsed[1], Reserved: fakeReserved,
					Free: fakeTotal - fakeReserved - fakeUsed[1], Version: 2},
				Utilization: nil, // the fake answers NVML_ERROR_NOT_SUPPORTED
				Processes:   []Process{{PID: fakeHiddenGraphicsPID, Type: Graphics}}},
		}
		for i := range want {
			if !reflect.DeepEqual(devs[i], want[i]) {
				t.Errorf("device %d\n got %+v\nwant %+v", i, devs[i], want[i])
			}
		}
		if selfVisible && !strings.Contains(selfName, filepath.Base(os.Args[0])) {
			t.Errorf("this process is named %q, want its command line (%s ...)", selfName, os.Args[0])
		}

		for i := range 2 {
			used, total, err := s.Sample(i)
			if err != nil || used != fakeUsed[i] || total != fakeTotal {
				t.Errorf("Sample(%d) = %d, %d, %v; want %d, %d", i, used, total, err, fakeUsed[i], fakeTotal)
			}
		}
		if _, _, err := s.Sample(2); !errors.Is(err, nvmlib.ERROR_INVALID_ARGUMENT) {
			t.Errorf("Sample(2) = %v, want ERROR_INVALID_ARGUMENT", err)
		}
		// NVML's own wording for codes oomdbg does not rephrase comes from the loaded library.
		if got := describe(nvmlib.ERROR_INSUFFICIENT_SIZE); got != "Insufficient Size" {
			t.Errorf("describe(ERROR_INSUFFICIENT_SIZE) = %q, want the fake's nvmlErrorString", got)
		}
	})

	// A later session in the same process must work as the first did.
	t.Run("reopen", func(t *testing.T) {
		for range 2 {
			s, err := Open(WithLibraryPath(lib))
			if err != nil {
				t.Fatalf("Open: %v", err)
			}
			if used, _, err := s.Sample(1); err != nil || used != fakeUsed[1] {
				t.Errorf("Sample(1) = %d, %v; want %d", used, err, fakeUsed[1])
			}
			if err := s.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
		}
		logged(t)
	})
}

// Sample through the real binding: the cost a Sampler pays per reading, the call into the library included.
func BenchmarkSampleFakeLibrary(b *testing.B) {
	lib := buildFakeNVML(b, b.TempDir())
	s, err := Open(WithLibraryPath(lib))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.ReportAllocs()
	for b.Loop() {
		if _, _, err := s.Sample(0); err != nil {
			b.Fatal(err)
		}
	}
}
