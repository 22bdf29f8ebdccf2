package recorder

import (
	"embed"
	"fmt"
	"os"
	"path/filepath"
)

// python holds the recorder's Python side: oomdbg_record.py and the sitecustomize.py that starts it.
//
//go:embed python/oomdbg_record.py python/sitecustomize.py
var python embed.FS

// writeModule writes the Python side into dir, readable by the job only.
func writeModule(dir string) error {
	for _, name := range []string{"oomdbg_record.py", "sitecustomize.py"} {
		data, err := python.ReadFile("python/" + name)
		if err != nil {
			return err
		}
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return fmt.Errorf("writing the recorder's module: %w", err)
		}
	}
	return nil
}
