package backend

import (
	"context"
	"fmt"
	"math"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/allocator/replay"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/whatif"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// ServeOOM implements triage.Replayer: it replays a snapshot's trace up to its OOM through the allocator
// model (allocator/replay), under the recorded settings and the allocator settings among
// train.SettingsFixes, then the trace changed by each of the what-if's fixes of the program. The work is the file's: a replay walks the trace once per setting, and a trace whose
// copy would not fit ReplayBudget is refused.
func (b Backend) ServeOOM(ctx context.Context, s *snapshot.Snapshot) (*triage.Replays, error) {
	if lim := b.ReplayBudget; lim.Memory > 0 {
		if need := int64(s.Events.Len()) * lim.PerEvent; need > lim.Memory {
			return nil, fmt.Errorf("replaying %d events needs about %s, more than --max-memory", s.Events.Len(), units.FormatSize(need))
		}
	}
	recorded, _ := replay.RecordedSettings(s)
	names, cfgs := replaySettings(recorded)
	served, capacity, err := replay.ServeOOM(s, append([]allocator.Config{recorded}, cfgs...), 0)
	if err != nil || served == nil {
		return nil, err
	}
	rs := &triage.Replays{Note: "replayed on the " + units.FormatSize(int64(capacity)) + " the allocator could have",
		Recorded: replayed(recorded.String(), served[0])}
	for i, sv := range served[1:] {
		rs.Tried = append(rs.Tried, replayed(names[i], sv))
	}
	traceFixes(ctx, s, rs)
	return rs, nil
}

// traceFixes replays the what-if's fixes of the program (whatif.Catalogue, but for its allocator settings,
// which ServeOOM replays) on the trace, on the device that ran out of memory, into rs. A fix the trace
// cannot take is left out; a what-if that cannot run at all leaves rs.Fixes empty.
func traceFixes(ctx context.Context, s *snapshot.Snapshot, rs *triage.Replays) {
	var fixes []whatif.Fix
	for _, f := range whatif.Catalogue() {
		if len(f.Transforms) > 0 && f.AllocConf == nil {
			fixes = append(fixes, f)
		}
	}
	b, outs, err := whatif.EvaluateAll(ctx, s, fixes, 0)
	if err != nil {
		return
	}
	w := b.Worst
	rs.Before = triage.TraceFix{Fix: "as recorded", PeakAllocated: w.Outcome.PeakAllocated, PeakReserved: w.Outcome.PeakReserved}
	rs.FixesNote = fmt.Sprintf("fixes of the program: the trace changed as each changes the program's requests and replayed "+
		"on device %d's %s (%s), saving is the drop in its peak allocated memory up to where the recording ends",
		w.Device, units.FormatSize(int64(w.Capacity)), w.CapacityFrom)
	for _, o := range outs {
		if o.Err != nil {
			continue
		}
		f := triage.TraceFix{Fix: o.Fix.Name, PeakAllocated: o.Report.After.PeakAllocated, PeakReserved: o.Report.After.PeakReserved,
			Verdict: o.Report.Verdict}
		if len(o.Report.Assumptions) > 0 {
			f.Assumption = o.Report.Assumptions[0]
		}
		rs.Fixes = append(rs.Fixes, f)
	}
}

func replayed(name string, sv replay.Served) triage.Replayed {
	return triage.Replayed{Settings: name, Served: sv.Served, FailedEarlier: sv.FailedEarlier, PeakReserved: sv.PeakReserved}
}

// replaySettings returns the allocator settings of train.SettingsFixes, each on top of the recorded ones, and
// their names: the fixes that change only the allocator's settings (empty_cache and the data's shapes change
// the program, which a trace cannot replay).
func replaySettings(recorded allocator.Config) (names []string, cfgs []allocator.Config) {
	for _, f := range train.SettingsFixes {
		base := train.Config{AllocConf: train.AllocConf{Config: recorded}, GPUMemory: 1 << 40}
		c := base
		f.Apply(&c)
		if c.EmptyCache != base.EmptyCache || c.Padding != base.Padding || c.SortByLength != base.SortByLength ||
			c.AllocConf.String() == base.AllocConf.String() {
			continue
		}
		cfg := c.AllocConf.Config
		if cfg.GarbageCollectionThreshold > 0 && cfg.PerProcessMemoryFraction >= 1 {
			// The replay's device is the memory the allocator could have, so the fraction that keeps
			// garbage collection acting (it needs one below 1) is the largest below 1.
			cfg.PerProcessMemoryFraction = math.Nextafter(1, 0)
		}
		names = append(names, f.Name)
		cfgs = append(cfgs, cfg)
	}
	return names, cfgs
}
