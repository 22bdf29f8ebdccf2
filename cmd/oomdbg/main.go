// Command oomdbg is a terminal debugger for GPU out-of-memory errors and memory leaks in neural-network
// training. Run `oomdbg --help` for the commands; what each does beyond its flags is in internal/app.
package main

import (
	"context"
	"os"
)

func main() {
	os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr))
}
