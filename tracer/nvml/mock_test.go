package nvml

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
	"github.com/oomdbg/oomdbg/internal/nvmlib/nvmlibtest"
)

const (
	kib = uint64(1) << 10
	mib = uint64(1) << 20
	gib = uint64(1) << 30

	// h100Total is the memory of the H100 SXM5 80GB: 81920 MiB.
	h100Total = 80 * gib
	// noID is NVML's gpuInstanceId/computeInstanceId outside MIG.
	noID = ^uint32(0)
)

// mockDevice is a fake device: settable readings and call counts.
type mockDevice = nvmlibtest.Device

// gpuState is what a mocked device reports.
type gpuState struct {
	used, reserved    uint64               // v2 meanings; free is the rest of h100Total
	util              *nvmlib.Utilization  // nil: utilization not supported
	compute, graphics []nvmlib.ProcessInfo // processes, as NVML lists them
	lost              bool                 // every reading fails with GPU_IS_LOST
}

func proc(pid uint32, used uint64) nvmlib.ProcessInfo {
	return nvmlib.ProcessInfo{Pid: pid, UsedGpuMemory: used, GpuInstanceId: noID, ComputeInstanceId: noID}
}

// uuidOf is the UUID the mocked device i reports; the mock's own are random.
func uuidOf(i int) string { return fmt.Sprintf("GPU-00000000-0000-4000-8000-%012d", i) }

// newH100 returns a fake DGX H100 with one device per state, each wired to report it.
func newH100(t *testing.T, gpus ...gpuState) *nvmlibtest.Server {
	t.Helper()
	s := nvmlibtest.NewH100(8)
	if len(gpus) > len(s.Devices) {
		t.Fatalf("the DGX H100 mock has %d devices, not %d", len(s.Devices), len(gpus))
	}
	s.Devices = s.Devices[:len(gpus)]
	for i, g := range gpus {
		configure(s.Devices[i].(*mockDevice), i, g)
	}
	return s
}

func configure(d *mockDevice, i int, g gpuState) {
	d.UUID = uuidOf(i)
	total := d.Config.MemoryMB * mib
	d.MemoryInfo = nvmlib.Memory{Total: total, Used: g.used + g.reserved, Free: total - g.used - g.reserved}
	d.GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) {
		return nvmlib.Memory_v2{Total: total, Reserved: g.reserved, Used: g.used, Free: total - g.used - g.reserved}, nvmlib.SUCCESS
	}
	d.GetUtilizationRatesFunc = func() (nvmlib.Utilization, nvmlib.Return) {
		if g.util == nil {
			return nvmlib.Utilization{}, nvmlib.ERROR_NOT_SUPPORTED
		}
		return *g.util, nvmlib.SUCCESS
	}
	d.GetComputeRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return g.compute, nvmlib.SUCCESS }
	d.GetGraphicsRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return g.graphics, nvmlib.SUCCESS }
	if g.lost {
		lost := nvmlib.ERROR_GPU_IS_LOST
		d.GetNameFunc = func() (string, nvmlib.Return) { return "", lost }
		d.GetUUIDFunc = func() (string, nvmlib.Return) { return "", lost }
		d.GetMemoryInfoFunc = func() (nvmlib.Memory, nvmlib.Return) { return nvmlib.Memory{}, lost }
		d.GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) { return nvmlib.Memory_v2{}, lost }
		d.GetUtilizationRatesFunc = func() (nvmlib.Utilization, nvmlib.Return) { return nvmlib.Utilization{}, lost }
		d.GetComputeRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, lost }
		d.GetGraphicsRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, lost }
	}
}

// withoutMemoryV2 makes the server look like a driver older than r510, without nvmlDeviceGetMemoryInfo_v2.
func withoutMemoryV2(s *nvmlibtest.Server) {
	s.LookupSymbolFunc = func(name string) error {
		if name == "nvmlDeviceGetMemoryInfo_v2" {
			return errors.New("symbol not found")
		}
		return nil
	}
}

// fakeProcess is a process in a fake procfs.
type fakeProcess struct {
	cmdline string // NUL-separated arguments, as in /proc/<pid>/cmdline
	comm    string
}

// fakeProcRoot writes a procfs-like tree with the given processes and returns its root.
func fakeProcRoot(t *testing.T, procs map[uint32]fakeProcess) string {
	t.Helper()
	root := t.TempDir()
	for pid, p := range procs {
		dir := filepath.Join(root, strconv.FormatUint(uint64(pid), 10))
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for name, content := range map[string]string{"cmdline": p.cmdline, "comm": p.comm + "\n"} {
			if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return root
}

// openMock opens a session on lib, failing the test on error and closing the session at its end.
func openMock(t *testing.T, lib nvmlib.Interface, opts ...Option) *Session {
	t.Helper()
	s, err := Open(append([]Option{WithLibrary(lib)}, opts...)...)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// failingInit is a bare NVML mock whose Init returns ret and whose Shutdown only records that it was called.
func failingInit(ret nvmlib.Return) *nvmlibtest.Server {
	return &nvmlibtest.Server{
		InitFunc:     func() nvmlib.Return { return ret },
		ShutdownFunc: func() nvmlib.Return { return nvmlib.SUCCESS },
	}
}
