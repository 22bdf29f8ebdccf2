package nvml

import (
	"bytes"
	"encoding/json"
	"errors"
	"reflect"
	"testing"

	"github.com/charmbracelet/x/exp/golden"
	"github.com/oomdbg/oomdbg/internal/nvmlib"
	"github.com/oomdbg/oomdbg/internal/nvmlib/nvmlibtest"
)

// Processes of the report scenarios, named through a fake procfs.
const (
	pidTrainer = 31337
	pidEval    = 31400
	pidXorg    = 2210
	pidHidden  = 4194309 // a host PID, as seen from a container
)

func reportProcRoot(t *testing.T) string {
	procs := map[uint32]fakeProcess{
		pidEval: {cmdline: "python\x00eval.py\x00"},
		pidXorg: {cmdline: "/usr/lib/xorg/Xorg\x00vt1\x00"},
	}
	// torchrun's workers: one process per GPU, each running the script as torchrun starts it.
	for rank := range uint32(6) {
		procs[pidTrainer+rank] = fakeProcess{cmdline: "/opt/conda/bin/python\x00-u\x00train.py\x00--config\x00configs/gpt2-xl-long-context.yaml\x00--batch-size\x0016\x00"}
	}
	return fakeProcRoot(t, procs)
}

// reportScenarios are the machines the report tests render.
func reportScenarios(t *testing.T) map[string]*nvmlibtest.Server {
	util := func(gpu, mem uint32) *nvmlib.Utilization { return &nvmlib.Utilization{Gpu: gpu, Memory: mem} }
	dgx := make([]gpuState, 8)
	for rank := range 6 { // a 6-GPU training run, one rank per GPU
		used := 71*gib + 337*mib + uint64(rank)*97*mib
		dgx[rank] = gpuState{used: used + 517*mib, reserved: 551 * mib, util: util(98, 71),
			compute: []nvmlib.ProcessInfo{proc(pidTrainer+uint32(rank), used)}}
	}
	// An evaluation job, and a process of another container whose host PID is not visible here.
	dgx[6] = gpuState{used: 9*gib + 100*mib, reserved: 551 * mib, util: util(12, 3),
		compute: []nvmlib.ProcessInfo{proc(pidEval, 9*gib), proc(pidHidden, 100*mib)}}
	dgx[7] = gpuState{reserved: 551 * mib, util: nil}

	v1 := newH100(t, gpuState{used: 512 * mib, reserved: 551 * mib, util: util(0, 0),
		graphics: []nvmlib.ProcessInfo{proc(pidXorg, 23*mib)}, compute: []nvmlib.ProcessInfo{proc(pidXorg, notAvailable)}})
	withoutMemoryV2(v1)

	return map[string]*nvmlibtest.Server{
		"dgxh100":      newH100(t, dgx...),
		"v1 driver":    v1,
		"no processes": newH100(t, gpuState{reserved: 551 * mib, util: util(0, 0)}, gpuState{reserved: 551 * mib, util: util(0, 0)}),
		"lost gpu":     newH100(t, gpuState{used: gib, reserved: 551 * mib, util: util(1, 0)}, gpuState{lost: true}),
		"no devices":   newH100(t),
	}
}

func TestWriteText(t *testing.T) {
	for name, lib := range reportScenarios(t) {
		t.Run(name, func(t *testing.T) {
			r := ReadReport(WithLibrary(lib), WithProcRoot(reportProcRoot(t)))
			var out bytes.Buffer
			if err := r.WriteText(&out); err != nil {
				t.Fatal(err)
			}
			golden.RequireEqual(t, out.Bytes())
		})
	}
}

func TestWriteJSON(t *testing.T) {
	scenarios := reportScenarios(t)
	tests := map[string]Report{
		"dgxh100":    ReadReport(WithLibrary(scenarios["dgxh100"]), WithProcRoot(reportProcRoot(t))),
		"v1 driver":  ReadReport(WithLibrary(scenarios["v1 driver"]), WithProcRoot(reportProcRoot(t))),
		"lost gpu":   ReadReport(WithLibrary(scenarios["lost gpu"]), WithProcRoot(reportProcRoot(t))),
		"no driver":  ReadReport(WithLibrary(failingInit(nvmlib.ERROR_LIBRARY_NOT_FOUND))),
		"init fails": ReadReport(WithLibrary(failingInit(nvmlib.ERROR_LIB_RM_VERSION_MISMATCH))),
	}
	for name, r := range tests {
		t.Run(name, func(t *testing.T) {
			var out bytes.Buffer
			if err := r.WriteJSON(&out); err != nil {
				t.Fatal(err)
			}
			golden.RequireEqual(t, out.Bytes())
			var v map[string]any
			if err := json.Unmarshal(out.Bytes(), &v); err != nil {
				t.Fatalf("not JSON: %v", err)
			}
			for _, key := range []string{"driver", "driver_version", "error", "devices"} {
				if _, ok := v[key]; !ok {
					t.Errorf("key %q missing", key)
				}
			}
			if _, ok := v["devices"].([]any); !ok {
				t.Errorf("devices = %v, want an array", v["devices"])
			}
		})
	}
}

// Without a driver the report carries the one-line reason, no devices, and is not a problem.
func TestReportWithoutDriver(t *testing.T) {
	r := ReadReport(WithLibrary(failingInit(nvmlib.ERROR_LIBRARY_NOT_FOUND)))
	if r.Driver || !errors.Is(r.Err, ErrNoDriver) || len(r.Devices) != 0 || r.Problem() != nil {
		t.Errorf("report = %+v, problem %v; want no driver, ErrNoDriver, no devices, no problem", r, r.Problem())
	}
	var out bytes.Buffer
	if err := r.WriteText(&out); err != nil || out.Len() != 0 {
		t.Errorf("WriteText wrote %q, %v; want nothing (the caller prints Err)", out.String(), err)
	}
	var v struct {
		Driver  bool   `json:"driver"`
		Error   string `json:"error"`
		Devices []any  `json:"devices"`
	}
	out.Reset()
	if err := r.WriteJSON(&out); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(out.Bytes(), &v); err != nil {
		t.Fatal(err)
	}
	want := "no NVIDIA driver found (libnvidia-ml.so.1 could not be loaded); GPU readings are unavailable"
	if v.Driver || v.Error != want || v.Devices == nil || len(v.Devices) != 0 {
		t.Errorf("JSON = %s; want driver false, the no-driver line and an empty devices array", out.String())
	}
}

func TestReportProblem(t *testing.T) {
	lost := &Error{Op: "read name", Device: 1, Code: nvmlib.ERROR_GPU_IS_LOST}
	initErr := &Error{Op: "initialise NVML", Device: -1, Code: nvmlib.ERROR_NO_PERMISSION}
	tests := map[string]struct {
		r    Report
		want error
	}{
		"fine":      {Report{Driver: true, Devices: []Device{{}, {}}}, nil},
		"no driver": {Report{Err: &NoDriverError{Library: DefaultLibrary}}, nil},
		"init":      {Report{Driver: true, Err: initErr}, initErr},
		"device":    {Report{Driver: true, Devices: []Device{{}, {Err: lost}}}, lost},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if got := tc.r.Problem(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Problem() = %v, want %v", got, tc.want)
			}
		})
	}
}
