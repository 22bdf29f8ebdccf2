// Package table writes the tables of oomdbg fixes, oomdbg bugs and oomdbg fit: columns aligned for a
// terminal, or a markdown table for an issue or a pull request.
package table

import (
	"fmt"
	"io"
	"strings"
)

// Write writes rows under header as markdown, or aligned for a terminal: the first left columns to the left,
// the others (figures) to the right, two spaces apart, with no space at the end of a line. Widths count
// bytes: the cells are ASCII.
func Write(w io.Writer, header []string, rows [][]string, markdown bool, left int) {
	if markdown {
		fmt.Fprintf(w, "| %s |\n|%s\n", strings.Join(header, " | "), strings.Repeat("---|", len(header)))
		for _, row := range rows {
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
		return
	}
	all := append([][]string{header}, rows...)
	widths := make([]int, len(header))
	for _, row := range all {
		for i, c := range row {
			widths[i] = max(widths[i], len(c))
		}
	}
	for _, row := range all {
		var line strings.Builder
		for i, c := range row {
			switch {
			case i == 0:
				fmt.Fprintf(&line, "%-*s", widths[i], c)
			case i < left:
				fmt.Fprintf(&line, "  %-*s", widths[i], c)
			default:
				fmt.Fprintf(&line, "  %*s", widths[i], c)
			}
		}
		fmt.Fprintln(w, strings.TrimRight(line.String(), " "))
	}
}
