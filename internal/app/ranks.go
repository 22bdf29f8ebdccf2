package app

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"strings"
	"sync"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// ReportRanks reports each rank's snapshot of a data-parallel job and puts them side by side. The files are
// read and analysed in parallel, one per core, each worker within an equal share of lim; of each report only
// what its row needs is kept (Report.ForRanks), so memory holds the snapshots being read and not all of them,
// and does not grow with the ranks. The two ranks the table then compares in detail are read again, whole. A
// file that cannot be read is a row that says so: one bad rank does not hide the others. The problem is that
// of ReportProblem, for the job: the ranks that ran out of memory, else those that leak; nil when none did. capacity is --gpu-mem's (GiveCapacity).
func ReportRanks(ctx context.Context, files []string, lim *hostmem.Limit, capacity uint64, warmup int) (*triage.RankTable, error) {
	workers := min(runtime.GOMAXPROCS(0), len(files))
	budget := lim.Budget(load.CostAnalyse)
	budget.Memory /= int64(workers)
	reports := make([]*triage.Report, len(files))
	errs := make([]error, len(files))
	jobs := make([]job, len(files))
	report := func(i int) (*triage.Report, job, error) {
		s, _, err := open(files[i], lim, budget)
		if err == nil {
			err = GiveCapacity(s, capacity)
		}
		if err != nil {
			return nil, job{}, err
		}
		return triage.Analyze(ctx, timeline.New(s), triage.Options{File: files[i],
			Leaks: []leaks.Option{leaks.Warmup(warmup)}}), jobOf(s.Meta), nil
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, j, err := report(i)
				reports[i], jobs[i], errs[i] = r, j, err
				if err == nil && rereadable(files[i]) { // a pipe's report stays whole: it cannot be read twice
					reports[i] = r.ForRanks()
				}
			}
		}()
	}
	for i := range files {
		next <- i
	}
	close(next)
	wg.Wait()
	t := triage.CompareRanks(files, reports, errs)
	problem := ranksProblem(reports)
	if t.Worst >= 0 && t.Worst != t.Typical {
		for _, i := range []int{t.Typical, t.Worst} {
			if r, _, err := report(i); err == nil {
				reports[i] = r
			}
		}
		t = triage.CompareRanks(files, reports, errs)
	}
	t.Warnings = append(t.Warnings, jobWarnings(t, jobs)...)
	return t, problem
}

// ranksProblem says which of a job's ranks ran out of memory, else which leak (ReportProblem), of the ranks
// that could tell: a file cut short before an OOM cannot say whether its rank ran out.
func ranksProblem(reports []*triage.Report) error {
	var oom, leak []string
	read := 0
	for _, r := range reports {
		if r == nil || r.OOM == nil && !r.Source.Complete {
			continue
		}
		read++
		switch {
		case r.OOM != nil:
			oom = append(oom, r.Source.File)
		case r.Leaks.Verdict == string(leaks.Leak):
			leak = append(leak, r.Source.File)
		}
	}
	switch {
	case len(oom) > 0:
		return &ProblemError{Msg: fmt.Sprintf("%d of the %d ranks read to the end ran out of memory (%s)", len(oom), read, listFiles(oom))}
	case len(leak) > 0:
		return &ProblemError{Msg: fmt.Sprintf("%d of the %d ranks read to the end leak (%s)", len(leak), read, listFiles(leak))}
	}
	return nil
}

// listFiles names up to three files, and how many more.
func listFiles(files []string) string {
	const shown = 3
	if len(files) <= shown {
		return strings.Join(files, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(files[:shown], ", "), len(files)-shown)
}

// rereadable reports whether path names a regular file, which can be read a second time.
func rereadable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
