// Package hostmem is the memory a command may use on this machine (--max-memory): the default, half the
// physical memory or what is available when that is less, read from /proc/meminfo, the cgroup and the
// address-space limit; the load budget it gives a command; and what to say when a snapshot does not fit it.
package hostmem

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

// The least and the most --max-memory may be: less opens nothing, and no machine has more (1 PiB).
const (
	Min = 16 << 20
	Max = 1 << 50
)

// Limit is the --max-memory setting: the memory a command may use, in bytes. The zero Limit is the default,
// Default's. A *Limit is the flag's value (pflag.Value).
type Limit struct {
	Bytes uint64
	Given bool // given on the command line
}

// Set sets the limit from a size in binary units ("8GiB", "8GB"), between Min and Max.
func (l *Limit) Set(s string) error {
	n, err := units.ParseSize(s)
	if err != nil {
		return err
	}
	if n < Min {
		return fmt.Errorf("%s is too little to open anything (at least %s)", s, units.FormatSizeExact(Min))
	}
	if n > Max {
		return fmt.Errorf("%s is more memory than any machine has (at most %s)", s, units.FormatSizeExact(Max))
	}
	l.Bytes, l.Given = n, true
	return nil
}

// String prints the limit given exactly ("" for the default).
func (l *Limit) String() string {
	if !l.Given {
		return ""
	}
	return units.FormatSizeExact(l.Bytes)
}

// Type names the flag's kind of value in --help.
func (*Limit) Type() string { return "size" }

// Resolve returns the limit in force: the one given, or the default from this machine. It also tells the Go
// runtime, whose collector then works harder as the heap nears the limit instead of letting garbage grow
// past it.
func (l *Limit) Resolve() uint64 {
	if !l.Given {
		l.Bytes = Default()
	}
	if l.Bytes > 0 && l.Bytes <= math.MaxInt64 {
		debug.SetMemoryLimit(int64(l.Bytes))
	}
	return l.Bytes
}

// Budget returns the load budget of a command whose events cost perEvent bytes each (load.CostAnalyse, ...).
func (l *Limit) Budget(perEvent int64) load.Budget {
	return load.Budget{Memory: int64(l.Resolve()), PerEvent: perEvent}
}

// Hold returns what a command with a budget of its own (the TUI's before it pages a run) may hold: that
// budget, or less when the default limit is less; the limit given on the command line, whatever it says.
// Half a large machine by default would hold a 100M-event run whole, in gigabytes, where paging it takes few.
func (l *Limit) Hold(own int64) int64 {
	limit := int64(l.Resolve())
	if l.Given {
		return limit
	}
	return min(limit, own)
}

// Explain adds what to do to a load error that is over the budget; other errors pass unchanged.
func (l *Limit) Explain(err error) error {
	if errors.Is(err, load.ErrMemory) {
		how := "--max-memory raises it, if this machine has the memory"
		if !l.Given {
			how = "--max-memory raises it (by default half the physical memory, or what is available)"
		}
		return fmt.Errorf("%w; %s", err, how)
	}
	return err
}

// Default is half the memory this process may have (the machine's, or its cgroup's or address-space limit,
// whichever is least), or what is available now when that is less: a command refused at it fails before the
// machine swaps.
func Default() uint64 {
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
