package train

import (
	"fmt"

	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/dist/layout"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Split is how the run's model is split past data parallelism, as Megatron-LM splits it (--tp, --sp, --pp,
// --pp-schedule, --cp): tensor-parallel ranks innermost, then context-parallel, data-parallel and pipeline
// ranks, the data-parallel ranks being what is left of the GPUs (Parallel.GPUs / (TP*PP*CP)). One rank is
// simulated, Parallel.Rank; gradient accumulation's micro-batches (Accum) are the pipeline's. The zero value
// splits nothing.
type Split struct {
	TP       int             `json:"tp,omitempty"`
	SP       bool            `json:"sp,omitempty"`
	PP       int             `json:"pp,omitempty"`
	Schedule layout.Schedule `json:"pp_schedule,omitzero"`
	CP       int             `json:"cp,omitempty"`
}

// Sizes returns TP, PP and CP, each at least 1.
func (s Split) Sizes() (tp, pp, cp int) { return max(s.TP, 1), max(s.PP, 1), max(s.CP, 1) }

// On reports whether s splits the model at all.
func (s Split) On() bool {
	tp, pp, cp := s.Sizes()
	return tp*pp*cp > 1 || s.SP
}

// chunks is how many model chunks a stage holds: the interleaved schedule's V, else 1.
func (s Split) chunks() int {
	if _, pp, _ := s.Sizes(); pp > 1 && s.Schedule.Kind == layout.Interleaved {
		return s.Schedule.Virtual
	}
	return 1
}

// validateSplit checks a split against the model and the rest of the configuration; each refusal says what
// to change.
func (c *Config) validateSplit() error {
	s := c.Split
	if !s.On() {
		if s.Schedule != (layout.Schedule{}) {
			return fmt.Errorf("--pp-schedule needs --pp 2 or more")
		}
		return nil
	}
	tp, pp, cp := s.Sizes()
	world := c.Parallel.World()
	switch {
	case s.TP < 0 || s.PP < 0 || s.CP < 0 || tp > dist.MaxGPUs || pp > dist.MaxGPUs || cp > dist.MaxGPUs:
		return fmt.Errorf("tp, pp and cp must be from 1 to %d", dist.MaxGPUs)
	case c.Model != "llama" || c.family() != "":
		return fmt.Errorf("tensor, sequence, context and pipeline parallelism are modelled for Llama-architecture models (a llama preset or a LlamaForCausalLM config.json)")
	case c.LoRA > 0 || c.QLoRA:
		return fmt.Errorf("adapters under tensor, context or pipeline parallelism are not modelled (Megatron-LM trains the whole model)")
	case world%(tp*pp*cp) != 0:
		return fmt.Errorf("TP*PP*CP = %d does not divide the %d GPUs: the data-parallel ranks are the GPUs / (TP*PP*CP); choose sizes whose product divides %d", tp*pp*cp, world, world)
	case c.Heads%tp != 0 || c.kvHeads()%tp != 0:
		return fmt.Errorf("%d attention heads and %d key-value heads do not both split over %d TP ranks", c.Heads, c.kvHeads(), tp)
	case c.FFN%tp != 0:
		return fmt.Errorf("FFN width %d does not split over %d TP ranks", c.FFN, tp)
	case c.Seq%cp != 0:
		return fmt.Errorf("sequence length %d does not split over %d CP ranks", c.Seq, cp)
	case cp > 1 && c.Attention != knob.AttentionFlash:
		return fmt.Errorf("context parallelism runs ring attention on the flash kernel: give --attention flash")
	case s.SP && tp == 1:
		return fmt.Errorf("sequence parallelism shards over the tensor-parallel ranks: give --tp 2 or more with --sp")
	case s.SP && (c.Seq/cp)%tp != 0:
		return fmt.Errorf("sequence parallelism needs the sequence per CP rank (%d) to split over %d TP ranks", c.Seq/cp, tp)
	case s.SP && !c.SeqDist.Fixed():
		return fmt.Errorf("sequence parallelism splits every sequence over the TP ranks: it needs sequences of --seq tokens (Megatron pads them to --seq-length), not --seq-dist %s", c.SeqDist)
	case s.SP && c.QKVBias:
		return fmt.Errorf("sequence parallelism is modelled without biases (Megatron's Llama has none)")
	case s.chunks() > c.Layers || c.Layers%(pp*s.chunks()) != 0:
		return fmt.Errorf("%d layers do not split into %d pipeline stages of %d model chunks", c.Layers, pp, s.chunks())
	case s.Schedule.Kind == layout.Interleaved && c.Accum%pp != 0:
		return fmt.Errorf("the interleaved schedule runs micro-batches in groups of the %d stages: give --accum a multiple of %d", pp, pp)
	case pp > 1 && c.Parallel.Strategy != dist.Single && c.Parallel.Strategy != dist.DDP && c.Parallel.Strategy != dist.ZeRO1:
		return fmt.Errorf("pipeline stages combine with ddp or zero1 (Megatron's distributed optimizer), not %s", c.Parallel.Strategy)
	case pp > 1 && c.AMP == knob.AMPFP16:
		return fmt.Errorf("fp16's grad scaler is modelled on a whole model's loss, not across pipeline stages: use --amp bf16")
	case c.EvalEvery > 0 || c.Bug != "" || c.ActivationOffload != ActivationOffloadOff || c.OptimizerInBackward || c.Load != LoadNone:
		return fmt.Errorf("a split model's rank runs training steps only: no evaluation, leak bugs, activation offload, optimizer in backward or loading")
	}
	return nil
}

func (c *Config) kvHeads() int {
	if c.KVHeads > 0 {
		return c.KVHeads
	}
	return c.Heads
}

// stage is the simulated rank's place in a split job.
type stage struct {
	index    int // the pipeline stage, 0 the first
	pp       int
	schedule layout.Schedule
	chunks   int // the model chunks the stage holds (the interleaved schedule's V, else 1)
	layers   int // the layers of each chunk
	sp, cp   int
	whole    Config // the configuration of the whole job
}

// ofRank returns the configuration of the simulated rank of a split job: the model's tensor-parallel
// shares (heads, key-value heads, FFN, the vocabulary padded as Megatron pads it, head_dim kept), the
// rank's 1/CP of each sequence, the data-parallel job over the ranks left, and the stage the rank runs.
func (c Config) ofRank() (Config, *stage) {
	if !c.Split.On() {
		return c, nil
	}
	s := c.Split
	tp, pp, cp := s.Sizes()
	world := c.Parallel.World()
	dp := world / (tp * pp * cp)
	rank := c.Parallel.Rank
	st := &stage{index: rank / (world / pp), pp: pp, schedule: s.Schedule, chunks: s.chunks(), cp: cp, whole: c}
	st.layers = c.Layers / (pp * st.chunks)
	if s.SP {
		st.sp = tp
	}
	r := c
	r.HeadDim = c.headDim()
	r.Heads, r.KVHeads, r.FFN = c.Heads/tp, c.kvHeads()/tp, c.FFN/tp
	r.Vocab = int(layout.Model{Vocab: int64(c.Vocab)}.PaddedVocab(tp)) / tp
	r.Seq = c.Seq / cp
	r.Split = Split{}
	p := c.Parallel
	if dp*cp == 1 {
		p = dist.Settings{}
	} else {
		// The gradients' group: the data-parallel ranks with the context-parallel ones (Megatron's
		// data_parallel_group_with_cp, over which the distributed optimizer shards), every TP-th rank of the
		// stage; its ranks per node are what a node's GPUs hold of it.
		group := dp * cp
		perNode := max(p.PerNode()/tp, 1)
		p.GPUs, p.Rank = group, rank/tp%group
		p.Nodes = max(group/perNode, 1)
		for group%p.Nodes != 0 { // a group whose ranks do not fill whole nodes: the nodes that divide it
			p.Nodes--
		}
	}
	r.Parallel = p
	return r, st
}

// chunkSplit is the nn split of model chunk k of the stage (k from 0): its first layer, whether it has the
// embeddings (the model's first chunk) or the head (its last). Chunk k of stage i is the model's chunk
// k*PP + i, as Megatron interleaves them.
func (st *stage) chunkSplit(k int) nn.Split {
	global := k*st.pp + st.index
	return nn.Split{SP: st.sp, CP: st.cp, FirstLayer: global * st.layers,
		NoEmbed: global != 0, NoHead: global != st.pp*st.chunks-1}
}

// stageModel is a pipeline stage's model: its chunks, each a Llama of its layers (the first with the
// embeddings on the first stage, the last with the head on the last).
type stageModel struct {
	chunks []*nn.Llama
}

func (m *stageModel) Name() string { return "" }

// Parts makes the stage an nn.Composite: a data-parallel strategy finds the blocks and scopes of each chunk.
func (m *stageModel) Parts() []nn.Module {
	parts := make([]nn.Module, len(m.chunks))
	for i, c := range m.chunks {
		parts[i] = c
	}
	return parts
}

func (m *stageModel) Parameters() []*nn.Parameter {
	var ps []*nn.Parameter
	for _, c := range m.chunks {
		ps = append(ps, c.Parameters()...)
	}
	return ps
}

func (m *stageModel) Loss(x, y *tensor.Tensor) *tensor.Tensor {
	panic("train: a pipeline stage computes no whole loss") // validateSplit refuses what would call it
}

func (m *stageModel) ForwardLoss(x, y *tensor.Tensor) (logits, loss *tensor.Tensor) {
	panic("train: a pipeline stage computes no whole loss")
}

// buildStage builds the stage's model chunks.
func (r *run) buildStage() *stageModel {
	m := &stageModel{}
	for k := range r.stage.chunks {
		lc := r.cfg.llamaConfig()
		lc.Layers = r.stage.layers
		lc.Split = r.stage.chunkSplit(k)
		lc.DType, lc.Built = r.paramDType(lc.DType), r.builtBlock()
		c, err := nn.NewLlama(r.rt, lc)
		if err != nil {
			panic(err) // Validate checked the shape
		}
		c.Checkpoint = planCheckpoint(r.cfg.Checkpoint).blocks
		c.AfterLayer = func(l *nn.LlamaDecoderLayer, out *tensor.Tensor) { r.forwardHook(l.Name(), out) }
		m.chunks = append(m.chunks, c)
	}
	return m
}

// pass is a forward pass a stage has run and not yet run backward: what it read of the batch (the tokens on
// the model's first chunk, the labels on its last), the input it received (a chunk after the first) and
// the root of its graph (the loss on the last chunk, else the graph behind the output it sent on).
type pass struct {
	shape    batchShape
	x, y, in *tensor.Tensor
	loss     *tensor.Tensor
	root     *tensor.Root
}

// pipelineStep runs one step's passes on the stage in its schedule's order (layout.Ops): each forward on a
// model chunk from the batch (the first chunk of the model) or from a received activation, which requires
// grad; each output sent on keeps only its graph, as Megatron's deallocate_output_tensor does; each backward
// from the loss, or from the gradient received for the output; the input's gradient sent back and freed.
// Each micro-batch's shape is drawn once, at its first pass on the stage. It returns the step's loss, summed
// over the micro-batches the last stage ran.
func (r *run) pipelineStep() float32 {
	m := r.model.(*stageModel)
	st := r.stage
	live := map[layout.Op]*pass{}
	shapes := map[int]batchShape{}
	var lossSum float32
	ops := layout.Ops(st.schedule, st.pp, st.index, r.cfg.Accum)
	for i, op := range ops {
		key := layout.Op{MicroBatch: op.MicroBatch, Chunk: op.Chunk}
		c := m.chunks[op.Chunk]
		split := c.Config.Split
		if !op.Backward {
			shape, ok := shapes[op.MicroBatch]
			if !ok {
				shape = r.nextBatch()
				shapes[op.MicroBatch] = shape
			}
			p := &pass{shape: shape}
			if !split.NoEmbed || !split.NoHead { // Megatron's get_batch: tokens to the first stage, labels to the last
				r.setPhase(snapshot.PhaseData)
				p.x, p.y = r.data.batch(r.rt, shape, "batch")
				if split.NoEmbed {
					p.x.Release()
					p.x = nil
				}
				if split.NoHead {
					p.y.Release()
					p.y = nil
				}
			}
			if split.NoEmbed {
				p.in = r.rt.Zeros(c.Config.DType, r.sentShape(shape), "pp.recv_forward", snapshot.CategoryActivation)
				p.in.SetRequiresGrad(true)
			}
			if r.rank != nil && st.pp == 1 { // FSDP and ZeRO-3 gather as the forward begins
				r.rank.BeginForward(r.iteration, i == len(ops)-2)
			}
			r.setPhase(snapshot.PhaseForward)
			var out *tensor.Tensor
			r.autocast(func() { out = c.StageForward(p.x, p.in, p.y) })
			if split.NoHead {
				p.root = out.DetachRoot()
			} else {
				p.loss = out
			}
			live[key] = p
			continue
		}
		p := live[key]
		delete(live, key)
		if r.rank != nil && st.pp > 1 {
			// A stage's backwards do not follow their forwards: the strategy's per-backward state (ddp's and
			// zero1's, the ones pipelines take) is set before each backward, the step's last reducing the
			// gradients, as Megatron's pipeline reduces once after its last backward.
			r.rank.BeginForward(r.iteration, i == len(ops)-1)
		}
		r.setPhase(snapshot.PhaseBackward)
		switch {
		case p.loss != nil && r.scaler != nil: // fp16: scaler.scale(loss).backward()
			scaled := r.scaler.Scale(p.loss)
			scaled.Backward(false)
			scaled.Release()
			lossSum += p.loss.Item()
			p.loss.Release()
		case p.loss != nil:
			p.loss.Backward(false)
			lossSum += p.loss.Item()
			p.loss.Release()
		default:
			g := r.rt.Zeros(c.Config.DType, r.sentShape(p.shape), "pp.recv_backward", snapshot.CategoryActivation)
			p.root.Backward(g)
		}
		if p.in != nil {
			p.in.SetGrad(nil) // sent to the stage before
			p.in.Release()
		}
		p.x.Release()
		p.y.Release()
		if r.rank != nil {
			r.rank.EndBackward()
		}
	}
	return lossSum
}

// sentShape is the shape of the hidden states stages pass each other for a batch: the rank's tokens of
// each sequence (1/TP of them under sequence parallelism) by the hidden size.
func (r *run) sentShape(b batchShape) []int {
	return []int{b.n, b.t / max(r.stage.sp, 1), r.cfg.DModel}
}
