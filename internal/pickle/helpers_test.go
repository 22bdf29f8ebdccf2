package pickle

import (
	"os"
	"testing"
)

// decodeFile decodes a file with the default limits, failing the test on error.
func decodeFile(t testing.TB, path string) any {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	v, err := Decode(data)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return v
}
