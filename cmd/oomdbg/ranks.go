package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"sync"

	"github.com/spf13/cobra"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/load"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/triage"
)

// reportRanks reports each rank's snapshot of a data-parallel job and puts them side by side. The files are
// read and analysed in parallel, one per core, each worker within an equal share of --max-memory; only the
// reports are kept, so memory holds the snapshots being read and not all of them. A file that cannot be
// read is a row that says so: one bad rank does not hide the others.
func reportRanks(ctx context.Context, files []string, mem *memory, warmup int) *triage.RankTable {
	workers := min(runtime.GOMAXPROCS(0), len(files))
	budget := mem.Budget(costAnalyse)
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
				s, err := load.File(files[i], load.WithBudget(budget))
				if err != nil && (s == nil || !load.Partial(s.Events.Len(), err)) {
					errs[i] = mem.Explain(err)
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

// snapshotArgs accepts one snapshot file or several (a job's ranks).
func snapshotArgs(_ *cobra.Command, args []string) error {
	if len(args) == 0 {
		return fmt.Errorf("give a snapshot file, or several: the ranks of a job")
	}
	return nil
}

// rankWriter returns the writer of a rank table in a report format.
func rankWriter(format string) (func(*triage.RankTable, io.Writer) error, error) {
	return formatWriter(format, (*triage.RankTable).WriteText, (*triage.RankTable).WriteMarkdown, (*triage.RankTable).WriteJSON)
}
