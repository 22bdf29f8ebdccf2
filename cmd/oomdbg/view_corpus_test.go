package main

import (
	"context"
	"fmt"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/internal/backend"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/tui/tuitest"
)

// TestViewEveryKeyOnTheHostileCorpus opens every file of the hostile corpus as view does, held whole and
// paged (where its content, not damage, is the attack), and presses every key of every pane on each that
// opens: a file that
// lies about its sizes (blocks of exabytes, sums past int64), its devices or its workload must be drawn,
// stepped through and re-run without a panic, a line wider than the terminal, or a command that never ends.
// The files view refuses are the corpus test's (one line, exit 2).
func TestViewEveryKeyOnTheHostileCorpus(t *testing.T) {
	if testing.Short() {
		t.Skip("presses thousands of keys on each of the corpus's files")
	}
	dir := t.TempDir()
	attacks := hostileCorpus(t, dir, filepath.Join(dir, "reference.oomdbg"))
	var opened atomic.Int64
	t.Run("files", func(t *testing.T) {
		for _, a := range attacks {
			if a.fifo != nil || a.stdin != "" { // a stream of the reference file
				continue
			}
			for _, paged := range []bool{false, true} {
				if paged && (a.class == "truncation" || a.class == "byte flip") {
					continue // a damaged recording is read as far as it goes, paged or not: held whole is enough
				}
				t.Run(fmt.Sprintf("%s/%s/paged=%v", a.class, a.name, paged), func(t *testing.T) {
					t.Parallel()
					var mem memory
					if err := mem.Set("256MiB"); err != nil {
						t.Fatal(err)
					}
					opts, closeIn, err := viewOptions(context.Background(), a.path, false, 0, &mem)
					if err != nil {
						return // refused: the corpus test holds the message and the exit code
					}
					defer closeIn()
					if paged {
						if opts.Snapshot != nil { // imported whole: only oomdbg's own are paged
							return
						}
						opts.MemoryBudget = 1
					}
					opened.Add(1)
					opts.Backend, opts.Profile = backend.Backend{Version: "test"}, colorprofile.Ascii
					d := tuitest.NewDriver(t, tui.New(context.Background(), opts), 80, 24)
					d.Finish(time.Minute)
					tuitest.EveryKey(t, d, 1, time.Millisecond)
					d.Finish(time.Minute)
				})
			}
		}
	})
	t.Logf("%d views of the corpus's %d files: each file that opens held whole, and paged where it is oomdbg's own and its content the attack", opened.Load(), len(attacks))
}
