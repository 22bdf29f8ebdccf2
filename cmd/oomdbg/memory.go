package main

import (
	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/internal/hostmem"
	"github.com/oomdbg/oomdbg/snapshot/load"
)

// What one event of a snapshot costs each command, loaded and analysed (snapshot/load's costs).
const (
	costAnalyse = load.CostAnalyse
	costExport  = load.CostExport
	costReplay  = load.CostReplay
	costView    = load.CostView
)

// memory is --max-memory (hostmem.Limit, which parses it).
type memory struct{ hostmem.Limit }

// addMemoryFlag puts --max-memory on fs.
func addMemoryFlag(fs *pflag.FlagSet, m *memory) {
	fs.Var(m, "max-memory", "memory a command may use; a snapshot that needs more is refused (exit 2) "+
		"before it is analysed (default: half the physical memory, or what is available when that is less)")
}

// resolve is the limit in force (hostmem.Limit.Resolve).
func (m *memory) resolve() uint64 { return m.Resolve() }
