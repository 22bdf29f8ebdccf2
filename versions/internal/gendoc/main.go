// Command gendoc writes docs/versions.md from the table of versions.Behaviours (go generate ./versions).
package main

import (
	"bytes"
	"flag"
	"fmt"
	"os"

	"github.com/oomdbg/oomdbg/versions"
)

func main() {
	out := flag.String("o", "docs/versions.md", "the file to write")
	flag.Parse()
	var b bytes.Buffer
	err := versions.WriteDoc(&b)
	if err == nil {
		err = os.WriteFile(*out, b.Bytes(), 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gendoc:", err)
		os.Exit(1)
	}
}
