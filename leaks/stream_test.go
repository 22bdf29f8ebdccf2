package leaks_test

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"testing"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/snapshot/timeline"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// TestStreamAgreesWithAnalyze scans recordings page by page, pages of many sizes, with a Stream, and checks
// the Result is what Analyze finds on the whole run's Timeline: verdict, reason, points, suspects, groups
// held and the finding on gradients.
func TestStreamAgreesWithAnalyze(t *testing.T) {
	leak := snapshottest.Tiny()
	leak.Iterations, leak.LeakLoss = 12, true
	long := snapshottest.Tiny()
	long.Iterations = 300 // more iterations than Analyze measures
	retain := train.DefaultMLP()
	retain.Steps, retain.Bug = 8, train.BugRetainGraph
	noZeroGrad := train.DefaultMLP()
	noZeroGrad.Steps, noZeroGrad.Bug = 8, train.BugNoZeroGrad
	oom, _ := train.PresetConfig("tiny")
	oom.Steps, oom.GPUMemory, oom.ContextReserve, oom.Bug = 8, 40<<20, 4<<20, train.BugRetainGraph
	runs := map[string]func(t *testing.T) []byte{
		"leak to an OOM": func(t *testing.T) []byte {
			b, _, err := leakstest.Encode(context.Background(), oom)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"leak":          func(t *testing.T) []byte { return encode(t, leak) },
		"no leak, long": func(t *testing.T) []byte { return encode(t, long) },
		"retain-graph": func(t *testing.T) []byte {
			b, _, err := leakstest.Encode(context.Background(), retain)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"no zero_grad": func(t *testing.T) []byte {
			b, _, err := leakstest.Encode(context.Background(), noZeroGrad)
			if err != nil {
				t.Fatal(err)
			}
			return b
		},
		"fragmentation": func(t *testing.T) []byte {
			var b bytes.Buffer
			if err := leakstest.EncodeFragmentation(&b, 10); err != nil {
				t.Fatal(err)
			}
			return b.Bytes()
		},
	}
	for name, run := range runs {
		data := run(t)
		whole, err := snapshot.Read(bytes.NewReader(data))
		if err != nil {
			t.Fatal(err)
		}
		if name == "no zero_grad" && leaks.Analyze(timeline.New(whole)).Gradients == nil {
			t.Fatal("no zero_grad: Analyze finds the gradients cleared")
		}
		for _, warmup := range []int{0, 2} {
			want := leaks.Analyze(timeline.New(whole), leaks.Warmup(warmup))
			t.Logf("%s, warm-up %d: %s", name, warmup, want.Reason)
			for _, page := range []int{1, 500, 3000, 1 << 30} {
				t.Run(fmt.Sprintf("%s/warmup %d/pages of %d", name, warmup, page), func(t *testing.T) {
					r, err := snapshot.NewReader(bytes.NewReader(data))
					if err != nil {
						t.Fatal(err)
					}
					st := leaks.NewStream(leaks.Warmup(warmup))
					pages := 0
					s, err := timeline.Scan(r, page, func(tl *timeline.Timeline) {
						st.Observe(tl)
						pages++
					})
					if err != nil {
						t.Fatal(err)
					}
					got := st.Result(s)
					if page == 1 && pages < 10 {
						t.Fatalf("only %d pages", pages)
					}
					if got.Verdict != want.Verdict || got.Reason != want.Reason || got.Detail() != want.Detail() ||
						got.PeakAllocated != want.PeakAllocated || got.Iterations != want.Iterations ||
						got.HeldBytes != want.HeldBytes || !reflect.DeepEqual(got.Gradients, want.Gradients) {
						t.Errorf("over %d pages:\n%s\n%s\nwant\n%s\n%s", pages, got.Reason, got.Detail(), want.Reason, want.Detail())
					}
				})
			}
		}
	}
}

func encode(t *testing.T, cfg snapshottest.Config) []byte {
	t.Helper()
	var b bytes.Buffer
	if err := snapshottest.Encode(&b, cfg); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}
