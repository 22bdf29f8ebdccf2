package layout

// Op is one pass of a pipeline stage's schedule: the forward or the backward of one micro-batch through one
// of the stage's model chunks (chunk 0 unless the schedule is interleaved).
type Op struct {
	Backward   bool
	MicroBatch int
	Chunk      int
}

// Ops returns the order in which stage i of a pipeline of pp stages runs the passes of one step of m
// micro-batches under s, as Megatron-LM's schedules do (megatron/core/pipeline_parallel/schedules.py):
//
//	gpipe        every forward, then every backward
//	1f1b         min(pp-i-1, m) warm-up forwards, then one forward and one backward in turn, then the
//	             remaining backwards (forward_backward_pipelining_without_interleaving)
//	interleaved  m*v passes each way over v model chunks: (pp-i-1)*2 + (v-1)*pp warm-up forwards (all of
//	             them when m equals pp), then in turn; pass k runs chunk (k mod pp*v) div pp (from the last
//	             chunk backwards) on micro-batch (k div pp*v)*pp + k mod pp
//	             (forward_backward_pipelining_with_interleaving, get_model_chunk_id)
func Ops(s Schedule, pp, i, m int) []Op {
	v := 1
	if s.Kind == Interleaved {
		v = s.Virtual
	}
	total := m * v
	warmup := min(pp-i-1, total)
	switch {
	case pp == 1: // forward_backward_no_pipelining: each micro-batch's forward, then its backward
		warmup = 0
	case s.Kind == GPipe:
		warmup = total
	case s.Kind == Interleaved && m == pp:
		warmup = total
	case s.Kind == Interleaved:
		warmup = min((pp-i-1)*2+(v-1)*pp, total)
	}
	pass := func(k int, backward bool) Op {
		inGroup := k % (pp * v)
		chunk := inGroup / pp
		if backward {
			chunk = v - 1 - chunk
		}
		mb := k/(pp*v)*pp + k%pp
		if v == 1 {
			chunk, mb = 0, k
		}
		return Op{Backward: backward, MicroBatch: mb, Chunk: chunk}
	}
	ops := make([]Op, 0, 2*total)
	for k := range warmup {
		ops = append(ops, pass(k, false))
	}
	for k := range total - warmup {
		ops = append(ops, pass(warmup+k, false), pass(k, true))
	}
	for k := total - warmup; k < total; k++ {
		ops = append(ops, pass(k, true))
	}
	return ops
}
