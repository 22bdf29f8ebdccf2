package app

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/snapshot/snapshottest"
)

// TestJSONExportPastTheLimitRefusedWithItsSize: a 760 KB pickle whose trace repeats one entry, with a stack of
// 60 frames, 150,000 times through its memo becomes 1.26 GiB as JSON, which repeats every stack in full. The
// export says so and writes nothing, before it has written a byte; --force writes it (TestJSONSizeCheck).
func TestJSONExportPastTheLimitRefusedWithItsSize(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "repeated.pickle")
	if err := os.WriteFile(in, snapshottest.RepeatedEntry(150_000, 60), 0o644); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "out.json")
	var stdout, stderr bytes.Buffer
	err := Export(ExportRequest{In: in, Out: out, Format: "torch-json", Memory: &hostmem.Limit{}}, &stdout, &stderr)
	if err == nil || !strings.Contains(err.Error(), "would take 1.26 GiB") || !strings.Contains(err.Error(), "--force") {
		t.Fatalf("err = %v; want the refusal, with the size and --force", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d files after the refusal; want the input alone", len(entries))
	}
}

// TestJSONSizeCheck: a JSON export is said before it is written past 64 MiB, refused past 1 GiB, and
// written past it with --force.
func TestJSONSizeCheck(t *testing.T) {
	for _, c := range []struct {
		size         int64
		force        bool
		said, refuse bool
	}{
		{size: 10 << 20},
		{size: 300 << 20, said: true},
		{size: 2 << 30, refuse: true},
		{size: 2 << 30, force: true, said: true},
	} {
		var stderr bytes.Buffer
		err := jsonSizeCheck(c.force, &stderr)(c.size)
		if (err != nil) != c.refuse || (stderr.Len() > 0) != c.said {
			t.Errorf("%d bytes, force %v: error %v, said %q", c.size, c.force, err, stderr.String())
		}
	}
}
