// Package optimrules holds the rules of an optimizer's memory that both the training runtime
// (workloads/optim) and the trace transformations (whatif/transform) need, in one place: how bitsandbytes
// lays out 8-bit optimizer state.
package optimrules

// The constants of bitsandbytes' Optimizer2State (bitsandbytes/optim/optimizer.py).
const (
	Blocksize   = 256     // init_state: blocksize = 256 (since 0.44, commit aa57bd89; 2048 before)
	Min8bitSize = 4096    // min_8bit_size default: smaller parameters keep float32 state
	PagedMin    = 100_000 // get_state_buffer: paged only when p.numel() >= 1e5
	QMapEntries = 256     // fill_qmap: the signed and unsigned dynamic maps, 256 float32 values each
)

// Blockwise8bit says how bitsandbytes' 8-bit Optimizer2State keeps each of a parameter's two states, for a
// parameter of numel elements: in 8 bits with float32 block maxima (absmax: one per Blocksize elements),
// or, below Min8bitSize elements, in float32 (absmax 0).
func Blockwise8bit(numel int) (eight bool, absmax int) {
	if numel < Min8bitSize {
		return false, 0
	}
	return true, (numel + Blocksize - 1) / Blocksize
}
