package tensor

// CheckpointPolicy is an op-level policy for activation checkpointing, what
// torch.utils.checkpoint.create_selective_checkpoint_contexts makes of a policy function: the ops whose
// outputs a checkpointed region keeps from its forward (CheckpointPolicy.MUST_SAVE), every other op running
// again in backward (PREFER_RECOMPUTE). Ops are named as ATen names them ("aten.mm").
type CheckpointPolicy struct{ save map[string]bool }

// The ATen names of the ops a policy can keep: the runtime's matrix products and fused attention kernels.
const (
	opMM              = "aten.mm"
	opAddmm           = "aten.addmm"
	opBmm             = "aten.bmm"
	opFlashAttention  = "aten._scaled_dot_product_flash_attention"
	opEfficientAttn   = "aten._scaled_dot_product_efficient_attention"
	flashAttnBackward = "ScaledDotProductFlashAttentionBackward0"
)

// NewCheckpointPolicy returns the policy that keeps the outputs of ops.
func NewCheckpointPolicy(ops []string) *CheckpointPolicy {
	p := &CheckpointPolicy{save: map[string]bool{}}
	for _, op := range ops {
		p.save[op] = true
	}
	return p
}

// SetCheckpointPolicy makes every checkpointed region (CheckpointOutputs and the functions built on it) run
// under p, as torch.utils.checkpoint.checkpoint(..., use_reentrant=False, context_fn=...) runs each block a
// model wraps; nil recomputes everything. It returns the previous policy.
func (rt *Runtime) SetCheckpointPolicy(p *CheckpointPolicy) (prev *CheckpointPolicy) {
	prev, rt.policy = rt.policy, p
	return prev
}

// policyRegion is a checkpointed region under a policy (torch's _CachingTorchDispatchMode in the forward,
// _CachedTorchDispatchMode in the recompute). In the forward it keeps a reference to each output of an op
// the policy saves, in order; in the recompute each such op takes its output back instead of allocating and
// computing it, as the cached mode pops storage[func].
type policyRegion struct {
	policy *CheckpointPolicy
	kept   []*Tensor // forward: the outputs kept

	// recompute: the node that saved them and where in its saved list they are, the next one first
	node  *Node
	slots []int
}

// take returns the output the forward kept for op, when r is a recompute and op is one the policy saves;
// else nil, and the op computes. The saved reference is dropped as it is taken: the recomputed graph holds
// the output from then on, as long as it needs it.
func (r *policyRegion) take(op string, shape []int) *Tensor {
	if r == nil || r.node == nil || !r.policy.save[op] {
		return nil
	}
	if len(r.slots) == 0 {
		panic("tensor: a recompute ran an op its forward did not: " + op)
	}
	i := r.slots[0]
	r.slots = r.slots[1:]
	k := r.node.saved[i]
	r.node.saved[i] = nil
	if !equalShape(k.shape, shape) {
		panic("tensor: a recompute's " + op + " differs from its forward's")
	}
	out := k.Detach()
	k.Release()
	return out
}

// keep keeps a reference to the output t of op, when r is a forward and the policy saves op.
func (r *policyRegion) keep(op string, t *Tensor) {
	if r == nil || r.node != nil || !r.policy.save[op] {
		return
	}
	r.kept = append(r.kept, t.Ref())
}

// inRegion runs f with r as the policy region (nil: none), restoring the one before even when f unwinds.
func (rt *Runtime) inRegion(r *policyRegion, f func()) {
	prev := rt.region
	rt.region = r
	defer func() { rt.region = prev }()
	f()
}

func equalShape(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
