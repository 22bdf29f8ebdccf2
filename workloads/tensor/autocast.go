package tensor

import "github.com/oomdbg/oomdbg/snapshot"

// Autocast follows torch.autocast("cuda") (autocast_mode.cpp's CUDA policy):
//   - matmul-type ops (linear, matmul, scaled_dot_product_attention) cast their floating inputs to the
//     autocast dtype; casts of parameters are cached for the autocast region (amp_cache), so each weight is
//     cast once per forward;
//   - softmax and log_softmax run in float32 (their dtype argument is set, so a half input is converted
//     first), as do layer_norm and the losses;
//   - everything else runs in the dtype of its inputs, with float32 winning between two.
// Leaving the outermost region drops the cache; cast weights autograd saved stay alive until backward frees
// them, as in PyTorch.

// Autocast runs f with autocast to dtype (F16 or BF16) on, and drops the weight-cast cache when the
// outermost region ends.
func (rt *Runtime) Autocast(dtype DType, f func()) {
	prev := rt.autocast
	rt.autocast = dtype
	defer func() {
		rt.autocast = prev
		if prev == F32 {
			rt.clearAMPCache()
		}
	}()
	f()
}

// AutocastDType returns the autocast dtype, or F32 when autocast is off.
func (rt *Runtime) AutocastDType() DType { return rt.autocast }

func (rt *Runtime) clearAMPCache() {
	for _, c := range rt.ampCache {
		c.Release()
	}
	rt.ampCache = nil
}

// lowPrecision casts a matmul-type op's input to the autocast dtype when autocast is on.
func lowPrecision(t *Tensor) *Tensor {
	if t == nil || t.rt.autocast == F32 || !t.dtype.IsFloat() || t.dtype == t.rt.autocast {
		return ref(t)
	}
	return t.rt.cachedCast(t, t.rt.autocast)
}

// fullPrecision casts a float32-policy op's input to float32 when autocast is on.
func fullPrecision(t *Tensor) *Tensor {
	if t == nil || t.rt.autocast == F32 || !t.dtype.IsFloat() || t.dtype == F32 {
		return ref(t)
	}
	return ToDType(t, F32)
}

func ref(t *Tensor) *Tensor {
	if t == nil {
		return nil
	}
	return t.Ref()
}

// cachedCast is autocast's cached_cast: a parameter (a leaf that requires grad) is cast once per autocast
// region and the cast kept in the cache; anything else is cast afresh.
func (rt *Runtime) cachedCast(t *Tensor, dtype DType) *Tensor {
	if !(t.gradFn == nil && t.requiresGrad && rt.gradEnabled) {
		return ToDType(t, dtype)
	}
	if c, ok := rt.ampCache[t.object]; ok {
		return c.Ref()
	}
	prev := rt.SetCategory(snapshot.CategoryAMPCache)
	c := ToDType(t, dtype)
	rt.SetCategory(prev)
	c.owner = owner{name: "autocast cache[" + t.describe() + "]"}
	if rt.ampCache == nil {
		rt.ampCache = map[*object]*Tensor{}
	}
	rt.ampCache[t.object] = c
	return c.Ref()
}

// ToDType returns t converted to dtype (tensor.to(dtype)): another reference when it already has that
// dtype, else a new tensor whose backward converts the gradient back.
func ToDType(t *Tensor, dtype DType) *Tensor {
	t.check()
	if t.dtype == dtype {
		return t.Ref()
	}
	rt := t.rt
	out := rt.Empty(dtype, t.shape, "to."+dtype.String())
	if rt.dev.Computes() {
		copy(out.data(), t.host())
		out.round()
	}
	if rt.needsGrad(t) {
		from := t.dtype
		rt.node("ToCopyBackward0", []*Tensor{t}, []*Tensor{out}, func(n *Node, g []*Tensor, _ []bool) []*Tensor {
			return []*Tensor{ToDType(g[0], from)}
		})
	}
	return out
}

// castGrad converts a gradient to the dtype of the input it is for, as the engine's validate_outputs does
// (a half input of a float32 op receives a half gradient). It releases g when it converts.
func castGrad(g *Tensor, dtype DType) *Tensor {
	if g == nil || g.dtype == dtype || !dtype.IsFloat() {
		return g
	}
	c := ToDType(g, dtype)
	g.Release()
	return c
}

// HasNonFinite reports whether t holds an Inf or NaN (always false on a device that computes nothing).
func HasNonFinite(t *Tensor) bool {
	if !t.rt.dev.Computes() {
		return false
	}
	for _, v := range t.host() {
		if v != v || v > maxF32 || v < -maxF32 {
			return true
		}
	}
	return false
}

const maxF32 = 3.4028234663852886e38
