package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/oomdbg/oomdbg/leaks/leakstest"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
	"github.com/oomdbg/oomdbg/workloads/train"
)

// memoryAttacks are the corpus's attacks on memory and time: inputs that expand, traces whose transformations
// multiply them, final states of hundreds of thousands of segments, jobs of hundreds of ranks, exports that
// would outgrow the disk. Each runs the commands it attacks under a --max-memory it must hold.
func memoryAttacks(t *testing.T, dir string, n *int, small []byte) []attack {
	t.Helper()
	write := func(data []byte) string {
		*n++
		path := filepath.Join(dir, fmt.Sprintf("%03d.bin", *n))
		if err := os.WriteFile(path, data, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	var attacks []attack
	add := func(class, name, budget string, path string, runs ...[]string) {
		attacks = append(attacks, attack{class: class, name: name, path: path, budget: budget, runs: runs})
	}
	every := func(path string) [][]string { // the commands that import a file and analyse it
		return [][]string{{"report", path}, {"check", path}, {"replay", path}, {"whatif", path, "--checkpoint", "all", "--batch-scale", "0.5"}}
	}

	// A trace of millions of memo references to one entry: 5 bytes an entry in the file, hundreds in memory.
	memo5m := write(snapshottest.RepeatedEntry(5_000_000, 0))
	add("expanding pickle", "5M references to one entry, in 256 MiB", "256MiB", memo5m, every(memo5m)...)
	add("expanding pickle", "5M references to one entry, in 900 MiB", "900MiB", memo5m, []string{"report", memo5m})
	memo1m := write(snapshottest.RepeatedEntry(1_000_000, 0))
	add("expanding pickle", "1M references to one entry, in 512 MiB", "512MiB", memo1m, every(memo1m)...)
	// 150,000 references to an entry with a 60-frame stack: 760 KB of pickle, 1.26 GiB of JSON.
	jsonBomb := write(snapshottest.RepeatedEntry(150_000, 60))
	add("expanding pickle", "a JSON export of 1.26 GiB from 760 KB", "256MiB", jsonBomb,
		[]string{"export", jsonBomb, "--format", "torch-json", "-o", filepath.Join(dir, "bomb.json")})

	// A final state of 200,000 segments from before the trace: the replay rebuilds every one.
	segs := write(snapshottest.ManySegments(200_000))
	add("many segments", "200k segments before the trace", "768MiB", segs, []string{"replay", segs}, []string{"report", segs})

	// What-ifs whose transformations multiply the trace: accumulation's repeats at both ends of checkpointing,
	// copied again by zero_grad; admitted where the cost allows them, and held to the limit.
	rec, _, err := leakstest.Encode(context.Background(), func() train.Config {
		c, _ := train.PresetConfig("gpt2-small")
		c.Steps, c.GPUMemory = 10, 80<<30
		return c
	}())
	if err != nil {
		t.Fatal(err)
	}
	gpt := write(rec)
	for _, budget := range []string{"256MiB", "512MiB"} {
		add("multiplying what-if", "accumulate 8, checkpoint all, zero_grad zero, in "+budget, budget, gpt,
			[]string{"whatif", gpt, "--accum", "8", "--checkpoint", "all", "--zero-grad", "zero"},
			[]string{"whatif", gpt, "--accum", "20", "--checkpoint", "all", "--zero-grad", "zero"})
	}

	// A job of 300 ranks reported side by side, in the least memory --max-memory allows.
	ranks := []string{"report"}
	for i := range 300 {
		p := filepath.Join(dir, fmt.Sprintf("job.rank%d.oomdbg", i))
		if err := os.WriteFile(p, small, 0o644); err != nil {
			t.Fatal(err)
		}
		ranks = append(ranks, p)
	}
	add("many ranks", "300 rank files in 16 MiB", "16MiB", ranks[1], ranks)
	return attacks
}
