package torch

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// The real PyTorch snapshots of ../shared/fixtures/pytorch-snapshots (see MANIFEST.md there).
const (
	fixtureF1 = "f1_2023_legacy_history_format.pickle"
	fixtureF2 = "f2_2024_segments_list_only.pkl"
	fixtureF3 = "f3_2023_frames_no_time_us.pickle"
	fixtureF4 = "f4_2024_time_us_no_settings_2dev.pickle"
	fixtureF7 = "f7_2025_expandable_segments_2dev.pickle"
)

var fixtures = []string{fixtureF1, fixtureF2, fixtureF3, fixtureF4, fixtureF7}

// fixtureDir finds shared/fixtures/pytorch-snapshots by walking up from the package directory to the
// directory that holds shared/ (the repository is checked out beside it).
func fixtureDir(t testing.TB) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		p := filepath.Join(dir, "shared", "fixtures", "pytorch-snapshots")
		if st, err := os.Stat(p); err == nil && st.IsDir() {
			return p
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Skip("shared/fixtures/pytorch-snapshots not found above the package: check out shared/ beside the repository to run this test")
		}
		dir = parent
	}
}

// readFixture returns the bytes of a real snapshot, skipping the test when the fixtures are not there.
func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(fixtureDir(t), name))
	if errors.Is(err, os.ErrNotExist) {
		t.Skipf("fixture %s is missing from shared/fixtures/pytorch-snapshots", name)
	}
	if err != nil {
		t.Fatal(err)
	}
	return data
}
