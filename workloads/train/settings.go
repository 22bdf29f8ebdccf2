package train

import (
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/words"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The settings of a Config that users spell as words are parsed once, where they enter (flags, a snapshot's
// JSON), into the typed values below; the training loop uses them as they are. Each marshals to the word it
// was parsed from, so a Config's JSON, which every snapshot stores, is what it always was.

// ampDType is the autocast dtype of a (F32 when autocast is off).
func ampDType(a knob.AMP) tensor.DType {
	switch a {
	case knob.AMPFP16:
		return tensor.F16
	case knob.AMPBF16:
		return tensor.BF16
	}
	return tensor.F32
}

// checkpointPlan says which blocks run under activation checkpointing, and under which op-level policy.
type checkpointPlan struct {
	blocks    func(i int) bool // whole blocks
	attention bool             // the attention of every block
	policy    *tensor.CheckpointPolicy
}

// planCheckpoint says which blocks c runs under checkpointing: selective:ops checkpoints every block under
// the policy that keeps knob.SavedOps' outputs.
func planCheckpoint(c knob.Checkpoint) checkpointPlan {
	p := checkpointPlan{attention: c.Attention()}
	switch {
	case c.Every() > 0:
		p.blocks = c.Block
	case c.Ops():
		p.blocks = func(int) bool { return true }
		p.policy = tensor.NewCheckpointPolicy(knob.SavedOps)
	}
	return p
}

// AllocConf is the caching allocator's settings (--alloc-conf, PYTORCH_CUDA_ALLOC_CONF), parsed by
// allocator.ParseConfig. It marshals to the string it was parsed from, verbatim, or for settings made in code to
// their canonical string.
type AllocConf struct{ allocator.Config }

// ParseAllocConf parses a settings string as PyTorch does, refusing what the allocator does not model.
func ParseAllocConf(s string) (AllocConf, error) {
	cfg, err := allocator.ParseConfig(s)
	if err != nil {
		return AllocConf{}, fmt.Errorf("alloc conf: %w", err)
	}
	return AllocConf{cfg}, nil
}

func (a AllocConf) String() string {
	if a.Source != "" {
		return a.Source
	}
	return a.Config.String()
}

func (a AllocConf) MarshalText() ([]byte, error)     { return []byte(a.String()), nil }
func (a *AllocConf) UnmarshalText(text []byte) error { return parseInto(a, ParseAllocConf, text) }

// IsZero reports whether a is PyTorch's default configuration, given as nothing (so that JSON omits it).
func (a AllocConf) IsZero() bool { return a.String() == "" }

// parseWord, nameOf and parseInto are internal/words' rules for settings spelled as words.
func parseWord(names []string, what, s string) (int, error) { return words.Parse(names, what, s) }
func nameOf(names []string, i int, what string) string      { return words.Name(names, i, what) }
func parseInto[T any](v *T, parse func(string) (T, error), text []byte) error {
	return words.Into(v, parse, text)
}
