package leakstest_test

import (
	"fmt"
	"strings"

	"github.com/oomdbg/oomdbg/leaks"
	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// printer is a stand-in for *testing.T that prints the start of a failure's first line.
type printer struct{}

func (printer) Helper() {}
func (printer) Errorf(format string, args ...any) {
	first, _, _ := strings.Cut(fmt.Sprintf(format, args...), "\n")
	verdict, _, _ := strings.Cut(first, " (")
	fmt.Println("FAIL:", verdict)
}
func (p printer) Fatalf(format string, args ...any) { p.Errorf(format, args...) }

// In a test, pass t: CheckWorkload records the configuration and fails the test on a leak.
func ExampleCheckWorkload() {
	t := printer{} // in a test: t *testing.T
	cfg := train.DefaultMLP()
	cfg.Steps = 8
	leakstest.CheckWorkload(t, cfg) // the fixed code path passes

	cfg.Bug = train.BugRetainGraph // loss.backward(retain_graph=True); loss_history.append(loss)
	leakstest.CheckWorkload(t, cfg)
	// Output:
	// FAIL: leak: allocated memory grows 75.50 KiB per iteration over iterations 2-7
}

func ExampleRecord() {
	cfg := train.DefaultMLP()
	cfg.Steps, cfg.Bug = 8, train.BugStashActivations
	r := leaks.Find(leakstest.Record(printer{}, cfg))
	for _, sp := range r.Suspects {
		fmt.Printf("%s: %s per iteration of %s in %s, retained by %s\n", sp.Kind.Describe(),
			fmt.Sprint(sp.BytesPerIteration), sp.Category, sp.Scope, sp.RetainedBy.Root)
	}
	// Output:
	// stashed outputs: 32768 per iteration of activation in net.1, retained by activation_stash[12]
	// stashed outputs: 32768 per iteration of activation in net.3, retained by activation_stash[13]
}

func ExampleFragmentation() {
	r := leaks.Find(leakstest.Fragmentation(printer{}, 8))
	fmt.Println(r.Reason)
	// Output:
	// fragmentation, not a leak: reserved memory grows 119.33 MiB per iteration over iterations 2-7 while allocated memory does not (0 B per iteration)
}
