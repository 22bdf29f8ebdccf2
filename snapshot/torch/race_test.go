//go:build race

package torch

const raceEnabled = true
