package torch

import (
	"os"
	"testing"
)

// TestMain lets an importer panic escape: a test that feeds hostile input then fails with the panic's stack,
// showing that no input reaches the recover at the import boundary.
func TestMain(m *testing.M) {
	recoverPanics = false
	os.Exit(m.Run())
}
