package main

import (
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/internal/backend"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/tui/tuitest"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestPagedViewHoldsItsBudget opens a recording of a million events as view does at the least --max-memory,
// moves the cursor across it so that windows are read back, and holds what the TUI keeps on the heap, by the
// Go runtime's own accounting after a collection, to the budget: a paged view that held a window of three
// million-event pages, whatever the budget, kept several times it.
func TestPagedViewHoldsItsBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("records and pages a million-event run")
	}
	cfg, err := train.PresetConfig("gpt2-small")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Steps, cfg.GPUMemory = 300, 80<<30
	w, err := backend.Workload(cfg)
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "long.oomdbg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := (backend.Backend{Version: "test"}).Record(context.Background(), w, f); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	var mem memory
	if err := mem.Set("16MiB"); err != nil {
		t.Fatal(err)
	}
	budget := int64(mem.Bytes)
	opts, closeIn, err := viewOptions(context.Background(), path, false, 0, &mem)
	if err != nil {
		t.Fatal(err)
	}
	defer closeIn()
	// viewOptions gives the runtime the limit, as view does; the other tests run without it.
	defer debug.SetMemoryLimit(debug.SetMemoryLimit(-1))
	heap := func() int64 {
		runtime.GC()
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		return int64(ms.HeapAlloc)
	}
	before := heap()
	opts.Profile = colorprofile.Ascii // no Backend: the fixes pane's measurements are not the view's to hold
	m := tui.New(context.Background(), opts)
	d := tuitest.NewDriver(t, m, 80, 24)
	d.Finish(time.Minute)
	held := heap() - before
	for _, k := range []string{"end", "home", "p", "o", "}", "G", "g"} {
		key, ok := tuitest.Key(k)
		if !ok {
			t.Fatalf("no key %q", k)
		}
		d.Press(key, 10*time.Millisecond)
		d.Finish(time.Minute)
		held = max(held, heap()-before)
	}
	runtime.KeepAlive(m)
	if held > budget {
		t.Errorf("the paged view holds %s on the heap at --max-memory %s", units.FormatSize(held), units.FormatSize(budget))
	}
	t.Logf("held %s at --max-memory %s", units.FormatSize(held), units.FormatSize(budget))
}
