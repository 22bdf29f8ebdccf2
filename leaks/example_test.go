package leaks_test

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// A generated GPT training loop that keeps every iteration's loss in a list.
func leakyLoop() snapshottest.Config {
	cfg := snapshottest.Tiny()
	cfg.Iterations, cfg.LeakLoss = 8, true
	return cfg
}

// printer is a stand-in for *testing.T that prints the first line of what a check reports.
type printer struct{}

func (printer) Helper() {}
func (printer) Errorf(format string, args ...any) {
	first, _, _ := strings.Cut(fmt.Sprintf(format, args...), "\n")
	fmt.Println("FAIL:", first)
}

func ExampleFind() {
	r := leaks.Find(snapshottest.Trace(leakyLoop()))
	fmt.Println(r.Verdict, r.Kind)
	sp := r.Suspects[0]
	fmt.Printf("%d bytes per iteration of %s, retained by %s\n", sp.BytesPerIteration, sp.Category, sp.RetainedBy)
	// Output:
	// leak stashed_outputs
	// 512 bytes per iteration of activation, retained by loss_history[6]
}

// Check is the test API: in a test, pass the *testing.T.
func ExampleCheck() {
	t := printer{} // in a test: t *testing.T
	leaks.Check(t, snapshottest.Trace(leakyLoop()))
	leaks.Check(t, snapshottest.Trace(leakyLoop()), leaks.MaxGrowth(1<<10)) // up to 1 KiB per iteration is fine
	leaks.Check(t, snapshottest.Trace(snapshottest.Tiny()), leaks.Warmup(1))
	// Output:
	// FAIL: leak: allocated memory grows 512 B per iteration over iterations 2-7 (stashed outputs: 1 suspect, the largest 512 B per iteration of activation in loss at nn.CrossEntropy loss.go:22, retained by loss_history[6])
}

func ExampleVerify() {
	err := leaks.Verify(snapshottest.Trace(leakyLoop()), leaks.MaxGrowth(256), leaks.MaxPeak(64<<20))
	reason, _, _ := strings.Cut(err.Error(), "\n")
	fmt.Println(reason)
	// Output:
	// leak: allocated memory grows 512 B per iteration over iterations 2-7 (stashed outputs: 1 suspect, the largest 512 B per iteration of activation in loss at nn.CrossEntropy loss.go:22, retained by loss_history[6]), over the limit of 256 B per iteration
}

// Filter keeps the suspects a test cares about, like pytest-memray's filter_fn.
func ExampleFilter() {
	onlyModel := leaks.Filter(func(s *leaks.Suspect) bool { return strings.HasPrefix(s.Scope, "blocks.") })
	fmt.Println(leaks.Verify(snapshottest.Trace(leakyLoop()), onlyModel))
	// Output:
	// <nil>
}
