package knob

import (
	"fmt"
	"strconv"
	"strings"
)

// Checkpoint is activation checkpointing of a model's repeated blocks (--checkpoint): off, every block,
// every N-th block from the first, the attention of every block, or every block under an op-level policy
// that saves the outputs of its matrix products and recomputes the rest (selective:ops, torch's selective
// activation checkpointing). The zero value is off.
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
	checkpointOps
)

// The checkpoint settings without a parameter.
var (
	CheckpointOff       = Checkpoint{}
	CheckpointAll       = Checkpoint{mode: checkpointAll}
	CheckpointAttention = Checkpoint{mode: checkpointAttention}
	// CheckpointOps is selective activation checkpointing of every block with an op-level policy
	// (torch.utils.checkpoint.create_selective_checkpoint_contexts, non-reentrant): the outputs of the ops
	// SavedOps names are kept (CheckpointPolicy.MUST_SAVE), everything else is recomputed in backward
	// (PREFER_RECOMPUTE).
	CheckpointOps = Checkpoint{mode: checkpointOps}
)

// SavedOps are the ATen ops whose outputs selective:ops keeps: the matrix products (torch's documented
// policy example saves aten.mm; addmm, bmm and baddbmm are the same products with a bias or a batch) and the
// fused attention kernels, as torchtitan's op-level policy lists them (_save_list). torchtitan also
// recomputes every second mm, which selective:ops does not.
var SavedOps = []string{"aten.mm", "aten.addmm", "aten.bmm", "aten.baddbmm",
	"aten._scaled_dot_product_flash_attention", "aten._scaled_dot_product_efficient_attention"}

// MaxCheckpointEvery bounds N in every:N: no model has more blocks.
const MaxCheckpointEvery = 1 << 20

// CheckpointEvery checkpoints every n-th block (0 < n <= MaxCheckpointEvery), from the first.
func CheckpointEvery(n int) Checkpoint { return Checkpoint{mode: checkpointEvery, every: n} }

// ParseCheckpoint reads a checkpoint setting: off, all, every:N (0 < N <= MaxCheckpointEvery), attn or
// selective:ops ("" is off).
func ParseCheckpoint(s string) (Checkpoint, error) {
	switch {
	case s == "off" || s == "":
		return CheckpointOff, nil
	case s == "all":
		return CheckpointAll, nil
	case s == "attn":
		return CheckpointAttention, nil
	case s == "selective:ops":
		return CheckpointOps, nil
	case strings.HasPrefix(s, "every:"):
		n, err := strconv.Atoi(strings.TrimPrefix(s, "every:"))
		if err != nil || n <= 0 || n > MaxCheckpointEvery {
			return CheckpointOff, fmt.Errorf("checkpoint %q: N must be a positive integer", s)
		}
		return CheckpointEvery(n), nil
	}
	return CheckpointOff, fmt.Errorf("unknown checkpoint %q (want off, all, every:N, attn or selective:ops)", s)
}

func (c Checkpoint) String() string {
	switch c.mode {
	case checkpointAll:
		return "all"
	case checkpointEvery:
		return "every:" + strconv.Itoa(c.every)
	case checkpointAttention:
		return "attn"
	case checkpointOps:
		return "selective:ops"
	}
	return "off"
}

func (c Checkpoint) MarshalText() ([]byte, error)     { return []byte(c.String()), nil }
func (c *Checkpoint) UnmarshalText(text []byte) error { return parseInto(c, ParseCheckpoint, text) }

// Off reports whether nothing is checkpointed.
func (c Checkpoint) Off() bool { return c.mode == checkpointOff }

// Attention reports whether the attention of every block is checkpointed, rather than whole blocks.
func (c Checkpoint) Attention() bool { return c.mode == checkpointAttention }

// Ops reports whether every block is checkpointed under the op-level policy of selective:ops, which
// recomputes no matrix product: no block is recomputed whole (Every is 0).
func (c Checkpoint) Ops() bool { return c.mode == checkpointOps }

// Every is the period of the whole blocks checkpointed: 1 for all, N for every:N, 0 when no whole block is.
func (c Checkpoint) Every() int {
	switch c.mode {
	case checkpointAll:
		return 1
	case checkpointEvery:
		return max(c.every, 1)
	}
	return 0
}

// Block reports whether block i (from 0) runs whole under checkpointing: every Every-th from the first.
func (c Checkpoint) Block(i int) bool {
	n := c.Every()
	return n > 0 && i%n == 0
}

// Blocks is how many of a model's layers blocks run whole under checkpointing.
func (c Checkpoint) Blocks(layers int) int {
	n := c.Every()
	if n == 0 || layers <= 0 {
		return 0
	}
	return (layers + n - 1) / n
}
