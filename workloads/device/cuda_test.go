//go:build cuda

package device_test

// The cuda device's tests run against fakecuda (testdata/fakecuda), a CUDA driver backed by host memory that
// logs every call that changes memory: the log is the independent record of what reached the driver. The
// test binary links libcuda.so.1, so the fake must be on the library path before it starts; .ci/cuda does:
//
//	go test -tags cuda -c -o device.test ./workloads/device
//	workloads/device/testdata/fakecuda/build.sh OUT INCLUDE device.test
//	LD_LIBRARY_PATH=OUT ./device.test
//
// gorgonia.org/cu calls cuInit in its package init, when the fake reads its settings (capacity, context
// memory, ...) from the environment, so each test runs its body in a child process of the test binary with
// the settings it needs. On a real driver the tests skip.

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/torchrules"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
	"gorgonia.org/cu"
)

const (
	fakeName = "oomdbg fakecuda" // the device name fakecuda reports
	childEnv = "OOMDBG_FAKECUDA_TEST"
	mib      = 1 << 20
)

// fakeSettings configure the fake driver of a child process.
type fakeSettings struct {
	Memory        uint64 // FAKECUDA_MEMORY
	ContextMemory uint64 // FAKECUDA_CONTEXT_MEMORY: what the primary context takes
	NoVMM         bool   // FAKECUDA_VMM=0
}

func (s fakeSettings) env(logPath string) []string {
	vmm := "1"
	if s.NoVMM {
		vmm = "0"
	}
	return []string{
		"FAKECUDA_MEMORY=" + strconv.FormatUint(s.Memory, 10),
		"FAKECUDA_CONTEXT_MEMORY=" + strconv.FormatUint(s.ContextMemory, 10),
		"FAKECUDA_VMM=" + vmm,
		"FAKECUDA_INIT_RESULT=0",
		"FAKECUDA_LOG=" + logPath,
	}
}

// onFakeDriver runs body in a child process of the test binary whose fake driver has settings s, and fails
// t when the child fails.
func onFakeDriver(t *testing.T, s fakeSettings, body func(t *testing.T, drv *driverLog)) {
	t.Helper()
	if os.Getenv(childEnv) == t.Name() {
		body(t, &driverLog{path: os.Getenv("FAKECUDA_LOG")})
		return
	}
	requireFakeDriver(t)
	logPath := filepath.Join(t.TempDir(), "driver.log")
	cmd := exec.Command(os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), s.env(logPath)...)
	cmd.Env = append(cmd.Env, childEnv+"="+t.Name())
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: "+t.Name())) {
		t.Fatalf("the test failed on the fake driver (%v):\n%s", err, out)
	}
	if testing.Verbose() {
		t.Logf("child process:\n%s", out)
	}
}

// requireFakeDriver skips t unless the libcuda.so.1 this binary loaded is fakecuda.
func requireFakeDriver(t *testing.T) {
	t.Helper()
	dev, err := cu.GetDevice(0)
	if err != nil {
		t.Skipf("no CUDA device 0: %v", err)
	}
	if name, err := dev.Name(); err != nil || name != fakeName {
		t.Skipf("libcuda.so.1 is not fakecuda (device 0 is %q, %v): run these tests through .ci/cuda", name, err)
	}
}

// driverLog reads the fake driver's log of calls.
type driverLog struct{ path string }

// driverCall is one logged call: its name (the versioned symbol, e.g. cuMemAlloc_v2) and its arguments.
type driverCall struct {
	Name string
	Args map[string]string
}

func (c driverCall) ok() bool       { return c.Args["result"] == "CUDA_SUCCESS" }
func (c driverCall) result() string { return c.Args["result"] }

func (c driverCall) uint(key string) uint64 {
	v, err := strconv.ParseUint(c.Args[key], 0, 64)
	if err != nil {
		panic(fmt.Sprintf("driver log: %s %s=%q: %v", c.Name, key, c.Args[key], err))
	}
	return v
}

func (c driverCall) String() string {
	return fmt.Sprintf("%s size=%s ptr=%s %s", c.Name, c.Args["size"], c.Args["ptr"], c.result())
}

// calls returns the logged calls, oldest first; with names, only the calls of those names.
func (l *driverLog) calls(t *testing.T, names ...string) []driverCall {
	t.Helper()
	f, err := os.Open(l.path)
	if err != nil {
		t.Fatalf("driver log: %v", err)
	}
	defer f.Close()
	var calls []driverCall
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 {
			continue
		}
		c := driverCall{Name: fields[0], Args: make(map[string]string)}
		for _, kv := range fields[1:] {
			k, v, _ := strings.Cut(kv, "=")
			c.Args[k] = v
		}
		if len(names) == 0 || slices.Contains(names, c.Name) {
			calls = append(calls, c)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatalf("driver log: %v", err)
	}
	return calls
}

// since returns the calls logged after the first n; with names, only the calls of those names.
func (l *driverLog) since(t *testing.T, n int, names ...string) []driverCall {
	t.Helper()
	var out []driverCall
	for _, c := range l.calls(t)[n:] {
		if len(names) == 0 || slices.Contains(names, c.Name) {
			out = append(out, c)
		}
	}
	return out
}

func (l *driverLog) len(t *testing.T) int { t.Helper(); return len(l.calls(t)) }

// checkTouched checks that every cuMemAlloc the driver served was followed by a cuMemsetD8 of the whole
// segment before it was freed: the memory was written, so it is resident. Calls from several threads may
// interleave in the log.
func checkTouched(t *testing.T, drv *driverLog) {
	t.Helper()
	untouched := map[uint64]uint64{} // address -> size
	for _, c := range drv.calls(t, "cuMemAlloc_v2", "cuMemsetD8_v2", "cuMemFree_v2") {
		if !c.ok() {
			continue
		}
		ptr := c.uint("ptr")
		switch c.Name {
		case "cuMemAlloc_v2":
			untouched[ptr] = c.uint("size")
		case "cuMemsetD8_v2":
			if size, ok := untouched[ptr]; ok && size == c.uint("size") {
				delete(untouched, ptr)
			}
		case "cuMemFree_v2":
			if _, ok := untouched[ptr]; ok {
				t.Errorf("segment %#x was freed without being written", ptr)
				delete(untouched, ptr)
			}
		}
	}
	for ptr, size := range untouched {
		t.Errorf("segment %#x of %d bytes was never written as a whole", ptr, size)
	}
}

func memGetInfo(t *testing.T, m allocator.Device) (free, total uint64) {
	t.Helper()
	free, total, err := m.MemGetInfo()
	if err != nil {
		t.Fatalf("MemGetInfo: %v", err)
	}
	return free, total
}

func TestCUDAParseKind(t *testing.T) {
	if k, err := device.ParseKind("cuda"); err != nil || k != device.CUDA {
		t.Fatalf("ParseKind(cuda) = %q, %v; want cuda in a build with -tags cuda", k, err)
	}
}

// TestCUDAInitFailureExits pins down what gorgonia.org/cu does when cuInit fails: its package init prints
// a message and exits with status 1 before any test (or main) runs. That is why the default build must not
// import it.
func TestCUDAInitFailureExits(t *testing.T) {
	requireFakeDriver(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCUDAParseKind$", "-test.v")
	cmd.Env = append(os.Environ(), "FAKECUDA_INIT_RESULT=100") // CUDA_ERROR_NO_DEVICE
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("with cuInit failing, the test binary ended with %v, want exit status 1:\n%s", err, out)
	}
	if want := "Error in initialization"; !bytes.Contains(out, []byte(want)) || !bytes.Contains(out, []byte("NoDevice")) {
		t.Errorf("output %q does not say %q and NoDevice", out, want)
	}
	if bytes.Contains(out, []byte("RUN")) {
		t.Errorf("a test ran although cuInit failed:\n%s", out)
	}
}

// TestCUDAMemory checks each allocator.Device call against what the driver saw.
func TestCUDAMemory(t *testing.T) {
	const capacity, context = 64 * mib, 8 * mib
	onFakeDriver(t, fakeSettings{Memory: capacity, ContextMemory: context}, func(t *testing.T, drv *driverLog) {
		if _, err := device.OpenCUDAMemory(1); err == nil || !strings.Contains(err.Error(), "no GPU 1: the CUDA driver sees 1 device(s)") {
			t.Errorf("OpenCUDAMemory(1) = %v, want an error saying there is no GPU 1", err)
		}
		m, err := device.OpenCUDAMemory(0)
		if err != nil {
			t.Fatal(err)
		}
		if name, err := m.Name(); name != fakeName || err != nil {
			t.Errorf("Name() = %q, %v", name, err)
		}
		if m.Index() != 0 || m.TotalMemory() != capacity || !m.SupportsExpandableSegments() || m.Processes() != nil {
			t.Errorf("Index, TotalMemory, SupportsExpandableSegments, Processes = %d, %d, %v, %v; want 0, %d, true, nil",
				m.Index(), m.TotalMemory(), m.SupportsExpandableSegments(), m.Processes(), capacity)
		}
		// The primary context took its share as soon as it was retained.
		if free, total := memGetInfo(t, m); free != capacity-context || total != capacity {
			t.Errorf("MemGetInfo = %d, %d; want %d, %d", free, total, capacity-context, capacity)
		}

		mark := drv.len(t)
		addr, err := m.Malloc(2 * mib)
		if err != nil {
			t.Fatal(err)
		}
		got := drv.since(t, mark)
		if len(got) != 2 || got[0].Name != "cuMemAlloc_v2" || !got[0].ok() || got[0].uint("size") != 2*mib ||
			got[0].uint("ptr") != addr || got[1].Name != "cuMemsetD8_v2" || !got[1].ok() ||
			got[1].uint("ptr") != addr || got[1].uint("size") != 2*mib {
			t.Errorf("Malloc(2 MiB) = %#x made the driver calls %v, want cuMemAlloc and a cuMemsetD8 of the segment", addr, got)
		}
		if free, _ := memGetInfo(t, m); free != capacity-context-2*mib {
			t.Errorf("free after Malloc = %d, want %d", free, capacity-context-2*mib)
		}
		mark = drv.len(t)
		if err := m.Free(addr); err != nil {
			t.Fatal(err)
		}
		if got := drv.since(t, mark); len(got) != 1 || got[0].Name != "cuMemFree_v2" || !got[0].ok() || got[0].uint("ptr") != addr {
			t.Errorf("Free(%#x) made the driver calls %v, want one cuMemFree", addr, got)
		}
		if free, _ := memGetInfo(t, m); free != capacity-context {
			t.Errorf("free after Free = %d, want %d", free, capacity-context)
		}

		// A driver OOM is allocator.ErrOutOfMemory, in the driver's words.
		_, err = m.Malloc(capacity - context + 2*mib)
		var de *device.DriverError
		if !errors.Is(err, allocator.ErrOutOfMemory) || !errors.As(err, &de) {
			t.Fatalf("Malloc of more than is free = %v, want a *DriverError that is allocator.ErrOutOfMemory", err)
		}
		want := fmt.Sprintf("cuda:0: cuMemAlloc(%d): out of memory (CUDA_ERROR_OUT_OF_MEMORY)", capacity-context+2*mib)
		if err.Error() != want {
			t.Errorf("error = %q, want %q", err, want)
		}
		if last := drv.calls(t, "cuMemAlloc_v2"); last[len(last)-1].result() != "CUDA_ERROR_OUT_OF_MEMORY" {
			t.Errorf("the driver logged %v, want an out-of-memory cuMemAlloc", last[len(last)-1])
		}
		// Other driver errors are not out-of-memory errors.
		err = m.Free(0x1000)
		if err == nil || errors.Is(err, allocator.ErrOutOfMemory) || !errors.As(err, &de) || de.Name != "CUDA_ERROR_INVALID_VALUE" {
			t.Errorf("Free of an unknown address = %v, want CUDA_ERROR_INVALID_VALUE", err)
		}

		// Every call binds the context to its own thread: goroutines on any thread can use the memory.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for range 8 {
			wg.Go(func() {
				for range 10 {
					a, err := m.Malloc(2 * mib)
					if err == nil {
						err = m.Free(a)
					}
					if err != nil {
						errs <- err
						return
					}
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("concurrent Malloc and Free: %v", err)
		}
		checkTouched(t, drv)

		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		// With the primary context released, nothing is left to bind.
		if _, _, err := m.MemGetInfo(); !errors.As(err, &de) || de.Name != "CUDA_ERROR_INVALID_CONTEXT" {
			t.Errorf("MemGetInfo after Close = %v, want CUDA_ERROR_INVALID_CONTEXT", err)
		}
	})
}

// TestCUDAAllocatorOOM drives the caching allocator on the cuda device into driver OOMs: the first is
// recovered by releasing cached segments (cuMemFree reaches the driver) and retrying; the second cannot be,
// and fails with PyTorch's message about the real device.
func TestCUDAAllocatorOOM(t *testing.T) {
	const capacity, context = 64 * mib, 8 * mib
	onFakeDriver(t, fakeSettings{Memory: capacity, ContextMemory: context}, func(t *testing.T, drv *driverLog) {
		dev, err := device.NewCUDA(0, allocator.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Memory().(*device.CUDAMemory).Close()
		if dev.Kind() != device.CUDA || dev.Computes() || dev.String() != "cuda:0" {
			t.Errorf("Kind, Computes, String = %q, %v, %q; want cuda, false, cuda:0", dev.Kind(), dev.Computes(), dev.String())
		}
		a := dev.Allocator()

		// Four 12 MiB segments (requests of 10 MiB and more get their own segment, rounded to 2 MiB); three
		// go back to the cache. 8 MiB stay free on the device.
		var held [4]uint64
		for i := range held {
			if held[i], err = dev.Malloc(12 * mib); err != nil {
				t.Fatal(err)
			}
		}
		for _, addr := range held[1:] {
			dev.Free(addr)
		}
		mark := drv.len(t)
		big, err := dev.Malloc(30 * mib)
		if err != nil {
			t.Fatalf("Malloc(30 MiB) with 36 MiB cached: %v", err)
		}
		// cudaMalloc fails, the allocator frees its cached segments and the retry succeeds.
		var seq []string
		for _, c := range drv.since(t, mark, "cuMemAlloc_v2", "cuMemFree_v2") {
			seq = append(seq, c.Name+":"+c.result())
		}
		wantSeq := []string{"cuMemAlloc_v2:CUDA_ERROR_OUT_OF_MEMORY", "cuMemFree_v2:CUDA_SUCCESS", "cuMemFree_v2:CUDA_SUCCESS",
			"cuMemFree_v2:CUDA_SUCCESS", "cuMemAlloc_v2:CUDA_SUCCESS"}
		if strings.Join(seq, " ") != strings.Join(wantSeq, " ") {
			t.Errorf("driver calls for the 30 MiB request: %v, want %v", seq, wantSeq)
		}
		if st := a.Stats(); st.NumAllocRetries != 1 || st.NumOOMs != 0 {
			t.Errorf("num_alloc_retries, num_ooms = %d, %d; want 1, 0", st.NumAllocRetries, st.NumOOMs)
		}

		// 42 MiB held, 14 MiB free. A 12 MiB segment is cached, then a 16 MiB request cannot be served even
		// after releasing it.
		c, err := dev.Malloc(12 * mib)
		if err != nil {
			t.Fatal(err)
		}
		dev.Free(c)
		mark = drv.len(t)
		_, err = dev.Malloc(16 * mib)
		var oom *allocator.OutOfMemoryError
		if !errors.As(err, &oom) {
			t.Fatalf("Malloc(16 MiB) with 14 MiB free = %v, want an *allocator.OutOfMemoryError", err)
		}
		// PyTorch's message, with the numbers of the device as the driver has it: 64 MiB in total, of which
		// the context takes 8 and the allocator holds 42.
		want := "CUDA out of memory. Tried to allocate 16.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which " +
			"14.00 MiB is free. Of the allocated memory 42.00 MiB is allocated by PyTorch, and 0 bytes is reserved " +
			"by PyTorch but unallocated. If reserved but unallocated memory is large try setting " +
			"PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for " +
			"Memory Management  (" + torchrules.MemoryManagementURL + ")"
		if err.Error() != want {
			t.Errorf("OOM message:\n got %s\nwant %s", err, want)
		}
		seq = seq[:0]
		for _, call := range drv.since(t, mark, "cuMemAlloc_v2", "cuMemFree_v2") {
			seq = append(seq, call.Name+":"+call.result())
			if call.Name == "cuMemFree_v2" && call.uint("ptr") != c {
				t.Errorf("the release chain freed %#x, want the cached segment %#x", call.uint("ptr"), c)
			}
		}
		wantSeq = []string{"cuMemAlloc_v2:CUDA_ERROR_OUT_OF_MEMORY", "cuMemFree_v2:CUDA_SUCCESS", "cuMemAlloc_v2:CUDA_ERROR_OUT_OF_MEMORY"}
		if strings.Join(seq, " ") != strings.Join(wantSeq, " ") {
			t.Errorf("driver calls for the 16 MiB request: %v, want %v", seq, wantSeq)
		}
		if st := a.Stats(); st.NumAllocRetries != 2 || st.NumOOMs != 1 {
			t.Errorf("num_alloc_retries, num_ooms = %d, %d; want 2, 1", st.NumAllocRetries, st.NumOOMs)
		}

		dev.Free(held[0])
		dev.Free(big)
		if err := a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		if free, _ := memGetInfo(t, dev.Memory()); free != capacity-context {
			t.Errorf("free after emptying the cache = %d, want %d", free, capacity-context)
		}
		allocs, frees := 0, 0
		for _, call := range drv.calls(t, "cuMemAlloc_v2", "cuMemFree_v2") {
			if call.ok() && call.Name == "cuMemAlloc_v2" {
				allocs++
			} else if call.ok() {
				frees++
			}
		}
		if st := a.Stats(); allocs != 6 || frees != 6 || st.NumDeviceAlloc != 6 || st.NumDeviceFree != 6 {
			t.Errorf("driver served %d cuMemAlloc and %d cuMemFree, allocator counted %d and %d; want 6 of each",
				allocs, frees, st.NumDeviceAlloc, st.NumDeviceFree)
		}
		checkTouched(t, drv)
	})
}

// TestCUDAExpandableSegments runs expandable segments on the VMM API of the driver: reserve, create, map,
// set access; a cuMemCreate OOM is the allocator's OOM; emptying the cache unmaps, releases and frees the
// reservation.
func TestCUDAExpandableSegments(t *testing.T) {
	const capacity, context = 64 * mib, 8 * mib
	onFakeDriver(t, fakeSettings{Memory: capacity, ContextMemory: context}, func(t *testing.T, drv *driverLog) {
		cfg, err := allocator.ParseConfig("expandable_segments:True")
		if err != nil {
			t.Fatal(err)
		}
		dev, err := device.NewCUDA(0, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Memory().(*device.CUDAMemory).Close()
		a := dev.Allocator()

		p, err := dev.Malloc(12 * mib)
		if err != nil {
			t.Fatal(err)
		}
		// One reservation of 1 1/8 of the device in 20 MiB pages; one page created, mapped, made accessible
		// and written.
		var names []string
		for _, c := range drv.calls(t) {
			if c.Name != "cuInit" && !strings.HasPrefix(c.Name, "cuDevicePrimaryCtx") {
				names = append(names, c.Name+":"+c.Args["size"])
			}
		}
		wantNames := []string{"cuMemAddressReserve:83886080", "cuMemCreate:20971520", "cuMemMap:20971520",
			"cuMemSetAccess:20971520", "cuMemsetD8_v2:20971520"}
		if strings.Join(names, " ") != strings.Join(wantNames, " ") {
			t.Errorf("driver calls: %v, want %v", names, wantNames)
		}

		// 30 MiB more needs two more pages; the driver has memory for one.
		mark := drv.len(t)
		_, err = dev.Malloc(30 * mib)
		var oom *allocator.OutOfMemoryError
		if !errors.As(err, &oom) {
			t.Fatalf("Malloc(30 MiB) with 36 MiB free = %v, want an *allocator.OutOfMemoryError", err)
		}
		want := "CUDA out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total capacity of 64.00 MiB of which 36.00 MiB is free."
		if !strings.HasPrefix(err.Error(), want) {
			t.Errorf("OOM message %q does not start with %q", err, want)
		}
		var created, failed, released int
		for _, c := range drv.since(t, mark) {
			switch {
			case c.Name == "cuMemCreate" && c.ok():
				created++
			case c.Name == "cuMemCreate" && c.result() == "CUDA_ERROR_OUT_OF_MEMORY":
				failed++
			case c.Name == "cuMemRelease" && c.ok():
				released++
			case c.Name == "cuMemMap":
				t.Errorf("%v: nothing may be mapped when the pages cannot all be created", c)
			}
		}
		if created == 0 || failed == 0 || released != created {
			t.Errorf("cuMemCreate succeeded %d times and failed %d, cuMemRelease %d; want the created pages released after the OOM", created, failed, released)
		}

		dev.Free(p)
		if err := a.EmptyCache(); err != nil {
			t.Fatal(err)
		}
		counts := map[string]int{}
		for _, c := range drv.calls(t) {
			if c.ok() {
				counts[c.Name]++
			}
		}
		if counts["cuMemMap"] != 1 || counts["cuMemUnmap"] != 1 || counts["cuMemCreate"] != counts["cuMemRelease"] ||
			counts["cuMemAddressReserve"] != 1 || counts["cuMemAddressFree"] != 1 {
			t.Errorf("driver calls after emptying the cache: %v; want every page unmapped and released and the reservation freed", counts)
		}
		if free, _ := memGetInfo(t, dev.Memory()); free != capacity-context {
			t.Errorf("free after emptying the cache = %d, want %d", free, capacity-context)
		}
	})
}

// TestCUDANoVMM checks the message when the device cannot do expandable segments.
func TestCUDANoVMM(t *testing.T) {
	onFakeDriver(t, fakeSettings{Memory: 64 * mib, NoVMM: true}, func(t *testing.T, drv *driverLog) {
		cfg, _ := allocator.ParseConfig("expandable_segments:True")
		dev, err := device.NewCUDA(0, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer dev.Memory().(*device.CUDAMemory).Close()
		_, err = dev.Malloc(mib)
		if err == nil || errors.Is(err, allocator.ErrOutOfMemory) || !strings.Contains(err.Error(), "expandable segments need the CUDA virtual memory management API") {
			t.Errorf("Malloc with expandable segments and no VMM = %v", err)
		}
		if _, err := dev.Malloc(mib); err == nil {
			t.Errorf("a second Malloc succeeded")
		}
	})
}

// TestCUDASnapshot records a short training run on the cuda device, MLP steps as the training loop runs them
// and a last step whose batch does not fit, and reads the snapshot back: it is whole, its segment events
// are the driver's cuMemAlloc and cuMemFree calls, and it ends with the OOM.
func TestCUDASnapshot(t *testing.T) {
	const capacity, context = 64 * mib, 8 * mib
	onFakeDriver(t, fakeSettings{Memory: capacity, ContextMemory: context}, func(t *testing.T, drv *driverLog) {
		dev, err := device.NewCUDA(0, allocator.DefaultConfig())
		if err != nil {
			t.Fatal(err)
		}
		mem := dev.Memory().(*device.CUDAMemory)
		defer mem.Close()
		name, _ := mem.Name()
		meta := snapshot.Meta{
			Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns",
			Devices: []snapshot.DeviceInfo{{Index: 0, Name: name, Kind: string(device.CUDA),
				Capacity: int64(mem.TotalMemory()), ContextReserve: context}},
			AllocatorSettings: dev.Allocator().Config().String(),
		}
		var file bytes.Buffer
		w, err := snapshot.NewWriter(&file, meta)
		if err != nil {
			t.Fatal(err)
		}
		rec := tracer.New(w)
		dev.Allocator().SetObserver(rec)

		oomErr := trainMLP(t, dev, rec, []int{64, 1024, 1024, 16384})
		if oomErr == nil {
			t.Fatal("the run with a batch of 16384 did not run out of memory")
		}
		if !strings.HasPrefix(oomErr.Error(), "CUDA out of memory. Tried to allocate ") {
			t.Errorf("OOM error %q is not PyTorch's message", oomErr)
		}
		t.Logf("%s: %v", oomErr.Label, oomErr)
		if err := rec.Close(finalSegments(dev)); err != nil {
			t.Fatal(err)
		}
		st := dev.Allocator().Stats()
		if st.NumOOMs != 1 || st.NumAllocRetries < 1 {
			t.Errorf("num_ooms, num_alloc_retries = %d, %d; want 1 and at least 1", st.NumOOMs, st.NumAllocRetries)
		}

		snap, err := snapshot.Read(bytes.NewReader(file.Bytes()))
		if err != nil {
			t.Fatal(err)
		}
		if snap.Warning != nil || snap.Footer == nil {
			t.Fatalf("snapshot is not whole: warning %v, footer %v", snap.Warning, snap.Footer)
		}
		if got := snap.Meta.Devices; len(got) != 1 || got[0].Kind != "cuda" || got[0].Name != fakeName || got[0].Capacity != capacity {
			t.Errorf("snapshot devices = %+v", got)
		}
		if uint64(snap.Events.Len()) != snap.Footer.Summary.Events {
			t.Errorf("%d events read, the footer counts %d", snap.Events.Len(), snap.Footer.Summary.Events)
		}

		// The segment events are the driver's calls, in order.
		var segEvents, driverCalls []string
		var ooms []snapshot.Event
		for _, e := range snap.Events.All() {
			switch e.Action {
			case snapshot.ActionSegmentAlloc:
				segEvents = append(segEvents, fmt.Sprintf("alloc %#x %d", e.Addr, e.Size))
			case snapshot.ActionSegmentFree:
				segEvents = append(segEvents, fmt.Sprintf("free %#x %d", e.Addr, e.Size))
			case snapshot.ActionOOM:
				ooms = append(ooms, e)
			}
		}
		var failed []driverCall
		freedBetween := 0 // segments freed between the last two failed cuMemAlloc calls: the release chain
		for _, c := range drv.calls(t, "cuMemAlloc_v2", "cuMemFree_v2") {
			switch {
			case c.Name == "cuMemAlloc_v2" && c.ok():
				driverCalls = append(driverCalls, fmt.Sprintf("alloc %#x %d", c.uint("ptr"), c.uint("size")))
			case c.Name == "cuMemFree_v2" && c.ok():
				driverCalls = append(driverCalls, fmt.Sprintf("free %#x %d", c.uint("ptr"), c.uint("size")))
				if len(failed) == 1 {
					freedBetween++
				}
			case c.Name == "cuMemAlloc_v2":
				failed = append(failed, c)
			}
		}
		if strings.Join(segEvents, "\n") != strings.Join(driverCalls, "\n") {
			t.Errorf("segment events:\n%s\ndriver calls:\n%s", strings.Join(segEvents, "\n"), strings.Join(driverCalls, "\n"))
		}

		// One OOM event, at the end, in the forward pass, for the size the driver refused.
		if len(ooms) != 1 || len(failed) != 2 || freedBetween == 0 {
			t.Fatalf("%d oom events, %d failed cuMemAlloc calls with %d cuMemFree between them; want 1 OOM, "+
				"2 failures, and the release chain's frees between them", len(ooms), len(failed), freedBetween)
		}
		e := ooms[0]
		if uint64(e.BlockSize) != failed[len(failed)-1].uint("size") || e.Phase != snapshot.PhaseForward {
			t.Errorf("oom event: alloc_size %d in phase %v; want %d in forward", e.BlockSize, e.Phase, failed[len(failed)-1].uint("size"))
		}
		if want := uint64(capacity-context) - uint64(st.ReservedBytes.All().Current); uint64(e.DeviceFree) != want {
			t.Errorf("oom event: device free %d, want %d (capacity - context - reserved)", e.DeviceFree, want)
		}
		if len(snap.Footer.Segments) != len(dev.Allocator().Segments()) {
			t.Errorf("footer has %d segments, the allocator %d", len(snap.Footer.Segments), len(dev.Allocator().Segments()))
		}
		checkTouched(t, drv)
	})
}

// trainMLP runs one MLP training step per batch size on dev, phase by phase as the training loop does, and
// returns the OOM that stopped it, if any. Heap dumps are taken at each iteration end and at the OOM.
func trainMLP(t *testing.T, dev *device.Device, rec *tracer.Recorder, batches []int) *tensor.OOMError {
	t.Helper()
	rt := tensor.NewRuntime(dev, rec, 1)
	heapDump := func(reason string) {
		edges := rt.Retainers()
		out := make([]tracer.Retainer, len(edges))
		for i, e := range edges {
			out[i] = tracer.Retainer{Holder: e.Holder, Parent: e.Parent, Description: e.Description, Device: dev.Index(), Addr: e.Addr}
		}
		rec.HeapDump(reason, out)
	}
	rt.OnOOM(func(*tensor.OOMError) { heapDump("oom") })
	var setupErr error
	err := rt.Catch(func() {
		rt.SetPhase(snapshot.PhaseSetup)
		model := nn.NewMLP(rt, nn.MLPConfig{In: 256, Hidden: 1024, Layers: 2, Classes: 10, DType: tensor.F32})
		opt, err := optim.New(rt, model.Parameters(), optim.Config{Kind: knob.Adam, LR: 1e-3})
		if err != nil {
			setupErr = err
			return
		}
		for i, n := range batches {
			rec.BeginIteration(i)
			rt.SetPhase(snapshot.PhaseData)
			rt.SetCategory(snapshot.CategoryInput)
			x := rt.Zeros(tensor.F32, []int{n, 256}, "batch.x", snapshot.CategoryInput)
			y := rt.Zeros(tensor.I64, []int{n}, "batch.y", snapshot.CategoryInput)
			rt.SetCategory(snapshot.CategoryTemporary)
			rt.SetPhase(snapshot.PhaseForward)
			loss := model.Loss(x, y)
			rt.SetPhase(snapshot.PhaseBackward)
			loss.Backward(false)
			loss.Release()
			x.Release()
			y.Release()
			rt.SetPhase(snapshot.PhaseOptimizer)
			opt.Step()
			rt.SetPhase(snapshot.PhaseZeroGrad)
			opt.ZeroGrad(true)
			heapDump("iteration end")
		}
	})
	if setupErr != nil {
		t.Fatal(setupErr)
	}
	var oom *tensor.OOMError
	if err != nil && !errors.As(err, &oom) {
		t.Fatalf("training: %v", err)
	}
	return oom
}

// finalSegments is the allocator's state as snapshot segments.
func finalSegments(dev *device.Device) []snapshot.Segment {
	var out []snapshot.Segment
	for _, s := range dev.Allocator().Segments() {
		seg := snapshot.Segment{Device: s.Device, Stream: s.Stream, Addr: s.Addr, Size: int64(s.Size), Pool: s.Pool, Expandable: s.Expandable}
		for _, b := range s.Blocks {
			seg.Blocks = append(seg.Blocks, snapshot.Block{Addr: b.Addr, Size: int64(b.Size), Requested: int64(b.Requested), State: b.State})
		}
		out = append(out, seg)
	}
	return out
}
