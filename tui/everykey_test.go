package tui_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/charmbracelet/colorprofile"

	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tui"
	"github.com/oomdbg/oomdbg/tui/tuitest"
)

// TestEveryKeyOnPagedAndHostileRuns presses every key of every pane, every key after enter, and every key
// after enter and a key again, on runs too long to hold whole (a budget of one byte, pages of a few hundred
// events) and on a run whose sizes overflow int64 when summed. Paged, the window of pages around the cursor
// is all there is of the events: every pane that reaches for one outside it must read it back or say so,
// never index out of it. The recordings are an OOM (the OOM panel, the live set at it) and a leak with its
// suspects and held groups (the Leaks pane's enter); the hostile run holds two blocks of 2^62 bytes, whose
// sum wraps to a negative int64. The command line's tests drive the hostile corpus the same way.
func TestEveryKeyOnPagedAndHostileRuns(t *testing.T) {
	overflow := overflowingRun(t)
	for _, tc := range []struct {
		name       string
		path       string
		budget     int64 // the memory budget: 1 pages the run
		pageEvents int
	}{
		{"tiny-oom paged", filepath.Join("testdata", "fixtures", "tiny-oom.oomdbg"), 1, 300},
		{"gpt-retain-graph paged", filepath.Join("testdata", "fixtures", "gpt-retain-graph.oomdbg"), 1, 500},
		{"sizes that overflow", overflow, 0, 0},
		{"sizes that overflow paged", overflow, 1, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			opts := tui.Options{File: tc.path, Backend: tui.Playback(), Profile: colorprofile.Ascii, MemoryBudget: tc.budget}
			tui.SetPageEvents(&opts, tc.pageEvents)
			d := tuitest.NewDriver(t, tui.New(context.Background(), opts), 80, 24)
			d.Finish(time.Minute)
			tuitest.EveryKey(t, d, 3, 20*time.Millisecond)
			d.Finish(time.Minute)
		})
	}
}

// overflowingRun writes a snapshot whose two live blocks of 2^62 bytes each, in segments of their size, sum
// past the largest int64, as a crafted file may claim; it returns the file's path.
func overflowingRun(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "overflow.oomdbg")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	meta := snapshot.Meta{Tool: "oomdbg", Source: "oomdbg", TimeUnit: "ns",
		Devices: []snapshot.DeviceInfo{{Index: 0, Name: "cuda:0", Kind: "cuda", Capacity: 1<<63 - 1}}}
	w, err := snapshot.NewWriter(f, meta)
	if err != nil {
		t.Fatal(err)
	}
	const huge = 1 << 62
	events := []snapshot.Event{
		{Action: snapshot.ActionPhase, Phase: snapshot.PhaseForward, Iteration: 0},
		{Action: snapshot.ActionSegmentAlloc, Addr: 1 << 20, Size: huge},
		{Action: snapshot.ActionAlloc, Addr: 1 << 20, Size: huge, BlockSize: huge, Category: snapshot.CategoryActivation},
		{Action: snapshot.ActionSegmentAlloc, Addr: 1<<20 + huge, Size: huge},
		{Action: snapshot.ActionAlloc, Addr: 1<<20 + huge, Size: huge, BlockSize: huge, Category: snapshot.CategoryActivation},
		{Action: snapshot.ActionPhase, Phase: snapshot.PhaseBackward, Iteration: 0},
		{Action: snapshot.ActionAlloc, Addr: 1 << 19, Size: 512, BlockSize: 512, Category: snapshot.CategoryGradient},
	}
	for i := range events {
		events[i].Time = int64(i)
		if err := w.Write(&events[i]); err != nil {
			t.Fatalf("event %d: %v", i, err)
		}
	}
	if err := w.Close(nil); err != nil {
		t.Fatal(err)
	}
	return path
}
