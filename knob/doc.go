// Package knob is the vocabulary of the settings a user turns to change a training run's memory: mixed
// precision, attention, activation checkpointing, the optimizer and how torch.optim steps it, and
// zero_grad. Each is parsed once, where it enters (a flag, a snapshot's JSON, a choice in the TUI), into a
// typed value that the simulated PyTorch (workloads), the trace transforms (whatif/transform), the planner
// (fit) and the TUI all use as it is; each prints back as the word it was parsed from, so a configuration
// stored in a snapshot reads the same in every version.
//
// The rules that follow from a setting live with it: which blocks a checkpoint setting recomputes, how many
// state tensors an optimizer keeps per parameter.
package knob

import "github.com/oomdbg/oomdbg/internal/words"

// parseInto is words.Into: an UnmarshalText from a parse function.
func parseInto[T any](v *T, parse func(string) (T, error), text []byte) error {
	return words.Into(v, parse, text)
}
