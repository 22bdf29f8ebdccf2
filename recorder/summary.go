package recorder

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
)

// WriteSummary says on one line what a recording wrote into dir and how to open it.
func WriteSummary(w io.Writer, dir string, res Result) {
	if len(res.Dumps) == 0 {
		fmt.Fprintf(w, "oomdbg record: no snapshot in %s: no process of the job used CUDA with a torch the recorder could start in\n", dir)
		return
	}
	names := make([]string, 0, len(res.Dumps))
	for _, d := range res.Dumps {
		names = append(names, filepath.Base(d.Path))
	}
	open := res.Dumps[len(res.Dumps)-1]
	if d, ok, _ := Newest(dir); ok {
		open = d
	}
	fmt.Fprintf(w, "oomdbg record: %d snapshot(s) in %s: %s; open with: oomdbg view %s\n", len(names), dir,
		strings.Join(names, " "), open.Path)
}
