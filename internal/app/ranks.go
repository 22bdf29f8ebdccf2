package app

import (
	"context"
	"runtime"
	"sync"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// ReportRanks reports each rank's snapshot of a data-parallel job and puts them side by side. The files are
// read and analysed in parallel, one per core, each worker within an equal share of lim; only the reports
// are kept, so memory holds the snapshots being read and not all of them. A file that cannot be read is a
// row that says so: one bad rank does not hide the others. capacity is --gpu-mem's (GiveCapacity).
func ReportRanks(ctx context.Context, files []string, lim *hostmem.Limit, capacity uint64, warmup int) *triage.RankTable {
	workers := min(runtime.GOMAXPROCS(0), len(files))
	budget := lim.Budget(load.CostAnalyse)
	budget.Memory /= int64(workers)
	reports := make([]*triage.Report, len(files))
	errs := make([]error, len(files))
	next := make(chan int)
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				s, _, err := open(files[i], lim, budget)
				if err == nil {
					err = GiveCapacity(s, capacity)
				}
				if err != nil {
					errs[i] = err
					continue
				}
				reports[i] = triage.Analyze(ctx, timeline.New(s), triage.Options{File: files[i],
					Leaks: []leaks.Option{leaks.Warmup(warmup)}})
			}
		}()
	}
	for i := range files {
		next <- i
	}
	close(next)
	wg.Wait()
	return triage.CompareRanks(files, reports, errs)
}
