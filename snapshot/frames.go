package snapshot

import (
	"path"
	"slices"
	"strconv"
	"strings"
)

// How stacks are shown: the frames of the code that wanted the memory, named briefly.

// internalFunctions are the prefixes of functions that hand out memory rather than want it: the caching
// allocator, devices and tensor ops of the workload runtime (what ATen is to a PyTorch program), Go's
// runtime, and PyTorch's C++ allocator and operators.
var internalFunctions = []string{
	"github.com/oomdbg/oomdbg/allocator.",
	"github.com/oomdbg/oomdbg/workloads/alloc.", // where the allocator model lived in older recordings
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
