// Command oomdbg is a terminal debugger for GPU out-of-memory errors and memory leaks in neural-network
// training. Run `oomdbg --help` for the commands.
package main

import "os"

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}
