// Package headroom is the one rule by which oomdbg says that a run fits a device: its peak of reserved memory
// stays at least a margin below the memory the caching allocator can use (the device's less the CUDA
// context). The planner, the what-if, the report's advice, the fixes table and the TUI all judge with it, so
// that "fits" means the same wherever it is printed, and each prints the margin beside the verdict.
//
// The margin is for what a simulation or a replay does not see: shapes other than the batches simulated, a
// long run's fragmentation, a library's workspace (cuBLAS, NCCL), other processes. A run that does not run
// out of memory but peaks inside the margin is Tight: it ran, and it would fail on a real card the first time
// any of those took a few megabytes more.
package headroom

import (
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/internal/units"
)

// DefaultMargin is the share of the usable memory a run must leave unreserved to fit: 5%.
const DefaultMargin = 0.05

// Limit returns the most a run may reserve of usable bytes and fit: usable x (1 - margin). A margin outside
// [0, 1) is taken as none.
func Limit(usable int64, margin float64) int64 {
	if !(margin >= 0 && margin < 1) {
		margin = 0
	}
	return int64(float64(usable) * (1 - margin))
}

// The verdicts.
const (
	Fits    = "fits"    // no OOM, and the peak reserved is within the limit
	Tight   = "tight"   // no OOM, but the peak reserved is inside the margin
	OOM     = "oom"     // it ran out of memory
	Unknown = "unknown" // no capacity is known to judge against
)

// Verdict is a run judged by the rule: what it peaked at, against what.
type Verdict struct {
	// Word is Fits, Tight, OOM or Unknown.
	Word string `json:"verdict"`
	// PeakReserved is the run's peak of reserved memory; Usable the memory the allocator can use (0:
	// unknown); Margin the share of it the rule keeps free; Limit the most the run may reserve and fit.
	PeakReserved int64   `json:"peak_reserved"`
	Usable       int64   `json:"usable"`
	Margin       float64 `json:"margin"`
	Limit        int64   `json:"limit"`
}

// Judge judges a run that peaked at peakReserved, and ran out of memory when oom, on usable bytes (0:
// unknown) with the given margin.
func Judge(peakReserved int64, oom bool, usable int64, margin float64) Verdict {
	if !(margin >= 0 && margin < 1) {
		margin = 0
	}
	v := Verdict{PeakReserved: peakReserved, Usable: usable, Margin: margin}
	if usable > 0 {
		v.Limit = Limit(usable, margin)
	}
	switch {
	case oom:
		v.Word = OOM
	case usable <= 0:
		v.Word = Unknown
	case peakReserved > v.Limit:
		v.Word = Tight
	default:
		v.Word = Fits
	}
	return v
}

// Fits reports whether the run fits by the rule.
func (v Verdict) Fits() bool { return v.Word == Fits }

// Left is the usable memory the run leaves unreserved at its peak (negative: it needed more).
func (v Verdict) Left() int64 { return v.Usable - v.PeakReserved }

// Short says the verdict in a word or two for a table's cell: "fits", "tight: 10.00 MiB left", "OOM".
func (v Verdict) Short() string {
	switch v.Word {
	case Tight:
		return "tight: " + units.FormatSize(max(v.Left(), 0)) + " left"
	case OOM:
		return "OOM"
	}
	return v.Word
}

// String says the verdict with its figures and the margin: "fits: peak reserved 16.58 GiB, 5.75 GiB under
// the 22.33 GiB limit (95% of the 23.50 GiB the allocator can use)".
func (v Verdict) String() string {
	switch v.Word {
	case Unknown:
		return "unknown: no capacity is known to judge against"
	case OOM:
		if v.Usable > 0 {
			return fmt.Sprintf("out of memory on the %s the allocator can use", units.FormatSize(v.Usable))
		}
		return "out of memory"
	case Tight:
		return fmt.Sprintf("tight: peak reserved %s leaves %s of the %s the allocator can use, inside the %s margin (%s): "+
			"it ran, but would fail on a real card as soon as anything took a little more",
			units.FormatSize(v.PeakReserved), units.FormatSize(max(v.Left(), 0)), units.FormatSize(v.Usable), Percent(v.Margin),
			units.FormatSize(v.Usable-v.Limit))
	}
	return fmt.Sprintf("fits: peak reserved %s, %s under the %s limit (%s of the %s the allocator can use)",
		units.FormatSize(v.PeakReserved), units.FormatSize(v.Limit-v.PeakReserved), units.FormatSize(v.Limit),
		Percent(1-v.Margin), units.FormatSize(v.Usable))
}

// Rule states the rule for a capacity in a line, to print beside a table of verdicts: "fits: peak reserved
// within 22.33 GiB, 95% of the 23.50 GiB the allocator can use (a 5% margin)".
func Rule(usable int64, margin float64) string {
	if usable <= 0 {
		return fmt.Sprintf("fits: peak reserved within %s of the memory the allocator can use (a %s margin); no capacity is known",
			Percent(1-margin), Percent(margin))
	}
	return fmt.Sprintf("fits: peak reserved within %s, %s of the %s the allocator can use (a %s margin; tight: no OOM, but inside it)",
		units.FormatSize(Limit(usable, margin)), Percent(1-margin), units.FormatSize(usable), Percent(margin))
}

// Percent prints a share as a percentage, whole when it is: "5%", "2.5%".
func Percent(share float64) string {
	p := 100 * share
	if r := math.Round(p); math.Abs(p-r) < 1e-9 {
		return fmt.Sprintf("%.0f%%", r)
	}
	return fmt.Sprintf("%.1f%%", p)
}
