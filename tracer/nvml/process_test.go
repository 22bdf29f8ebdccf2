package nvml

import (
	"os"
	"reflect"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

func TestProcesses(t *testing.T) {
	const (
		trainer  = 101 // a training script
		xorg     = 102 // uses the GPU for graphics
		both     = 103 // compute and graphics, e.g. a visualiser
		zombie   = 104 // no command line left
		hostile  = 105 // a name with a terminal escape sequence
		hidden   = 4194309
		unknown  = 106 // NVML cannot tell its memory
		notInNVM = 107 // in procfs but not on the GPU: must not appear
	)
	root := fakeProcRoot(t, map[uint32]fakeProcess{
		trainer:  {cmdline: "/usr/bin/python3\x00-m\x00torch.distributed.run\x00train.py\x00", comm: "python3"},
		xorg:     {cmdline: "/usr/lib/xorg/Xorg\x00:0\x00", comm: "Xorg"},
		both:     {cmdline: "viewer\x00", comm: "viewer"},
		zombie:   {cmdline: "", comm: "python3"},
		hostile:  {cmdline: "evil\x1b]0;pwned\x07\x00", comm: "evil"},
		unknown:  {cmdline: "app\x00", comm: "app"},
		notInNVM: {cmdline: "bash\x00", comm: "bash"},
	})
	lib := newH100(t, gpuState{
		compute: []nvmlib.ProcessInfo{proc(zombie, 1*gib), proc(trainer, 40*gib), proc(both, 2*gib),
			proc(hidden, 3*gib), proc(hostile, 5*mib), proc(unknown, notAvailable)},
		graphics: []nvmlib.ProcessInfo{proc(xorg, 300*mib), proc(both, 2*gib)},
	})
	got, err := openMock(t, lib, WithProcRoot(root)).Processes(0)
	if err != nil {
		t.Fatal(err)
	}
	want := []Process{ // largest first, unknown sizes last
		{PID: trainer, Used: 40 * gib, UsedKnown: true, Type: Compute, Visible: true, Name: "/usr/bin/python3 -m torch.distributed.run train.py"},
		{PID: hidden, Used: 3 * gib, UsedKnown: true, Type: Compute},
		{PID: both, Used: 2 * gib, UsedKnown: true, Type: Compute | Graphics, Visible: true, Name: "viewer"},
		{PID: zombie, Used: 1 * gib, UsedKnown: true, Type: Compute, Visible: true, Name: "[python3]"},
		{PID: xorg, Used: 300 * mib, UsedKnown: true, Type: Graphics, Visible: true, Name: "/usr/lib/xorg/Xorg :0"},
		{PID: hostile, Used: 5 * mib, UsedKnown: true, Type: Compute, Visible: true, Name: "evil?]0;pwned?"},
		{PID: unknown, Type: Compute, Visible: true, Name: "app"},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Processes(0)\n got %+v\nwant %+v", got, want)
	}
}

func TestProcessesSupport(t *testing.T) {
	compute := []nvmlib.ProcessInfo{proc(7, gib)}
	tests := map[string]struct {
		cret, gret nvmlib.Return
		want       []Process
		wantErr    bool
	}{
		"both":                   {nvmlib.SUCCESS, nvmlib.SUCCESS, []Process{{PID: 7, Used: gib, UsedKnown: true, Type: Compute}}, false},
		"graphics unsupported":   {nvmlib.SUCCESS, nvmlib.ERROR_NOT_SUPPORTED, []Process{{PID: 7, Used: gib, UsedKnown: true, Type: Compute}}, false},
		"neither supported":      {nvmlib.ERROR_NOT_SUPPORTED, nvmlib.ERROR_NOT_SUPPORTED, nil, false},
		"compute fails":          {nvmlib.ERROR_NO_PERMISSION, nvmlib.SUCCESS, nil, true},
		"function not in driver": {nvmlib.ERROR_FUNCTION_NOT_FOUND, nvmlib.ERROR_FUNCTION_NOT_FOUND, nil, false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			lib := newH100(t, gpuState{})
			d := lib.Devices[0].(*mockDevice)
			d.GetComputeRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return compute, tc.cret }
			d.GetGraphicsRunningProcessesFunc = func() ([]nvmlib.ProcessInfo, nvmlib.Return) { return nil, tc.gret }
			got, err := openMock(t, lib, WithProcRoot(t.TempDir())).Processes(0)
			if (err != nil) != tc.wantErr || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Processes(0) = %+v, %v; want %+v (error: %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// NVML reports host PIDs. In a child PID namespace a matching /proc entry is another process: never name it.
func TestProcLookupNamespaces(t *testing.T) {
	root := fakeProcRoot(t, map[uint32]fakeProcess{42: {cmdline: "python\x00train.py\x00"}})
	tests := map[string]struct {
		lookup      procLookup
		pid         uint32
		wantName    string
		wantVisible bool
	}{
		"host namespace":          {procLookup{root: root, hostPIDs: true}, 42, "python train.py", true},
		"host namespace, no such": {procLookup{root: root, hostPIDs: true}, 43, "", false},
		"child namespace":         {procLookup{root: root, hostPIDs: false}, 42, "", false},
		"pid 0":                   {procLookup{root: root, hostPIDs: true}, 0, "", false},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			name, visible := tc.lookup.name(tc.pid)
			if name != tc.wantName || visible != tc.wantVisible {
				t.Errorf("name(%d) = %q, %v; want %q, %v", tc.pid, name, visible, tc.wantName, tc.wantVisible)
			}
		})
	}

	// An explicit root is a host procfs mounted in the container: trusted.
	if l := newProcLookup(root); !l.hostPIDs || l.root != root {
		t.Errorf("newProcLookup(%q) = %+v, want its PIDs trusted as host PIDs", root, l)
	}
	// The default /proc is trusted exactly when this process is in the initial PID namespace.
	link, err := os.Readlink("/proc/self/ns/pid")
	if err != nil {
		t.Skipf("cannot read /proc/self/ns/pid: %v", err)
	}
	if l := newProcLookup(""); l.root != "/proc" || l.hostPIDs != (link == initialPIDNamespace) {
		t.Errorf("newProcLookup(\"\") = %+v with /proc/self/ns/pid -> %s", l, link)
	}
}

// The real /proc: this test process is on no GPU, but its own entry must be found and named.
func TestProcLookupSelf(t *testing.T) {
	l := procLookup{root: "/proc", hostPIDs: true}
	name, visible := l.name(uint32(os.Getpid()))
	exe := strings.Join(os.Args, " ")
	if !visible || name != printable(exe) {
		t.Errorf("name(self) = %q, %v; want %q, true", name, visible, exe)
	}
}

func TestProcessType(t *testing.T) {
	for typ, want := range map[ProcessType]string{Compute: "C", Graphics: "G", Compute | Graphics: "C+G", 0: "?"} {
		if got := typ.String(); got != want {
			t.Errorf("ProcessType(%d).String() = %q, want %q", typ, got, want)
		}
	}
}
