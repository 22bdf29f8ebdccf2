package nvml

import (
	"bytes"
	"cmp"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/oomdbg/oomdbg/internal/nvmlib"
)

// Process is a process holding memory on a device, as NVML reports it.
type Process struct {
	// PID is the process ID in the host's PID namespace: NVML does not translate PIDs into a container's
	// namespace, so inside one it may not exist or may name another process (see Visible).
	PID uint32
	// Used is the device memory the process holds, in bytes, when UsedKnown; NVML cannot always tell (vGPU
	// guests, Windows WDDM, some permission setups).
	Used      uint64
	UsedKnown bool
	Type      ProcessType // compute (CUDA), graphics, or both
	// Visible is false when PID is not visible in this PID namespace: it has no procfs entry, or oomdbg runs
	// in a container's PID namespace where NVML's host PIDs name other processes or none. Name is then empty.
	Visible bool
	// Name is the command line from procfs (arguments joined by spaces, control characters replaced by '?'),
	// or the bracketed kernel name when the command line is empty, e.g. "[python3]". Empty when not Visible or
	// not readable (procfs mounted with hidepid).
	Name string
}

// ProcessType says how a process uses a device, as nvidia-smi's Type column does.
type ProcessType uint8

// Process types. A process can be both.
const (
	Compute  ProcessType = 1 << iota // a CUDA context (training, inference)
	Graphics                         // a graphics context (X server, a desktop)
)

// String returns nvidia-smi's notation: "C", "G" or "C+G".
func (t ProcessType) String() string {
	switch t {
	case Compute:
		return "C"
	case Graphics:
		return "G"
	case Compute | Graphics:
		return "C+G"
	}
	return "?"
}

// Processes lists the processes using device index, largest first. A device that does not report processes
// gives nil and no error.
func (s *Session) Processes(index int) ([]Process, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	dev, err := s.device(index)
	if err != nil {
		return nil, err
	}
	return s.processes(dev, index)
}

// processes merges the compute and graphics processes of a device and names them; the caller holds s.mu for
// reading.
func (s *Session) processes(dev nvmlib.Device, i int) ([]Process, error) {
	compute, ret := dev.GetComputeRunningProcesses()
	cerr := newError("list compute processes", i, ret)
	graphics, ret := dev.GetGraphicsRunningProcesses()
	gerr := newError("list graphics processes", i, ret)
	for _, err := range []error{cerr, gerr} {
		if err != nil && !optional(err) {
			return nil, err
		}
	}
	if cerr != nil && gerr != nil {
		return nil, nil // neither list is supported
	}

	byPID := make(map[uint32]*Process, len(compute)+len(graphics))
	procs := make([]Process, 0, len(compute)+len(graphics))
	add := func(infos []nvmlib.ProcessInfo, t ProcessType) {
		for _, info := range infos {
			used, known := info.UsedGpuMemory, info.UsedGpuMemory != notAvailable
			p, ok := byPID[info.Pid]
			if !ok {
				procs = append(procs, Process{PID: info.Pid})
				p = &procs[len(procs)-1]
			}
			p.Type |= t
			// Both lists report the same process's memory; keep the larger if they disagree.
			if known && (!p.UsedKnown || used > p.Used) {
				p.Used, p.UsedKnown = used, true
			}
			byPID[info.Pid] = p
		}
	}
	// Pointers into procs stay valid: its capacity covers every entry, so append never reallocates.
	add(compute, Compute)
	add(graphics, Graphics)

	for j := range procs {
		procs[j].Name, procs[j].Visible = s.procs.name(procs[j].PID)
	}
	slices.SortFunc(procs, func(a, b Process) int {
		if a.UsedKnown != b.UsedKnown {
			if a.UsedKnown {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.Used, a.Used), cmp.Compare(a.PID, b.PID))
	})
	return procs, nil
}

// notAvailable is NVML_VALUE_NOT_AVAILABLE (-1) as the unsigned usedGpuMemory field holds it.
const notAvailable = ^uint64(0)

// procLookup names PIDs from a procfs.
type procLookup struct {
	root string // where procfs is mounted
	// hostPIDs is whether PIDs under root are host PIDs, the namespace NVML reports in. When false every
	// process is reported not visible: a match would be a different process that happens to share the number.
	hostPIDs bool
}

// initialPIDNamespace is the link text of /proc/self/ns/pid in the kernel's initial PID namespace, whose
// inode number is fixed (PROC_PID_INIT_INO, Linux 3.8 and later).
const initialPIDNamespace = "pid:[4026531836]"

// newProcLookup looks PIDs up under root. An explicit root is trusted to be the host's procfs; the default
// /proc is, unless this process runs in a child PID namespace (a container).
func newProcLookup(root string) procLookup {
	if root != "" {
		return procLookup{root: root, hostPIDs: true}
	}
	link, err := os.Readlink("/proc/self/ns/pid")
	// Unreadable (no procfs, a sandbox): assume the host's namespace rather than hide every name.
	return procLookup{root: "/proc", hostPIDs: err != nil || link == initialPIDNamespace}
}

// maxCmdline caps how much of a command line is read: enough to recognise a training script.
const maxCmdline = 4096

// name returns the command line of pid and whether pid is visible.
func (p procLookup) name(pid uint32) (string, bool) {
	if !p.hostPIDs || pid == 0 {
		return "", false
	}
	dir := filepath.Join(p.root, strconv.FormatUint(uint64(pid), 10))
	cmdline, err := readCapped(filepath.Join(dir, "cmdline"), maxCmdline)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", false
	case err != nil:
		return "", true // there, but hidden from this user (hidepid) or gone mid-read
	}
	name := string(bytes.ReplaceAll(bytes.TrimRight(cmdline, "\x00"), []byte{0}, []byte{' '}))
	if name == "" {
		// Kernel threads and zombies have no command line; ps shows their comm in brackets.
		if comm, err := readCapped(filepath.Join(dir, "comm"), 64); err == nil {
			if c := strings.TrimSpace(string(comm)); c != "" {
				name = "[" + c + "]"
			}
		}
	}
	return printable(name), true
}

// readCapped reads at most limit bytes of a file.
func readCapped(path string, limit int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// printable makes a process name safe to print to a terminal: any user can name a process, escape
// sequences included.
func printable(s string) string {
	s = strings.ToValidUTF8(s, "?")
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, s)
}
