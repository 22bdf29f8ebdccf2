package nvml

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"strconv"
	"strings"
	"text/tabwriter"
	"unicode/utf8"

	"github.com/oomdbg/oomdbg/internal/units"
)

// Report is the state of a machine's GPUs at one moment, as `oomdbg devices` prints it.
type Report struct {
	// Driver is whether an NVIDIA driver was found. It can be true with Err set: the driver is there but
	// NVML failed to start (permissions, a driver/library version mismatch).
	Driver        bool
	DriverVersion string   // e.g. "550.54.15"; "" if unknown
	Devices       []Device // every device, each possibly with its own Err
	Err           error    // why nothing was read (matches ErrNoDriver without a driver), or nil
}

// ReadReport opens a session with opts, reads every device and closes the session. It never fails: what
// went wrong is in Report.Err and Device.Err.
func ReadReport(opts ...Option) Report {
	s, err := Open(opts...)
	if err != nil {
		return Report{Driver: !errors.Is(err, ErrNoDriver), Err: err}
	}
	defer s.Close()
	devs, err := s.Devices()
	return Report{Driver: true, DriverVersion: s.DriverVersion(), Devices: devs, Err: err}
}

// Problem returns the first failure in the report other than the absence of a driver (a normal state for a
// machine without GPUs), or nil.
func (r Report) Problem() error {
	if r.Err != nil {
		if errors.Is(r.Err, ErrNoDriver) {
			return nil
		}
		return r.Err
	}
	for _, d := range r.Devices {
		if d.Err != nil {
			return d.Err
		}
	}
	return nil
}

// maxNameWidth caps a command line in the text report so a process row fits 80 columns; the JSON report has
// it whole.
const maxNameWidth = 46

// WriteText writes the report for a person, in 80 columns: a block per device (memory used of total, free and
// reserved by the driver; utilization) and a table of the processes, as nvidia-smi has them. When r.Err is set
// nothing was read and nothing is written: the caller shows r.Err.
func (r Report) WriteText(w io.Writer) error {
	if r.Err != nil {
		return nil
	}
	var b strings.Builder
	version := r.DriverVersion
	if version == "" {
		version = "(version unknown)"
	}
	fmt.Fprintf(&b, "NVIDIA driver %s, %s\n", version, plural(len(r.Devices), "GPU"))
	if len(r.Devices) == 0 {
		b.WriteString("\nNo GPUs found.\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	nprocs := 0
	for _, d := range r.Devices {
		nprocs += len(d.Processes)
		writeDevice(&b, d)
	}

	b.WriteString("\nProcesses:\n")
	if nprocs == 0 {
		b.WriteString("No running processes found.\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "GPU\tPID\tTYPE\t%10s\tCOMMAND\n", "MEMORY")
	for _, d := range r.Devices {
		for _, p := range d.Processes {
			used := "n/a"
			if p.UsedKnown {
				used = units.FormatSize(p.Used)
			}
			fmt.Fprintf(tw, "%3d\t%d\t%s\t%10s\t%s\n", d.Index, p.PID, p.Type, used, processName(p))
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// writeDevice writes one device's block.
func writeDevice(b *strings.Builder, d Device) {
	fmt.Fprintf(b, "\nGPU %d: %s", d.Index, orUnknown(d.Name))
	if d.UUID != "" {
		fmt.Fprintf(b, " (UUID: %s)", d.UUID)
	}
	b.WriteByte('\n')
	if m := d.Memory; m.Total > 0 {
		fmt.Fprintf(b, "  memory  %s used / %s (%d%%), %s free", units.FormatSize(m.Used), units.FormatSize(m.Total),
			percent(m.Used, m.Total), units.FormatSize(m.Free))
		if m.Version >= 2 {
			fmt.Fprintf(b, ", %s reserved", units.FormatSize(m.Reserved))
		}
		b.WriteByte('\n')
	}
	if u := d.Utilization; u != nil {
		fmt.Fprintf(b, "  util    GPU %d%%, memory %d%%\n", u.GPU, u.Memory)
	} else if d.Err == nil {
		b.WriteString("  util    not reported by this device\n")
	}
	if d.Err != nil {
		fmt.Fprintf(b, "  error   %v\n", d.Err)
	}
}

// processName is a process's name as the text report shows it.
func processName(p Process) string {
	switch {
	case !p.Visible:
		return "(not visible in this PID namespace)"
	case p.Name == "":
		return "(unknown)"
	}
	// The program's directory matters least: keep the room for the script and its arguments.
	name := p.Name
	if prog, args, _ := strings.Cut(name, " "); strings.Contains(prog, "/") {
		name = strings.TrimSpace(path.Base(prog) + " " + args)
	}
	if utf8.RuneCountInString(name) > maxNameWidth {
		return string([]rune(name)[:maxNameWidth-3]) + "..."
	}
	return name
}

// WriteJSON writes the report as one indented JSON object:
//
//	{
//	  "driver": true,                   // an NVIDIA driver was found
//	  "driver_version": "550.54.15",    // null if unknown
//	  "error": null,                    // why nothing was read, e.g. the no-driver message
//	  "devices": [{                     // always an array, empty without a driver
//	    "index": 0,
//	    "name": "NVIDIA H100 80GB HBM3",
//	    "uuid": "GPU-...",
//	    "memory": {
//	      "total_bytes": 85520809984,
//	      "used_bytes": 13421772800,    // nvml_version 1: includes the reserved memory
//	      "free_bytes": 71562584064,
//	      "reserved_bytes": 536870912,  // null with nvml_version 1
//	      "nvml_version": 2             // 2: nvmlDeviceGetMemoryInfo_v2, 1: nvmlDeviceGetMemoryInfo
//	    },
//	    "utilization": {"gpu_percent": 87, "memory_percent": 41},  // null if not reported
//	    "processes": [{                 // largest first; null if not reported
//	      "pid": 4242,                  // a host PID (NVML does not translate PID namespaces)
//	      "type": "C",                  // "C" compute, "G" graphics, "C+G"
//	      "used_bytes": 8589934592,     // null if NVML cannot tell
//	      "visible": true,              // false: not visible in this PID namespace
//	      "name": "python train.py"     // command line; null if not visible or unreadable
//	    }],
//	    "error": null                   // the first reading of this device that failed
//	  }]
//	}
func (r Report) WriteJSON(w io.Writer) error {
	out := jsonReport{Driver: r.Driver, DriverVersion: nonEmpty(r.DriverVersion), Error: errString(r.Err),
		Devices: make([]jsonDevice, 0, len(r.Devices))}
	for _, d := range r.Devices {
		jd := jsonDevice{Index: d.Index, Name: d.Name, UUID: d.UUID, Error: errString(d.Err)}
		if m := d.Memory; m.Version > 0 {
			jm := jsonMemory{Total: m.Total, Used: m.Used, Free: m.Free, Version: m.Version}
			if m.Version >= 2 {
				jm.Reserved = &m.Reserved
			}
			jd.Memory = &jm
		}
		if u := d.Utilization; u != nil {
			jd.Utilization = &jsonUtilization{GPU: u.GPU, Memory: u.Memory}
		}
		if d.Processes != nil {
			jd.Processes = make([]jsonProcess, 0, len(d.Processes))
			for _, p := range d.Processes {
				jp := jsonProcess{PID: p.PID, Type: p.Type.String(), Visible: p.Visible, Name: nonEmpty(p.Name)}
				if p.UsedKnown {
					jp.Used = &p.Used
				}
				jd.Processes = append(jd.Processes, jp)
			}
		}
		out.Devices = append(out.Devices, jd)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(out)
}

// The JSON report's schema, documented at WriteJSON. Kept apart from Device so the Go API can grow without
// changing what scripts parse.
type (
	jsonReport struct {
		Driver        bool         `json:"driver"`
		DriverVersion *string      `json:"driver_version"`
		Error         *string      `json:"error"`
		Devices       []jsonDevice `json:"devices"`
	}
	jsonDevice struct {
		Index       int              `json:"index"`
		Name        string           `json:"name"`
		UUID        string           `json:"uuid"`
		Memory      *jsonMemory      `json:"memory"`
		Utilization *jsonUtilization `json:"utilization"`
		Processes   []jsonProcess    `json:"processes"`
		Error       *string          `json:"error"`
	}
	jsonMemory struct {
		Total    uint64  `json:"total_bytes"`
		Used     uint64  `json:"used_bytes"`
		Free     uint64  `json:"free_bytes"`
		Reserved *uint64 `json:"reserved_bytes"`
		Version  int     `json:"nvml_version"`
	}
	jsonUtilization struct {
		GPU    uint32 `json:"gpu_percent"`
		Memory uint32 `json:"memory_percent"`
	}
	jsonProcess struct {
		PID     uint32  `json:"pid"`
		Type    string  `json:"type"`
		Used    *uint64 `json:"used_bytes"`
		Visible bool    `json:"visible"`
		Name    *string `json:"name"`
	}
)

// percent is part/whole in whole percent, rounded to nearest.
func percent(part, whole uint64) uint64 {
	if whole == 0 {
		return 0
	}
	return uint64(float64(part)/float64(whole)*100 + 0.5)
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return strconv.Itoa(n) + " " + noun + "s"
}

func orUnknown(s string) string {
	if s == "" {
		return "(name unknown)"
	}
	return s
}

func nonEmpty(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func errString(err error) *string {
	if err == nil {
		return nil
	}
	s := err.Error()
	return &s
}
