package nvml

import (
	"errors"
	"reflect"
	"testing"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// Every reading `oomdbg devices` and the TUI's device pane show, from a fake DGX H100.
func TestDevicesDGXH100(t *testing.T) {
	const training, hidden = 4242, 4194309
	gpus := []gpuState{
		0: {used: 61*gib + 300*mib, reserved: 512 * mib, util: &nvmlib.Utilization{Gpu: 97, Memory: 64},
			compute: []nvmlib.ProcessInfo{proc(training, 61*gib)}},
		1: {reserved: 512 * mib, util: &nvmlib.Utilization{}},
		2: {used: 20 * gib, reserved: 512 * mib, util: nil, // utilization not supported
			compute: []nvmlib.ProcessInfo{proc(hidden, 20*gib)}},
		3: {lost: true},
	}
	s := openMock(t, newH100(t, gpus...),
		WithProcRoot(fakeProcRoot(t, map[uint32]fakeProcess{training: {cmdline: "python\x00train.py\x00", comm: "python"}})))

	devs, err := s.Devices()
	if err != nil {
		t.Fatalf("Devices: %v", err)
	}
	if len(devs) != len(gpus) {
		t.Fatalf("Devices() returned %d devices, want %d", len(devs), len(gpus))
	}
	const name = "NVIDIA H100 80GB HBM3" // what nvidia-smi shows for an H100 SXM5 80GB
	tests := map[string]struct {
		index int
		want  Device
	}{
		"training": {0, Device{Index: 0, Name: name, UUID: uuidOf(0),
			Memory:      Memory{Total: h100Total, Used: 61*gib + 300*mib, Free: h100Total - 61*gib - 812*mib, Reserved: 512 * mib, Version: 2},
			Utilization: &Utilization{GPU: 97, Memory: 64},
			Processes:   []Process{{PID: training, Used: 61 * gib, UsedKnown: true, Type: Compute, Visible: true, Name: "python train.py"}}}},
		"idle": {1, Device{Index: 1, Name: name, UUID: uuidOf(1),
			Memory:      Memory{Total: h100Total, Free: h100Total - 512*mib, Reserved: 512 * mib, Version: 2},
			Utilization: &Utilization{},
			Processes:   []Process{}}},
		"host PID, no utilization": {2, Device{Index: 2, Name: name, UUID: uuidOf(2),
			Memory:    Memory{Total: h100Total, Used: 20 * gib, Free: h100Total - 20*gib - 512*mib, Reserved: 512 * mib, Version: 2},
			Processes: []Process{{PID: hidden, Used: 20 * gib, UsedKnown: true, Type: Compute}}}},
		"lost": {3, Device{Index: 3,
			Err: &Error{Op: "read name", Device: 3, Code: nvmlib.ERROR_GPU_IS_LOST}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got := devs[tc.index]
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("device %d\n got %+v\nwant %+v", tc.index, got, tc.want)
			}
			one, err := s.Device(tc.index)
			if err != nil || !reflect.DeepEqual(one, got) {
				t.Errorf("Device(%d) = %+v, %v; want what Devices() read", tc.index, one, err)
			}
		})
	}
	if _, err := s.Device(len(gpus)); !errors.Is(err, nvmlib.ERROR_INVALID_ARGUMENT) {
		t.Errorf("Device(out of range) = %v, want ERROR_INVALID_ARGUMENT", err)
	}
}

func TestSample(t *testing.T) {
	lib := newH100(t, gpuState{used: 3 * gib, reserved: 512 * mib}, gpuState{used: 70 * gib, reserved: 512 * mib},
		gpuState{lost: true})
	s := openMock(t, lib)
	tests := map[string]struct {
		index       int
		used, total uint64
		err         error
	}{
		"gpu 0":        {index: 0, used: 3 * gib, total: h100Total},
		"gpu 1":        {index: 1, used: 70 * gib, total: h100Total},
		"lost":         {index: 2, err: nvmlib.ERROR_GPU_IS_LOST},
		"out of range": {index: 3, err: nvmlib.ERROR_INVALID_ARGUMENT},
		"negative":     {index: -1, err: nvmlib.ERROR_INVALID_ARGUMENT},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			used, total, err := s.Sample(tc.index)
			if !errors.Is(err, tc.err) || (tc.err == nil) != (err == nil) {
				t.Fatalf("Sample(%d) error = %v, want %v", tc.index, err, tc.err)
			}
			if used != tc.used || total != tc.total {
				t.Errorf("Sample(%d) = %d, %d; want %d, %d", tc.index, used, total, tc.used, tc.total)
			}
		})
	}
	// The cheap path: one memory query per sample, with the handle resolved once at Open.
	dev := lib.Devices[0].(*mockDevice)
	before := dev.GetMemoryInfo_v2Calls()
	handles := lib.DeviceGetHandleByIndexCalls()
	for range 10 {
		s.Sample(0)
	}
	if got := dev.GetMemoryInfo_v2Calls() - before; got != 10 {
		t.Errorf("10 samples made %d memory queries, want 10", got)
	}
	if got := lib.DeviceGetHandleByIndexCalls() - handles; got != 0 {
		t.Errorf("10 samples looked up %d device handles, want 0", got)
	}
}

// Drivers before r510 have no nvmlDeviceGetMemoryInfo_v2.
func TestMemoryInfoV1Fallback(t *testing.T) {
	t.Run("symbol missing", func(t *testing.T) {
		lib := newH100(t, gpuState{used: 10 * gib, reserved: 512 * mib})
		withoutMemoryV2(lib)
		s := openMock(t, lib)
		d, err := s.Device(0)
		if err != nil || d.Err != nil {
			t.Fatalf("Device(0) = %v, %v", err, d.Err)
		}
		want := Memory{Total: h100Total, Used: 10*gib + 512*mib, Free: h100Total - 10*gib - 512*mib, Version: 1}
		if d.Memory != want {
			t.Errorf("memory = %+v, want %+v (v1: used includes the reserved memory)", d.Memory, want)
		}
		if used, _, _ := s.Sample(0); used != want.Used {
			t.Errorf("Sample used = %d, want %d", used, want.Used)
		}
		dev := lib.Devices[0].(*mockDevice)
		if n := dev.GetMemoryInfo_v2Calls(); n != 0 {
			t.Errorf("nvmlDeviceGetMemoryInfo_v2 called %d times on a driver without it", n)
		}
	})
	for _, ret := range []nvmlib.Return{nvmlib.ERROR_NOT_SUPPORTED, nvmlib.ERROR_ARGUMENT_VERSION_MISMATCH} {
		t.Run("v2 refused: "+nvmlib.ErrorString(ret), func(t *testing.T) {
			lib := newH100(t, gpuState{used: 10 * gib, reserved: 512 * mib})
			lib.Devices[0].(*mockDevice).GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) {
				return nvmlib.Memory_v2{}, ret
			}
			used, total, err := openMock(t, lib).Sample(0)
			if err != nil || used != 10*gib+512*mib || total != h100Total {
				t.Errorf("Sample = %d, %d, %v; want the v1 reading", used, total, err)
			}
		})
	}
}

func TestDeviceReadingErrors(t *testing.T) {
	tests := map[string]struct {
		set     func(d *mockDevice)
		wantErr error // nil: the reading is left out without an error
		check   func(t *testing.T, d Device)
	}{
		"utilization not supported": {
			set: func(d *mockDevice) {
				d.GetUtilizationRatesFunc = func() (nvmlib.Utilization, nvmlib.Return) {
					return nvmlib.Utilization{}, nvmlib.ERROR_NOT_SUPPORTED
				}
			},
			check: func(t *testing.T, d Device) {
				if d.Utilization != nil {
					t.Errorf("utilization = %+v, want nil", d.Utilization)
				}
			},
		},
		"utilization no permission": {
			set: func(d *mockDevice) {
				d.GetUtilizationRatesFunc = func() (nvmlib.Utilization, nvmlib.Return) {
					return nvmlib.Utilization{}, nvmlib.ERROR_NO_PERMISSION
				}
			},
			wantErr: nvmlib.ERROR_NO_PERMISSION,
		},
		"processes not supported": {
			set: func(d *mockDevice) {
				d.GetComputeRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, nvmlib.ERROR_NOT_SUPPORTED }
				d.GetGraphicsRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, nvmlib.ERROR_NOT_SUPPORTED }
			},
			check: func(t *testing.T, d Device) {
				if d.Processes != nil {
					t.Errorf("processes = %+v, want nil (not reported)", d.Processes)
				}
			},
		},
		"memory fails, the rest is read": {
			set: func(d *mockDevice) {
				d.GetMemoryInfo_v2Func = func() (nvmlib.Memory_v2, nvmlib.Return) { return nvmlib.Memory_v2{}, nvmlib.ERROR_UNKNOWN }
			},
			wantErr: nvmlib.ERROR_UNKNOWN,
			check: func(t *testing.T, d Device) {
				if d.Name == "" || d.Utilization == nil || d.Memory != (Memory{}) {
					t.Errorf("device = %+v, want name and utilization but no memory", d)
				}
			},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			lib := newH100(t, gpuState{used: gib, util: &nvmlib.Utilization{Gpu: 5}})
			tc.set(lib.Devices[0].(*mockDevice))
			d, err := openMock(t, lib).Device(0)
			if err != nil {
				t.Fatal(err)
			}
			if !errors.Is(d.Err, tc.wantErr) || (tc.wantErr == nil) != (d.Err == nil) {
				t.Errorf("Device.Err = %v, want %v", d.Err, tc.wantErr)
			}
			if tc.check != nil {
				tc.check(t, d)
			}
		})
	}
}

// A handle NVML refuses at Open (a GPU lost since boot, a cgroup) leaves that device unreadable, not the session.
func TestHandleErrorAtOpen(t *testing.T) {
	lib := newH100(t, gpuState{used: gib}, gpuState{used: 2 * gib})
	get := lib.DeviceGetHandleByIndexFunc
	lib.DeviceGetHandleByIndexFunc = func(i int) (nvmlib.Device, nvmlib.Return) {
		if i == 0 {
			return nil, nvmlib.ERROR_NO_PERMISSION
		}
		return get(i)
	}
	s := openMock(t, lib)
	devs, err := s.Devices()
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(devs[0].Err, nvmlib.ERROR_NO_PERMISSION) || devs[1].Err != nil || devs[1].Memory.Used != 2*gib {
		t.Errorf("Devices() = %+v; want device 0 refused and device 1 read", devs)
	}
	if _, _, err := s.Sample(0); !errors.Is(err, nvmlib.ERROR_NO_PERMISSION) {
		t.Errorf("Sample(0) = %v, want ERROR_NO_PERMISSION", err)
	}
}
