package snapshot_test

import (
	"slices"
	"testing"

	"github.com/oomdbg/oomdbg/snapshot"
)

func TestShortFunction(t *testing.T) {
	tests := map[string]string{
		"github.com/oomdbg/oomdbg/workloads/nn.(*Linear).Forward": "nn.(*Linear).Forward",
		"main.main":                          "main.main",
		"forward":                            "forward",
		"example.com/a/b.F[example.com/c.T]": "b.F[example.com/c.T]",
		"at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>)": "at::native::empty_cuda(c10::ArrayRef<long>, std::optional<c10::ScalarType>)",
	}
	for in, want := range tests {
		if got := snapshot.ShortFunction(in); got != want {
			t.Errorf("ShortFunction(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestUserFrames(t *testing.T) {
	s := &snapshot.Snapshot{Strings: []string{""}}
	str := func(v string) snapshot.StringID {
		s.Strings = append(s.Strings, v)
		return snapshot.StringID(len(s.Strings) - 1)
	}
	frame := func(fn, file string, line int32) snapshot.FrameID {
		s.Frames = append(s.Frames, snapshot.Frame{Function: str(fn), File: str(file), Line: line})
		return snapshot.FrameID(len(s.Frames) - 1)
	}
	s.Frames = []snapshot.Frame{{}}
	s.Stacks = [][]snapshot.FrameID{nil,
		{frame("github.com/oomdbg/oomdbg/workloads/device.(*Device).Malloc", "/w/device.go", 85),
			frame("github.com/oomdbg/oomdbg/workloads/tensor.(*Runtime).newStorage", "/w/storage.go", 33),
			frame("github.com/oomdbg/oomdbg/workloads/tensor.Linear", "/w/ops_matmul.go", 20),
			frame("github.com/oomdbg/oomdbg/workloads/nn.(*Linear).Forward", "/w/module.go", 44),
			frame("github.com/oomdbg/oomdbg/workloads/train.(*run).microStep", "/w/run.go", 247)},
		{frame("c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(int, unsigned long)", "??", 0),
			frame("at::native::empty_cuda", "/pytorch/aten/src/ATen/native/cuda/EmptyTensor.cpp", 10),
			frame("forward", "/usr/lib/python3/dist-packages/torch/nn/modules/linear.py", 125),
			frame("train_step", "train.py", 42)},
		{frame("runtime.mallocgc", "malloc.go", 1)},
		{frame("cfunction_call", "", 0), frame("forward", "/torch/nn/modules/linear.py", 114),
			frame("method_vectorcall", "", 0), frame("at::native::addmm_out_cuda", "Blas.cpp", 10), frame("main", "train.py", 9)},
	}
	tests := map[string]struct {
		stack snapshot.StackID
		max   int
		want  []string
	}{
		"go":                      {1, 0, []string{"nn.(*Linear).Forward module.go:44", "train.(*run).microStep run.go:247"}},
		"go, one":                 {1, 1, []string{"nn.(*Linear).Forward module.go:44"}},
		"python":                  {2, 0, []string{"forward linear.py:125", "train_step train.py:42"}},
		"all plumb":               {3, 0, []string{"runtime.mallocgc malloc.go:1"}},
		"python, natives between": {4, 0, []string{"forward linear.py:114", "main train.py:9"}},
		"none":                    {0, 0, nil},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, f := range s.UserFrames(tc.stack, tc.max) {
				got = append(got, s.FrameString(f))
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
