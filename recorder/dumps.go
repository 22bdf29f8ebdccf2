package recorder

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// DumpKind says when a dump was written.
type DumpKind string

// The kinds of dump, as their file names say: rank0.step00000100.pickle, rank0.oom.pickle, rank0.end.pickle.
const (
	DumpStep DumpKind = "step" // every --every steps, or on SIGUSR1: the rolling set of --keep files
	DumpOOM  DumpKind = "oom"  // at an out-of-memory error, before it is raised (a later one replaces it)
	DumpEnd  DumpKind = "end"  // at exit, after an uncaught exception, or on SIGTERM
)

// claimFile marks rank 0 taken by the first process without RANK or LOCAL_RANK that records.
const claimFile = ".rank0.claim"

// Dump is one snapshot a recording wrote.
type Dump struct {
	Path    string
	Rank    string // "rank0", or "pid1234" for a process with no rank that was not the first
	Kind    DumpKind
	Step    int // optimizer steps done, for a step dump
	ModTime time.Time
}

// ParseDumpName reads a dump's file name; ok is false for any other file.
func ParseDumpName(name string) (rank string, kind DumpKind, step int, ok bool) {
	base, found := strings.CutSuffix(name, ".pickle")
	if !found {
		return "", "", 0, false
	}
	rank, rest, found := strings.Cut(base, ".")
	if !found || !(strings.HasPrefix(rank, "rank") || strings.HasPrefix(rank, "pid")) {
		return "", "", 0, false
	}
	if _, err := strconv.ParseUint(strings.TrimLeft(rank, "rankpid"), 10, 32); err != nil {
		return "", "", 0, false
	}
	switch {
	case rest == string(DumpOOM), rest == string(DumpEnd):
		return rank, DumpKind(rest), 0, true
	case strings.HasPrefix(rest, "step"):
		n, err := strconv.Atoi(rest[len("step"):])
		if err != nil || n < 0 {
			return "", "", 0, false
		}
		return rank, DumpStep, n, true
	}
	return "", "", 0, false
}

// Dumps lists the dumps in dir, oldest first (by modification time, then name).
func Dumps(dir string) ([]Dump, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []Dump
	for _, e := range entries {
		rank, kind, step, ok := ParseDumpName(e.Name())
		if !ok || !e.Type().IsRegular() {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile: the rolling set
		}
		out = append(out, Dump{Path: filepath.Join(dir, e.Name()), Rank: rank, Kind: kind, Step: step, ModTime: info.ModTime()})
	}
	slices.SortStableFunc(out, func(a, b Dump) int {
		if c := a.ModTime.Compare(b.ModTime); c != 0 {
			return c
		}
		return strings.Compare(a.Path, b.Path)
	})
	return out, nil
}

// Newest returns the dump a viewer should show from dir: the newest out-of-memory dump if there is one
// (that is what the user is looking for), else the newest dump; ok is false when there is none.
func Newest(dir string) (Dump, bool, error) {
	ds, err := Dumps(dir)
	if err != nil || len(ds) == 0 {
		return Dump{}, false, err
	}
	for i := len(ds) - 1; i >= 0; i-- {
		if ds[i].Kind == DumpOOM {
			return ds[i], true, nil
		}
	}
	return ds[len(ds)-1], true, nil
}
