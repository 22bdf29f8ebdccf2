package torchtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"testing"
)

// The real PyTorch snapshots (torch.cuda.memory._dump_snapshot and memory_snapshot output taken from public
// repositories), kept outside the repository in shared/fixtures/pytorch-snapshots beside it;
// docs/pytorch-snapshots.md §11 says what each one shows.
const (
	F1 = "f1_2023_legacy_history_format.pickle"    // G0: legacy history blocks
	F2 = "f2_2024_segments_list_only.pkl"          // memory_snapshot(): a bare list of segments
	F3 = "f3_2023_frames_no_time_us.pickle"        // G1: 10,327 trace entries, no time_us
	F4 = "f4_2024_time_us_no_settings_2dev.pickle" // G2: time_us, two devices
	F7 = "f7_2025_expandable_segments_2dev.pickle" // expandable segments, allocator settings
)

// Fixtures lists every real snapshot of shared/.
var Fixtures = []string{F1, F2, F3, F4, F7}

// More real snapshots, taken from public repositories like those of shared/ (docs/pytorch-snapshots.md §11
// says what each shows) but not part of shared/: a test reads them from $OOMDBG_FIXTURES, else from shared/,
// and is skipped where they are missing, under CI too. Each test that reads one has a hand-made stand-in of
// the same shape that always runs (snapshottest.DataParallelOOM for f8; for f9-f11, allocator/replay's
// hand-made traces of blocks from before the trace, TestFreedBlockSized*; for f12, snapshot/torch's traces
// through hand-made Hugging Face stacks, hfstack_test.go and partial_test.go).
const (
	F8  = "f8_2025_dataparallel_oom_3dev.pickle"       // an OOM on cuda:1 of three GPUs under DataParallel
	F9  = "f9_2026_ring_buffer_start_cut.pickle"       // G4: 2,162 allocations, 222 blocks from before the trace freed in it
	F10 = "f10_2026_ring_buffer_unsplit_blocks.pickle" // G4: 33 such blocks served unsplit (up to 1 MiB over their request)
	F11 = "f11_2025_ring_buffer_many_segments.pickle"  // G3: 999 segments from before the trace, 116 such blocks
	// F12 is a QLoRA fine-tune through transformers, peft, bitsandbytes and accelerate, recorded in a
	// notebook after the model was loaded: one forward and one backward.
	F12 = "f12_2024_qlora_notebook_one_step.pickle"
)

// Extra lists the real snapshots outside shared/.
var Extra = []string{F8, F9, F10, F11, F12}

// RingBufferFixtures lists the real snapshots whose trace cut the start of the run.
var RingBufferFixtures = []string{F9, F10, F11}

// pathOf is where the real snapshot name lies: an extra one in $OOMDBG_FIXTURES when that holds it.
func pathOf(name string) (string, error) {
	if d := os.Getenv("OOMDBG_FIXTURES"); d != "" && slices.Contains(Extra, name) {
		if p := filepath.Join(d, name); fileExists(p) {
			return p, nil
		}
	}
	dir, err := fixtureDir()
	if err != nil {
		return "", err
	}
	return filepath.Join(dir, name), nil
}

func fileExists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// FixtureDir returns the directory of the real snapshots, found by walking up from the test's directory to
// the one that holds shared/. Where it is missing the test is skipped, and under CI (CI=true), which checks
// out shared/ beside the repository, it fails: a fixture test that silently stops running checks nothing.
func FixtureDir(t testing.TB) string {
	t.Helper()
	dir, err := fixtureDir()
	if err != nil {
		unavailable(t, "%v: check out shared/ beside the repository to run this test", err)
	}
	return dir
}

// FixturePath returns the path of the real snapshot name, skipping (under CI, failing) t when it is missing.
func FixturePath(t testing.TB, name string) string {
	t.Helper()
	p, err := pathOf(name)
	if err == nil {
		_, err = os.Stat(p)
	}
	switch {
	case err == nil:
		return p
	case slices.Contains(Extra, name):
		t.Skipf("fixture %s is not in shared/ (give its directory as $OOMDBG_FIXTURES): %v", name, err)
	default:
		unavailable(t, "fixture %s: %v", name, err)
	}
	return ""
}

// ReadFixture returns the bytes of the real snapshot name, skipping (under CI, failing) t when it is missing.
func ReadFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(FixturePath(t, name))
	if err != nil {
		t.Fatal(err)
	}
	return data
}

var (
	dirOnce sync.Once
	dirPath string
	dirErr  error
)

func fixtureDir() (string, error) {
	dirOnce.Do(func() {
		wd, err := os.Getwd()
		if err != nil {
			dirErr = err
			return
		}
		for dir := wd; ; dir = filepath.Dir(dir) {
			p := filepath.Join(dir, "shared", "fixtures", "pytorch-snapshots")
			if st, err := os.Stat(p); err == nil && st.IsDir() {
				dirPath = p
				return
			}
			if filepath.Dir(dir) == dir {
				dirErr = fmt.Errorf("shared/fixtures/pytorch-snapshots not found above %s", wd)
				return
			}
		}
	})
	return dirPath, dirErr
}

// RequirePython returns the path of python3 for tests whose truth is CPython's own reading (its pickle
// module), skipping t (under CI, failing it) where there is none.
func RequirePython(t testing.TB) string {
	t.Helper()
	p, err := exec.LookPath("python3")
	if err != nil {
		unavailable(t, "python3 is not on PATH: %v", err)
	}
	return p
}

// unavailable skips t, or fails it under CI, where everything a test compares with must be present.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("under CI: "+format, args...)
	}
	t.Skipf(format, args...)
}

// OptionalFixture returns the bytes of the real snapshot name for a test that also runs without it: nil
// where it is missing, except under CI, where t fails on a snapshot of shared/.
func OptionalFixture(t testing.TB, name string) []byte {
	t.Helper()
	p, err := pathOf(name)
	if err == nil {
		var data []byte
		if data, err = os.ReadFile(p); err == nil {
			return data
		}
	}
	if os.Getenv("CI") == "true" && !slices.Contains(Extra, name) {
		t.Fatalf("under CI: fixture %s: %v", name, err)
	}
	return nil
}
