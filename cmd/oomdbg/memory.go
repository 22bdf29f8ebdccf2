package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

// What one event of a snapshot costs each command, loaded and analysed (snapshot/load's costs).
const (
	costAnalyse = load.CostAnalyse
	costExport  = load.CostExport
	costReplay  = load.CostReplay
	costView    = load.CostView
)

// memory is the --max-memory setting: the memory a command may use, in bytes.
type memory struct {
	limit uint64
	set   bool // given on the command line
}

// addMemoryFlag puts --max-memory on fs.
func addMemoryFlag(fs *pflag.FlagSet, m *memory) {
	fs.Var(memoryFlag{m}, "max-memory", "memory a command may use; a snapshot that needs more is refused (exit 2) "+
		"before it is analysed (default: half the physical memory, or what is available when that is less)")
}

// memoryFlag is the pflag.Value of --max-memory.
type memoryFlag struct{ m *memory }

func (f memoryFlag) String() string {
	if f.m == nil || !f.m.set {
		return ""
	}
	return units.FormatSizeExact(f.m.limit)
}

func (f memoryFlag) Set(s string) error {
	n, err := units.ParseSize(s)
	if err != nil {
		return err
	}
	if n < 16<<20 {
		return fmt.Errorf("%s is too little to open anything (at least 16MiB)", s)
	}
	if n > maxSize {
		return fmt.Errorf("%s is more memory than any machine has (at most %s)", s, units.FormatSizeExact(maxSize))
	}
	f.m.limit, f.m.set = n, true
	return nil
}

func (memoryFlag) Type() string { return "size" }

// resolve returns the limit in force: the flag's, or the default from this machine. It also tells the Go
// runtime, whose collector then works harder as the heap nears the limit instead of letting garbage grow
// past it.
func (m *memory) resolve() uint64 {
	if !m.set {
		m.limit = defaultMaxMemory()
	}
	if m.limit > 0 && m.limit <= maxSize {
		debug.SetMemoryLimit(int64(m.limit))
	}
	return m.limit
}

// budget returns the load budget of a command whose events cost perEvent bytes each.
func (m *memory) budget(perEvent int64) load.Budget {
	return load.Budget{Memory: int64(m.resolve()), PerEvent: perEvent}
}

// memoryError adds what to do to a load error that is over the budget.
func memoryError(err error, m *memory) error {
	if errors.Is(err, load.ErrMemory) {
		how := "--max-memory raises it, if this machine has the memory"
		if !m.set {
			how = "--max-memory raises it (by default half the physical memory, or what is available)"
		}
		return fmt.Errorf("%w; %s", err, how)
	}
	return err
}

// defaultMaxMemory is half the memory this process may have (the machine's, or its cgroup's or address-space
// limit, whichever is least), or what is available now when that is less: a command refused at it fails
// before the machine swaps.
func defaultMaxMemory() uint64 {
	total, avail := meminfo()
	if cg, used, ok := cgroupMemory(); ok && cg < total {
		total = cg
		avail = min(avail, cg-min(used, cg))
	}
	var rl syscall.Rlimit
	if syscall.Getrlimit(syscall.RLIMIT_AS, &rl) == nil && rl.Cur != ^uint64(0) && rl.Cur-min(rl.Cur, asReserved) < total {
		// The Go runtime reserves address space beyond its heap, about 700 MiB on linux/amd64 before the
		// first allocation.
		total = rl.Cur - min(rl.Cur, asReserved)
		avail = min(avail, total)
	}
	limit := total / 2
	if avail > 0 {
		limit = min(limit, avail)
	}
	return max(limit, 64<<20)
}

// asReserved is the address space the Go runtime takes beyond its heap, with room to spare.
const asReserved = 1 << 30

// meminfo returns the machine's physical memory and what is available without swapping, from
// /proc/meminfo; without it, 8 GiB of which all is available.
func meminfo() (total, avail uint64) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 8 << 30, 8 << 30
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		kib, err := strconv.ParseUint(f[1], 10, 64)
		if err != nil {
			continue
		}
		switch f[0] {
		case "MemTotal:":
			total = kib << 10
		case "MemAvailable:":
			avail = kib << 10
		}
	}
	if total == 0 {
		total = 8 << 30
	}
	if avail == 0 || avail > total {
		avail = total
	}
	return total, avail
}

// cgroupMemory returns the memory limit of this process's cgroup and what it uses (v2 or v1), if it has one.
func cgroupMemory() (limit, used uint64, ok bool) {
	read := func(path string) (uint64, bool) {
		b, err := os.ReadFile(path)
		if err != nil {
			return 0, false
		}
		v, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		return v, err == nil
	}
	for _, p := range [][2]string{
		{"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
		{"/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"},
	} {
		if l, ok := read(p[0]); ok && l < 1<<60 { // v1 says "no limit" with a huge number, v2 with "max"
			u, _ := read(p[1])
			return l, u, true
		}
	}
	return 0, 0, false
}
