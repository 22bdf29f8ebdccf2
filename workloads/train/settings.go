package train

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/words"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// The settings of a Config that users spell as words are parsed once, where they enter (flags, a snapshot's
// JSON), into the typed values below; the training loop uses them as they are. Each marshals to the word it
// was parsed from, so a Config's JSON, which every snapshot stores, is what it always was.

// AMP is the mixed-precision setting (--amp): autocast off, in fp16 with dynamic loss scaling, or in bf16.
type AMP uint8

// The AMP settings.
const (
	AMPOff AMP = iota
	AMPFP16
	AMPBF16
)

var ampNames = []string{"off", "fp16", "bf16"}

// ParseAMP reads an AMP setting: off, fp16 or bf16 ("" is off, as older configurations wrote it).
func ParseAMP(s string) (AMP, error) {
	i, err := parseWord(ampNames, "amp", s)
	return AMP(i), err
}

func (a AMP) String() string                   { return nameOf(ampNames, int(a), "amp") }
func (a AMP) MarshalText() ([]byte, error)     { return []byte(a.String()), nil }
func (a *AMP) UnmarshalText(text []byte) error { return parseInto(a, ParseAMP, text) }

// dtype is the autocast dtype (F32 when autocast is off).
func (a AMP) dtype() tensor.DType {
	switch a {
	case AMPFP16:
		return tensor.F16
	case AMPBF16:
		return tensor.BF16
	}
	return tensor.F32
}

// Attention is the GPT's attention (--attention): naive, which materialises the B×H×T×T scores, or flash.
type Attention uint8

// The attention kinds.
const (
	AttentionNaive Attention = iota
	AttentionFlash
)

var attentionNames = []string{"naive", "flash"}

// ParseAttention reads an attention setting: naive or flash ("" is naive).
func ParseAttention(s string) (Attention, error) {
	i, err := parseWord(attentionNames, "attention", s)
	return Attention(i), err
}

func (a Attention) String() string                   { return nameOf(attentionNames, int(a), "attention") }
func (a Attention) MarshalText() ([]byte, error)     { return []byte(a.String()), nil }
func (a *Attention) UnmarshalText(text []byte) error { return parseInto(a, ParseAttention, text) }

// ZeroGrad is how zero_grad clears the gradients (--zero-grad): set them to None (PyTorch's default since
// 2.0) or fill them with zeros in place.
type ZeroGrad uint8

// The zero_grad modes.
const (
	ZeroGradNone ZeroGrad = iota
	ZeroGradZero
)

var zeroGradNames = []string{"none", "zero"}

// ParseZeroGrad reads a zero_grad setting: none or zero ("" is none).
func ParseZeroGrad(s string) (ZeroGrad, error) {
	i, err := parseWord(zeroGradNames, "zero_grad", s)
	return ZeroGrad(i), err
}

func (z ZeroGrad) String() string                   { return nameOf(zeroGradNames, int(z), "zero_grad") }
func (z ZeroGrad) MarshalText() ([]byte, error)     { return []byte(z.String()), nil }
func (z *ZeroGrad) UnmarshalText(text []byte) error { return parseInto(z, ParseZeroGrad, text) }

// Checkpoint is the GPT's activation checkpointing (--checkpoint): off, every block, every N-th block, or the
// attention of every block. The zero value is off.
type Checkpoint struct {
	mode  checkpointMode
	every int // for checkpointEvery: N
}

type checkpointMode uint8

const (
	checkpointOff checkpointMode = iota
	checkpointAll
	checkpointEvery
	checkpointAttention
)

// The checkpoint settings without a parameter.
var (
	CheckpointOff       = Checkpoint{}
	CheckpointAll       = Checkpoint{mode: checkpointAll}
	CheckpointAttention = Checkpoint{mode: checkpointAttention}
)

// CheckpointEvery checkpoints every n-th block (n > 0), from the first.
func CheckpointEvery(n int) Checkpoint { return Checkpoint{mode: checkpointEvery, every: n} }

// ParseCheckpoint reads a checkpoint setting: off, all, every:N (N > 0) or attn ("" is off).
func ParseCheckpoint(s string) (Checkpoint, error) {
	switch {
	case s == "off" || s == "":
		return CheckpointOff, nil
	case s == "all":
		return CheckpointAll, nil
	case s == "attn":
		return CheckpointAttention, nil
	case strings.HasPrefix(s, "every:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "every:"))
		if err != nil || n <= 0 {
			return CheckpointOff, fmt.Errorf("checkpoint %q: N must be a positive integer", s)
		}
		return CheckpointEvery(n), nil
	}
	return CheckpointOff, fmt.Errorf("unknown checkpoint %q (want off, all, every:N or attn)", s)
}

func (c Checkpoint) String() string {
	switch c.mode {
	case checkpointAll:
		return "all"
	case checkpointEvery:
		return "every:" + strconv.Itoa(c.every)
	case checkpointAttention:
		return "attn"
	}
	return "off"
}

func (c Checkpoint) MarshalText() ([]byte, error)     { return []byte(c.String()), nil }
func (c *Checkpoint) UnmarshalText(text []byte) error { return parseInto(c, ParseCheckpoint, text) }

// plan says which blocks run under checkpointing.
func (c Checkpoint) plan() checkpointPlan {
	switch c.mode {
	case checkpointAll:
		return checkpointPlan{blocks: func(int) bool { return true }}
	case checkpointEvery:
		n := max(c.every, 1)
		return checkpointPlan{blocks: func(i int) bool { return i%n == 0 }}
	case checkpointAttention:
		return checkpointPlan{attention: true}
	}
	return checkpointPlan{}
}

// checkpointPlan says which blocks run under activation checkpointing.
type checkpointPlan struct {
	blocks    func(i int) bool // whole blocks
	attention bool             // the attention of every block (selective)
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
