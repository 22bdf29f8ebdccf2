package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/internal/nvmlib"
	"github.com/oomdbg/oomdbg/internal/nvmlib/nvmlibtest"
	"github.com/oomdbg/oomdbg/tracer/nvml"
)

const noDriverLine = "oomdbg: no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded); GPU readings are unavailable\n"

// runDevices runs `oomdbg devices args...` with opts passed to nvml.Open, and returns the exit code run would
// give (0 ok, 1 problem, 2 usage) and both outputs.
func runDevices(t *testing.T, args []string, opts ...nvml.Option) (code int, stdout, stderr string) {
	t.Helper()
	root := newRootCmd()
	if c, _, err := root.Find([]string{"devices"}); err == nil && c.Name() == "devices" {
		root.RemoveCommand(c) // replaced by one reading the given NVML
	}
	root.AddCommand(devicesCmd(opts...))
	var out, errOut bytes.Buffer
	root.SetArgs(append([]string{"devices"}, args...))
	root.SetOut(&out)
	root.SetErr(&errOut)
	err := root.Execute()
	var p *app.ProblemError
	switch {
	case err == nil:
		code = exitOK
	case errors.As(err, &p):
		code = exitProblem
	default:
		code = exitUsage
	}
	if err != nil {
		errOut.WriteString("oomdbg: " + err.Error() + "\n")
	}
	return code, out.String(), errOut.String()
}

// h100 is a fake DGX H100 with the readings the devices command asks for.
func h100(lost bool) *nvmlibtest.Server {
	s := nvmlibtest.NewH100(8)
	s.Devices = s.Devices[:2]
	for i, d := range s.Devices {
		d := d.(*nvmlibtest.Device)
		d.UUID = "GPU-00000000-0000-4000-8000-00000000000" + string(rune('0'+i))
		d.GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) {
			total := d.Config.MemoryMB << 20
			return nvmlib.Memory_v2{Total: total, Used: 10 << 30, Reserved: 512 << 20, Free: total - 10<<30 - 512<<20}, nvmlib.SUCCESS
		}
		d.GetUtilizationRatesFunc = func() (nvmlib.Utilization, nvmlib.Return) { return nvmlib.Utilization{Gpu: 50}, nvmlib.SUCCESS }
		d.GetComputeRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, nvmlib.SUCCESS }
		d.GetGraphicsRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, nvmlib.SUCCESS }
	}
	if lost {
		s.Devices[1].(*nvmlibtest.Device).GetNameFunc = func() (string, nvmlib.Return) { return "", nvmlib.ERROR_GPU_IS_LOST }
	}
	return s
}

func failingInit(ret nvmlib.Return) *nvmlibtest.Server {
	return &nvmlibtest.Server{InitFunc: func() nvmlib.Return { return ret }}
}

func TestDevicesCommand(t *testing.T) {
	procRoot := nvml.WithProcRoot(t.TempDir())
	tests := map[string]struct {
		args   []string
		opts   []nvml.Option
		code   int
		stdout []string // substrings stdout must contain; nil: stdout must be empty
		stderr string   // stderr, exactly
	}{
		// The machines of the project have no driver: this is the real library failing to load.
		"no driver": {code: exitOK, stderr: noDriverLine},
		"no driver, json": {args: []string{"--json"}, code: exitOK, stderr: noDriverLine,
			stdout: []string{`"driver": false`, `"devices": []`, `"error": "no NVIDIA driver found`}},
		"kernel driver not loaded": {opts: []nvml.Option{nvml.WithLibrary(failingInit(nvmlib.ERROR_DRIVER_NOT_LOADED))}, code: exitOK,
			stderr: "oomdbg: no NVIDIA driver loaded (libnvidia-ml.so.1 is installed but the kernel driver is not running); GPU readings are unavailable\n"},
		"dgx h100": {opts: []nvml.Option{nvml.WithLibrary(h100(false)), procRoot}, code: exitOK,
			stdout: []string{"NVIDIA driver 550.54.15, 2 GPUs", "GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-00000000-0000-4000-8000-000000000001)",
				"10.00 GiB used / 80.00 GiB (13%), 69.50 GiB free, 512.00 MiB reserved", "No running processes found."}},
		"dgx h100, json": {args: []string{"--json"}, opts: []nvml.Option{nvml.WithLibrary(h100(false)), procRoot}, code: exitOK,
			stdout: []string{`"driver": true`, `"total_bytes": 85899345920`, `"gpu_percent": 50`}},
		"lost gpu": {opts: []nvml.Option{nvml.WithLibrary(h100(true)), procRoot}, code: exitProblem,
			stdout: []string{"GPU 0: NVIDIA H100 80GB HBM3", "GPU 1: (name unknown)"},
			stderr: "oomdbg: nvml: read name of GPU 1: the GPU has fallen off the bus or is otherwise inaccessible (check dmesg for Xid errors)\n"},
		"driver/library mismatch": {opts: []nvml.Option{nvml.WithLibrary(failingInit(nvmlib.ERROR_LIB_RM_VERSION_MISMATCH))}, code: exitProblem,
			stderr: "oomdbg: nvml: initialise NVML: NVIDIA driver/library version mismatch (the driver was updated: reload the kernel module or reboot)\n"},
		"extra argument": {args: []string{"0"}, code: exitUsage,
			stderr: "oomdbg: unknown command \"0\" for \"oomdbg devices\"\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if tc.opts == nil && tc.code == exitOK {
				if s, err := nvml.Open(); err == nil {
					s.Close()
					t.Skip("an NVIDIA driver is installed here")
				}
			}
			code, stdout, stderr := runDevices(t, tc.args, tc.opts...)
			if code != tc.code {
				t.Errorf("exit code %d, want %d (stderr %q)", code, tc.code, stderr)
			}
			if stderr != tc.stderr {
				t.Errorf("stderr\n got %q\nwant %q", stderr, tc.stderr)
			}
			if tc.stdout == nil && stdout != "" {
				t.Errorf("stdout %q, want nothing", stdout)
			}
			for _, want := range tc.stdout {
				if !strings.Contains(stdout, want) {
					t.Errorf("stdout does not contain %q:\n%s", want, stdout)
				}
			}
			if len(tc.args) > 0 && tc.args[0] == "--json" && !json.Valid([]byte(stdout)) {
				t.Errorf("--json output is not JSON:\n%s", stdout)
			}
		})
	}
}

// `oomdbg devices` without a driver exits 0 with the one line.
func TestDevicesThroughRun(t *testing.T) {
	if s, err := nvml.Open(); err == nil {
		s.Close()
		t.Skip("an NVIDIA driver is installed here")
	}
	var out, errOut bytes.Buffer
	if code := run(context.Background(), []string{"devices"}, &out, &errOut); code != exitOK || out.Len() != 0 || errOut.String() != noDriverLine {
		t.Errorf("oomdbg devices: exit %d, stdout %q, stderr %q; want 0, nothing, %q", code, out.String(), errOut.String(), noDriverLine)
	}
}
