package torchtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
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
	// F12 is a QLoRA fine-tune through transformers, peft, bitsandbytes and accelerate, recorded in a
	// notebook after the model was loaded: one forward and one backward.
	F12 = "f12_2024_qlora_notebook_one_step.pickle"
)

// Fixtures lists every real snapshot.
var Fixtures = []string{F1, F2, F3, F4, F7, F12}

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
	p := filepath.Join(FixtureDir(t), name)
	if _, err := os.Stat(p); err != nil {
		unavailable(t, "fixture %s: %v", name, err)
	}
	return p
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
// where it is missing, except under CI, where t fails.
func OptionalFixture(t testing.TB, name string) []byte {
	t.Helper()
	dir, err := fixtureDir()
	if err == nil {
		var data []byte
		if data, err = os.ReadFile(filepath.Join(dir, name)); err == nil {
			return data
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatalf("under CI: fixture %s: %v", name, err)
	}
	return nil
}
