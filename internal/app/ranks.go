package app

import (
	"context"
	"os"
	"runtime"
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
// file that cannot be read is a row that says so: one bad rank does not hide the others.
func ReportRanks(ctx context.Context, files []string, lim *hostmem.Limit, warmup int) *triage.RankTable {
	workers := min(runtime.GOMAXPROCS(0), len(files))
	budget := lim.Budget(load.CostAnalyse)
	budget.Memory /= int64(workers)
	reports := make([]*triage.Report, len(files))
	errs := make([]error, len(files))
	report := func(i int) (*triage.Report, error) {
		s, _, err := open(files[i], lim, budget)
		if err != nil {
			return nil, err
		}
		return triage.Analyze(ctx, timeline.New(s), triage.Options{File: files[i],
			Leaks: []leaks.Option{leaks.Warmup(warmup)}}), nil
	}
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				r, err := report(i)
				reports[i], errs[i] = r, err
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
	if t.Worst < 0 || t.Worst == t.Typical {
		return t
	}
	for _, i := range []int{t.Typical, t.Worst} {
		if r, err := report(i); err == nil {
			reports[i] = r
		}
	}
	return triage.CompareRanks(files, reports, errs)
}

// rereadable reports whether path names a regular file, which can be read a second time.
func rereadable(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}
