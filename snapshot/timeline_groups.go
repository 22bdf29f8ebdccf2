package snapshot

import (
	"cmp"
	"path"
	"slices"
	"strconv"
	"strings"
)

// Breakdowns of a set of blocks by one of their tags, and how stacks are shown.

// Dimension is a tag blocks can be grouped by.
type Dimension uint8

// The dimensions.
const (
	ByCategory  Dimension = iota // Group.Key is the Category
	ByPhase                      // the Phase of the alloc
	ByIteration                  // the iteration of the alloc
	ByScope                      // the scope's StringID
	ByStack                      // the StackID
	ByLabel                      // the label's StringID
	numDimensions
)

var dimensionNames = [...]string{"category", "phase", "iteration", "scope", "stack", "label"}

// String returns the dimension's name, e.g. "scope".
func (d Dimension) String() string {
	if int(d) < len(dimensionNames) {
		return dimensionNames[d]
	}
	return "dimension(" + strconv.Itoa(int(d)) + ")"
}

// Group is the blocks sharing one value of a Dimension.
type Group struct {
	Key       int64
	Bytes     int64 // block bytes
	Requested int64 // requested bytes
	Count     int
}

// key returns block b's value of dimension d.
func (d Dimension) key(b *Allocation) int64 {
	switch d {
	case ByCategory:
		return int64(b.Category)
	case ByPhase:
		return int64(b.Phase)
	case ByIteration:
		return int64(b.Iteration)
	case ByScope:
		return int64(b.Scope)
	case ByStack:
		return int64(b.Stack)
	case ByLabel:
		return int64(b.Label)
	}
	return 0
}

// GroupBlocks sums blocks by dimension d, largest first (ties by key).
func GroupBlocks(blocks []Allocation, d Dimension) []Group {
	index := make(map[int64]int)
	var groups []Group
	for i := range blocks {
		b := &blocks[i]
		k := d.key(b)
		j, ok := index[k]
		if !ok {
			j = len(groups)
			index[k] = j
			groups = append(groups, Group{Key: k})
		}
		g := &groups[j]
		g.Bytes += b.Size
		g.Requested += b.Requested
		g.Count++
	}
	slices.SortFunc(groups, func(a, b Group) int {
		if c := cmp.Compare(b.Bytes, a.Bytes); c != 0 {
			return c
		}
		return cmp.Compare(a.Key, b.Key)
	})
	return groups
}

// GroupName names a group's key for people: "activation", "backward", "iteration 3", a scope, the first
// frame of a stack that is not memory plumbing (see UserFrames), a label.
func (s *Snapshot) GroupName(d Dimension, key int64) string {
	switch d {
	case ByCategory:
		return Category(key).String()
	case ByPhase:
		return Phase(key).String()
	case ByIteration:
		if key < 0 {
			return "setup"
		}
		return "iteration " + strconv.FormatInt(key, 10)
	case ByScope:
		if name := s.String(StringID(key)); name != "" {
			return name
		}
		return "(no scope)"
	case ByStack:
		if frames := s.UserFrames(StackID(key), 1); len(frames) > 0 {
			return s.FrameString(frames[0])
		}
		return "(no stack)"
	case ByLabel:
		if name := s.String(StringID(key)); name != "" {
			return name
		}
		return "(no label)"
	}
	return ""
}

// internalFunctions are the prefixes of functions that hand out memory rather than want it: the caching
// allocator, devices and tensor ops of the workload runtime (what ATen is to a PyTorch program), Go's
// runtime, and PyTorch's C++ allocator and operators.
var internalFunctions = []string{
	"github.com/oomdbg/oomdbg/workloads/alloc.",
	"github.com/oomdbg/oomdbg/workloads/device.",
	"github.com/oomdbg/oomdbg/workloads/tensor.",
	"runtime.",
	"c10::",
	"at::",
	"torch::",
	"std::",
}

// internalFrame reports whether frame f is memory plumbing: the allocator, the runtime, or a native frame
// of a Python program (C++ functions, files other than .py, unknown files).
func (s *Snapshot) internalFrame(f Frame) bool {
	fn := s.String(f.Function)
	for _, p := range internalFunctions {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return nativeFrame(fn, s.String(f.File))
}

// nativeFrame reports whether a frame is compiled code under a Python program: C or C++ (a "::" in the name,
// a C or C++ source file), or a frame without a file.
func nativeFrame(fn, file string) bool {
	switch path.Ext(file) {
	case ".cpp", ".cc", ".cxx", ".c", ".h", ".hpp", ".cu", ".cuh":
		return true
	}
	return file == "" || file == "??" || strings.Contains(fn, "::")
}

// NativeFrame reports whether frame id is compiled code under a Python program (C or C++, or a frame without
// a file): the frames memory_viz's frame filter folds away.
func (s *Snapshot) NativeFrame(id FrameID) bool {
	f := s.Frame(id)
	return nativeFrame(s.String(f.Function), s.String(f.File))
}

// Site returns the innermost frame of stack id that is the program's own code, 0 when it has none: in a Python
// program's stack its innermost Python frame outside the torch package (a module's forward that called
// nn.Linear, not nn.Linear's), else its innermost Python frame; in a Go program's stack the first frame that
// is not memory plumbing (UserFrames).
func (s *Snapshot) Site(id StackID) FrameID {
	var python FrameID
	for _, f := range s.Stack(id) {
		file := s.String(s.Frame(f).File)
		if !strings.HasSuffix(file, ".py") {
			continue
		}
		if !TorchFile(file) {
			return f
		}
		if python == 0 {
			python = f
		}
	}
	if python != 0 {
		return python
	}
	if fs := s.UserFrames(id, 1); len(fs) > 0 {
		return fs[0]
	}
	return 0
}

// TorchFile reports whether a Python file is part of the torch package (an installed PyTorch's
// site-packages/torch/ or dist-packages/torch/, or a path relative to it).
func TorchFile(file string) bool {
	file = strings.ReplaceAll(file, `\`, "/")
	return strings.HasPrefix(file, "torch/") || strings.Contains(file, "-packages/torch/")
}

// UserFrames returns the frames of stack id, innermost first, that show the code that wanted the memory:
// from the first frame that is not memory plumbing (the allocator, tensor ops), and, in a Python program's
// stack, its Python frames only (as PyTorch's memory_viz shows them). A stack of plumbing only is returned
// whole. max > 0 caps the number of frames.
func (s *Snapshot) UserFrames(id StackID, max int) []FrameID {
	frames := s.Stack(id)
	python := slices.ContainsFunc(frames, func(f FrameID) bool { return strings.HasSuffix(s.String(s.Frame(f).File), ".py") })
	var out []FrameID
	if python {
		for _, f := range frames {
			if strings.HasSuffix(s.String(s.Frame(f).File), ".py") {
				out = append(out, f)
			}
		}
	} else {
		i := 0
		for i < len(frames) && s.internalFrame(s.Frame(frames[i])) {
			i++
		}
		if i == len(frames) {
			i = 0
		}
		out = frames[i:]
	}
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out
}

// FrameString returns a frame as "function file:line", without the function's import path or the file's
// directories: "nn.(*Linear).Forward module.go:44".
func (s *Snapshot) FrameString(id FrameID) string {
	f := s.Frame(id)
	fn := ShortFunction(s.String(f.Function))
	file := path.Base(strings.ReplaceAll(s.String(f.File), `\`, "/"))
	switch {
	case file == "." || file == "/":
		return fn
	case fn == "":
		return file + ":" + strconv.Itoa(int(f.Line))
	}
	return fn + " " + file + ":" + strconv.Itoa(int(f.Line))
}

// ShortFunction drops the import path of a Go function name: "github.com/x/y/nn.(*Linear).Forward" is
// "nn.(*Linear).Forward". Other names are returned as they are.
func ShortFunction(name string) string {
	// The import path ends at the last slash before the receiver or the type arguments, which may hold
	// slashes of their own.
	cut := name
	if i := strings.IndexAny(cut, "(["); i >= 0 {
		cut = cut[:i]
	}
	if i := strings.LastIndexByte(cut, '/'); i >= 0 {
		return name[i+1:]
	}
	return name
}
