package knob

import (
	"fmt"
	"strconv"
	"strings"
)

// Checkpoint is activation checkpointing of a model's repeated blocks (--checkpoint): off, every block,
// every N-th block from the first, or the attention of every block (selective). The zero value is off.
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

// MaxCheckpointEvery bounds N in every:N: no model has more blocks.
const MaxCheckpointEvery = 1 << 20

// CheckpointEvery checkpoints every n-th block (0 < n <= MaxCheckpointEvery), from the first.
func CheckpointEvery(n int) Checkpoint { return Checkpoint{mode: checkpointEvery, every: n} }

// ParseCheckpoint reads a checkpoint setting: off, all, every:N (0 < N <= MaxCheckpointEvery) or attn ("" is
// off).
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
		if err != nil || n <= 0 || n > MaxCheckpointEvery {
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

// Off reports whether nothing is checkpointed.
func (c Checkpoint) Off() bool { return c.mode == checkpointOff }

// Attention reports whether the attention of every block is checkpointed, rather than whole blocks.
func (c Checkpoint) Attention() bool { return c.mode == checkpointAttention }

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
