package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/internal/app"
	"github.com/oomdbg/oomdbg/tracer/nvml"
)

// newDevicesCmd is `oomdbg devices`, reading the driver through the default libnvidia-ml.so.1.
func newDevicesCmd() *cobra.Command { return devicesCmd() }

// devicesCmd builds the devices command; opts reach nvml.Open, so tests can hand it a mock NVML.
//
// Without a driver it prints the one-line reason on stderr and exits 0: a machine without an NVIDIA GPU is a
// normal place to run oomdbg (the meta and cpu devices need none), and "no devices" is a complete answer to
// "list the devices". A driver that is there but fails (version mismatch, a lost GPU) is a problem with the
// machine: exit 1.
func devicesCmd(opts ...nvml.Option) *cobra.Command {
	var asJSON bool
	cmd := &cobra.Command{
		Use:   "devices",
		Short: "List the NVIDIA GPUs, their memory and the processes using them",
		Long: `List the NVIDIA GPUs NVML reports: name, UUID, used, free, total and driver-reserved memory,
utilization, and the processes holding device memory with their command lines.

Without an NVIDIA driver it says so on stderr and exits 0. NVML reports host PIDs: inside a container
with its own PID namespace, processes are listed as "not visible in this PID namespace".

--json prints one object: {"driver": bool, "driver_version": string|null, "error": string|null,
"devices": [{"index", "name", "uuid", "memory": {"total_bytes", "used_bytes", "free_bytes",
"reserved_bytes", "nvml_version"}, "utilization": {"gpu_percent", "memory_percent"}|null,
"processes": [{"pid", "type", "used_bytes", "visible", "name"}]|null, "error"}]}.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			r := nvml.ReadReport(opts...)
			write := r.WriteText
			if asJSON {
				write = r.WriteJSON
			}
			if err := write(cmd.OutOrStdout()); err != nil {
				return err
			}
			if errors.Is(r.Err, nvml.ErrNoDriver) {
				fmt.Fprintf(cmd.ErrOrStderr(), "oomdbg: %v\n", r.Err)
				return nil
			}
			if err := r.Problem(); err != nil {
				return &app.ProblemError{Msg: err.Error()}
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&asJSON, "json", false, "print a JSON object instead of text")
	return cmd
}
