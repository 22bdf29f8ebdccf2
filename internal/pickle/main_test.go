package pickle

import (
	"os"
	"testing"
)

// TestMain lets a decoder panic escape: a test that feeds hostile input then fails with the panic's stack,
// showing that no input reaches the recover at the decode boundary.
func TestMain(m *testing.M) {
	panicOnBug = true
	os.Exit(m.Run())
}
