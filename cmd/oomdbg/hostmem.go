package main

import (
	"context"
	"fmt"
	"io"

	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// hostProbeSteps is how many steps the meta device runs to measure a cpu run's memory: the second step
// carries the optimizer's state.
const hostProbeSteps = 2

// checkHostMemory runs before a cpu-device run allocates anything. The cpu device keeps every tensor in host
// memory as float32 (a half-precision tensor takes twice the bytes it accounts on the device), so the run
// needs about the device memory it allocates at its peak: the meta device measures that in milliseconds,
// running the same configuration for up to two steps against the same simulated capacity. A run that needs
// more than --max-memory is refused; otherwise one line on stderr says what it will take.
func checkHostMemory(ctx context.Context, cfg train.Config, mem *memory, stderr io.Writer) error {
	probe := cfg
	probe.Device = device.Meta
	probe.Steps = min(cfg.Steps, hostProbeSteps)
	res, _, err := train.Run(ctx, probe, nil)
	if err != nil {
		return err
	}
	need := res.PeakAllocated
	if cfg.AMP != knob.AMPOff {
		need *= 2
	}
	limit := mem.resolve()
	if uint64(need) > limit {
		return fmt.Errorf("the cpu device would hold about %s of tensors in host memory (the run's peak on the meta device), "+
			"more than --max-memory %s: use --device meta, or a smaller model, --batch or --gpu-mem", units.FormatSize(need), units.FormatSize(int64(limit)))
	}
	fmt.Fprintf(stderr, "oomdbg: the cpu device will hold about %s of tensors in host memory (--max-memory %s)\n", units.FormatSize(need), units.FormatSize(int64(limit)))
	return nil
}
