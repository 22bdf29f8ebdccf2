package app

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/internal/outfile"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/tracer/nvml"
	"github.com/oomdbg/oomdbg/triage"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// Recording is where Record writes a run, and what it may do there.
type Recording struct {
	Path    string         // -o: a file, or "-" for standard output (outfile's policy)
	Force   bool           // --force: through links, over read-only files
	Memory  *hostmem.Limit // --max-memory, for the cpu device's host memory (nil: not checked)
	Version string         // oomdbg's version, written into the snapshot
	Job     string         // the job the run is a rank of (snapshot.Meta.Job); RecordRanks sets it
	// Progress, when set, is a terminal (standard error) that shows the run's progress on one line.
	Progress io.Writer
}

// progressInterval is how often the progress line is redrawn: often enough to see it move, seldom enough
// to cost nothing beside a step.
const progressInterval = 100 * time.Millisecond

// Record records cfg into rec's file and prints the summary, on stdout unless the snapshot goes there. The
// configuration is validated once, by train.Record, before the file is touched. SIGINT, SIGTERM and SIGHUP
// stop the run at the next step with the snapshot complete, and the error is then a *SignalError; a run
// that ran out of memory is a *ProblemError.
func Record(ctx context.Context, cfg train.Config, rec Recording, stdout, stderr io.Writer) error {
	o, err := outfile.Check(rec.Path, rec.Force, true)
	if err != nil {
		return err
	}
	summary := stdout
	if o.Kind == outfile.Stdout {
		summary = stderr
	}
	if cfg.Device == device.CPU && rec.Memory != nil {
		if err := checkHostMemory(ctx, cfg, rec.Memory, stderr); err != nil {
			return err
		}
	}
	w, closeOut, err := o.Stream(stdout)
	if err != nil {
		return err
	}
	ctx, caught, stopSignals := StopOnSignals(ctx)
	defer stopSignals()
	// A write that fails (a full disk, a file-size limit) stops the run at its next phase: what it would
	// record after has nowhere to go.
	ctx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	// No buffer between the recorder and the file: each chunk reaches the file (or pipe) when it is cut, so
	// a process killed at any moment leaves what it recorded until the last chunk.
	cw := &countingWriter{w: w, failed: stopRun}
	opts := train.RecordOptions{ToolVersion: rec.Version, OnStart: nvmlSamples(ctx, cfg, stderr), FlushEvery: train.DefaultFlushEvery, Job: rec.Job}
	var progress *progressLine
	if rec.Progress != nil {
		progress = newProgressLine(rec.Progress, progressInterval, cfg.Device == device.CPU)
		opts.Progress = progress.step
	}
	res, err := train.Record(ctx, cfg, cw, opts)
	if progress != nil {
		progress.clear() // before the summary and any error line take the terminal
	}
	if cerr := closeOut(); err == nil {
		err = cerr
	}
	name := rec.Path
	if o.Kind == outfile.Stdout {
		name = "standard output"
	}
	var oe *outfile.OpenError
	var pe *fs.PathError
	switch {
	case errors.As(err, &oe):
		return oe
	case cw.err != nil && res != nil:
		// The writes failed part-way: the file holds the chunks written before, which say what ran.
		WriteRunSummary(summary, cfg, res, name, cw.n)
		return fmt.Errorf("cannot write %s after %s: %v; the run stopped at step %d of %d, and the file holds what was written before",
			name, units.FormatSize(cw.n), pathCause(cw.err), res.Steps, cfg.Steps)
	case errors.As(err, &pe):
		return fmt.Errorf("cannot write %s: %w", name, pe.Err)
	case err != nil:
		return err
	}
	WriteRunSummary(summary, cfg, res, name, cw.n)
	var leak error
	if (o.Kind == outfile.New || o.Kind == outfile.Regular) && res.OOM == nil {
		leak = writeLeakVerdict(summary, rec.Path)
	}
	if sig := caught(); sig != nil {
		return &SignalError{Sig: sig, Then: fmt.Sprintf("the snapshot %s is complete up to then", name)}
	}
	if res.OOM != nil {
		return &ProblemError{Msg: fmt.Sprintf("out of memory in iteration %d, %s (snapshot %s)", res.OOM.Iteration, res.OOM.Phase, name)}
	}
	return leak
}

// RecordRanks records rank 0 and every rank of cfg's job whose memory differs (train.DistinctRanks), each into
// rec's path with .rankN before its extension, under one job identifier (snapshot.Meta.Job). The rank files
// an earlier job left under the same name are removed first, so that job.rank*.oomdbg names this job's
// ranks alone. The error is that of the last rank that found a problem, or the first that failed otherwise.
func RecordRanks(ctx context.Context, cfg train.Config, rec Recording, stdout, stderr io.Writer) error {
	if rec.Path == "-" || rec.Path == "/dev/stdout" {
		return fmt.Errorf("--ranks uneven writes one file per rank: give -o a file name")
	}
	ranks, err := train.DistinctRanks(cfg)
	if err != nil {
		return err
	}
	if err := removeRankFiles(rec.Path, ranks, rec.Force, stderr); err != nil {
		return err
	}
	rec.Job = newJobID()
	var last error
	for _, r := range ranks {
		c := cfg
		c.Parallel.Rank = r
		to := rec
		to.Path = rankPath(rec.Path, r)
		if err := Record(ctx, c, to, stdout, stderr); err != nil {
			var pe *ProblemError
			if !errors.As(err, &pe) {
				return err
			}
			last = err
		}
	}
	return last
}

// rankPath is where rank r of a job recorded into path goes: job.oomdbg -> job.rank3.oomdbg.
func rankPath(path string, r int) string {
	ext := filepath.Ext(path)
	return fmt.Sprintf("%s.rank%d%s", strings.TrimSuffix(path, ext), r, ext)
}

// removeRankFiles removes the rank files an earlier job recorded into path left (rankPath's names) that the
// ranks about to be recorded will not replace, saying so on stderr. Each is held to -o's policy first: a
// link or a read-only file goes only with force, anything but a regular file never.
func removeRankFiles(path string, ranks []int, force bool, stderr io.Writer) error {
	ext := filepath.Ext(path)
	pattern := regexp.MustCompile("^" + regexp.QuoteMeta(filepath.Base(strings.TrimSuffix(path, ext))) + `\.rank(\d+)` + regexp.QuoteMeta(ext) + "$")
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		return nil // the directory is not there yet: the first rank's write says what is wrong
	}
	var removed []string
	for _, e := range entries {
		m := pattern.FindStringSubmatch(e.Name())
		if m == nil || slices.Contains(ranks, atoi(m[1])) {
			continue
		}
		old := filepath.Join(filepath.Dir(path), e.Name())
		if _, err := outfile.Check(old, force, false); err != nil {
			return fmt.Errorf("an earlier job's rank file is in the way: %w", err)
		}
		if err := os.Remove(old); err != nil {
			return fmt.Errorf("cannot remove %s, an earlier job's rank: %w", old, pathCause(err))
		}
		removed = append(removed, old)
	}
	if len(removed) > 0 {
		fmt.Fprintf(stderr, "oomdbg: removed %s, the rank files of an earlier job\n", listFiles(removed))
	}
	return nil
}

// atoi is the number of digits, -1 past int's range.
func atoi(digits string) int {
	n, err := strconv.Atoi(digits)
	if err != nil {
		return -1
	}
	return n
}

// newJobID returns an identifier for a job's ranks: random, so that two jobs never share one.
func newJobID() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// RecordDefault is oomdbg without arguments and without a terminal: the default workload (GPT-2 medium at
// batch 16 on a 24 GiB card, which runs out of memory as configured) recorded on the meta device into the
// temporary directory, its summary, and how to go on. The error is Record's: a *ProblemError, since the
// workload runs out of memory.
func RecordDefault(ctx context.Context, version string, stdout, stderr io.Writer) error {
	cfg, err := train.PresetConfig(train.DefaultPreset)
	if err != nil {
		return err
	}
	out := filepath.Join(os.TempDir(), fmt.Sprintf("oomdbg-%s-%d.oomdbg", train.DefaultPreset, os.Getpid()))
	fmt.Fprintf(stdout, "Recording the built-in %s workload on the meta device (see oomdbg --help for everything else).\n\n", train.DefaultPreset)
	err = Record(ctx, cfg, Recording{Path: out, Version: version}, stdout, stderr)
	if _, oom := err.(*ProblemError); oom {
		fmt.Fprintf(stdout, "\nSee what each fix would do:  oomdbg fixes\n")
		fmt.Fprintf(stdout, "Record it fixed:             oomdbg run --preset %s --amp bf16 --attention flash --checkpoint all\n", train.DefaultPreset)
	}
	return err
}

// hostProbeSteps is how many steps the meta device runs to measure a cpu run's memory: the second step
// carries the optimizer's state.
const hostProbeSteps = 2

// checkHostMemory runs before a cpu-device run allocates anything. The cpu device keeps every tensor in host
// memory as float32 (a half-precision tensor takes twice the bytes it accounts on the device), so the run
// needs about the device memory it allocates at its peak: the meta device measures that in milliseconds,
// running the same configuration for up to two steps against the same simulated capacity. A run that needs
// more than --max-memory is refused; otherwise one line on stderr says what it will take.
func checkHostMemory(ctx context.Context, cfg train.Config, lim *hostmem.Limit, stderr io.Writer) error {
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
	limit := lim.Resolve()
	if uint64(need) > limit {
		return fmt.Errorf("the cpu device would hold about %s of tensors in host memory (the run's peak on the meta device), "+
			"more than --max-memory %s: use --device meta, or a smaller model, --batch or --gpu-mem", units.FormatSize(need), units.FormatSize(int64(limit)))
	}
	fmt.Fprintf(stderr, "oomdbg: the cpu device will hold about %s of tensors in host memory (--max-memory %s)\n", units.FormatSize(need), units.FormatSize(int64(limit)))
	return nil
}

// writeLeakVerdict says, under a run's summary, when the snapshot just written fails check's leak verdict,
// so that a leak is named where the run is, not only when asked for; the run then found a problem, which
// it returns. The snapshot is read back as check streams it, in the memory of a few pages.
func writeLeakVerdict(w io.Writer, path string) error {
	r, _, _, _, err := findLeaks(path, &hostmem.Limit{}, []leaks.Option{leaks.Warmup(leaks.DefaultWarmup)})
	if err != nil || r == nil {
		return nil
	}
	c := triage.NewCheck(path, r, triage.CheckLimits{})
	if c.Pass {
		return nil
	}
	fmt.Fprintf(w, "\nleak       %s\n           oomdbg check %s names what holds it; oomdbg view %s shows it\n", c.Reason, path, path)
	return &ProblemError{Msg: fmt.Sprintf("%s leaks: %s", path, firstClause(c.Reason))}
}

// countingWriter passes writes through and counts the bytes. The first write that fails is kept, and
// calls failed.
type countingWriter struct {
	w      io.Writer
	n      int64
	err    error
	failed func()
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	if err != nil && c.err == nil {
		c.err = err
		c.failed()
	}
	return n, err
}

// pathCause is err without the path an *fs.PathError names: the message names the file as the user gave it.
func pathCause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// nvmlSamples returns, for a run on the cuda device, a function that feeds the recorder NVML's reading of
// the GPU's used memory every 100 ms (as sample events), so the snapshot shows what the driver saw next to
// what the allocator held. Simulated devices have nothing to read; without a driver it says so once.
func nvmlSamples(ctx context.Context, cfg train.Config, stderr io.Writer) func(*tracer.Recorder) func() {
	if cfg.Device != device.CUDA {
		return nil
	}
	return func(rec *tracer.Recorder) func() {
		s, err := nvml.Open()
		if err != nil {
			fmt.Fprintf(stderr, "oomdbg: %v; recording without device readings\n", err)
			return func() {}
		}
		sampler := nvml.StartSampler(ctx, s, 0, nvml.DefaultInterval, func(dev int, used, _ uint64, _ time.Time) {
			rec.Sample(dev, "nvml.used", int64(used))
		})
		return func() {
			sampler.Stop()
			s.Close()
		}
	}
}
