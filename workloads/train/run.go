package train

import (
	"context"
	"errors"
	"fmt"

	"github.com/oomdbg/oomdbg/allocator"
	"github.com/oomdbg/oomdbg/internal/units"
	"github.com/oomdbg/oomdbg/knob"
	"github.com/oomdbg/oomdbg/snapshot"
	"github.com/oomdbg/oomdbg/tracer"
	"github.com/oomdbg/oomdbg/workloads/device"
	"github.com/oomdbg/oomdbg/workloads/dist"
	"github.com/oomdbg/oomdbg/workloads/nn"
	"github.com/oomdbg/oomdbg/workloads/optim"
	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// Result is what a run did.
type Result struct {
	Steps        int       // optimizer steps completed (including steps the grad scaler skipped)
	SkippedSteps int       // steps skipped by the fp16 grad scaler after an overflow
	Losses       []float32 // the loss of each completed step (all 0 on the meta device, which computes nothing)
	Accuracy     float32   // accuracy of the last evaluation (mlp on the cpu device, with evaluation on)
	Parameters   int       // parameters of the model (a 4-bit weight counts its values, as peft does)
	Trainable    int       // of those, the ones the optimizer trains (requires_grad)

	// Paged is the optimizer state in CUDA unified memory (paged optimizers), outside the caching
	// allocator and its peaks; PagedEvicted the bytes of it the device evicted to host over the run to make
	// room for the allocator.
	Paged, PagedEvicted uint64

	PeakAllocated int64 // memory_allocated's peak over the run
	PeakReserved  int64 // memory_reserved's peak over the run
	// UnallocatedAtPeak is reserved minus allocated bytes when reserved memory peaked: of the most the run
	// reserved, what no tensor used (a new segment counted with the block it was made for).
	UnallocatedAtPeak int64
	Phases            []PhaseStat
	// StepStats is what each step (the last one cut short by an OOM included) asked of the device.
	StepStats []StepStat

	// ExpertLoad is the busiest expert of a mixture of experts over the run.
	ExpertLoad ExpertLoad

	// Traffic is what the rank moved in each optimizer step (a data-parallel run), and Host its host
	// memory (CPU offload).
	Traffic []dist.Traffic
	Host    allocator.HostStats

	OOM         *OOM // the out-of-memory error that stopped the run, if any
	Interrupted bool // the context was cancelled
	// OverLimit says the run stopped early because its reserved memory passed the limit RunWithin was
	// given: the peaks are what it reached by then.
	OverLimit bool
}

// PhaseStat is the memory of one phase of one iteration.
type PhaseStat struct {
	Iteration int
	Phase     snapshot.Phase
	Peak      int64 // highest allocated bytes during the phase
	End       int64 // allocated bytes when it ended
}

// OOM is an allocation failure that stopped a run.
type OOM struct {
	Message   string // PyTorch's OOM message
	Phase     snapshot.Phase
	Iteration int
	Tensor    string // the tensor that could not be allocated, e.g. "f32[64,128] linear.out"
	// Request is the rounded request; Allocated, Reserved and DeviceFree are the allocator's bytes and the
	// device's free memory after the allocator released what it could (the figures of PyTorch's message).
	Request, Allocated, Reserved, DeviceFree int64
}

// model is what the loop trains: the MLP, the GPT or the Llama.
type model interface {
	nn.Module
	Loss(x, y *tensor.Tensor) *tensor.Tensor
	ForwardLoss(x, y *tensor.Tensor) (logits, loss *tensor.Tensor)
}

// dataset makes batches on the device, of the shape the loop chose for the step: a sequence model gets
// (n, t), whatever it is.
type dataset interface {
	batch(rt *tensor.Runtime, shape batchShape, role string) (x, y *tensor.Tensor)
}

// run is the state of one training run.
type run struct {
	cfg     Config
	ctx     context.Context
	rec     *tracer.Recorder // may be nil
	dev     *device.Device
	rt      *tensor.Runtime
	model   model
	mlp     *nn.MLP // the model, when it is the MLP
	opt     optim.Optimizer
	rank    dist.Rank         // the data-parallel strategy, when the run is one rank of a job
	stage   *stage            // the rank's place in a split job (Config.Split), or nil
	host    *tensor.Runtime   // host memory, when a rank offloads
	scaler  *optim.GradScaler // fp16 only
	amp     tensor.DType
	data    dataset
	mem     *memTracker
	lengths *lengthSampler
	res     *Result

	phase     snapshot.Phase
	iteration int
	phaseMark bool // a phase is open in res.Phases

	stepStat  *StepStat // the step under way, in res.StepStats
	stepPeaks [2]int64  // its allocated and reserved peaks so far
	// stepEmptied: the step just ended with empty_cache, which also ended its last phase.
	stepEmptied bool
	// limit: the run stops at the next phase boundary once its reserved memory passed it (0: never).
	limit int64
	// progress hears of each completed step (RecordOptions.Progress); nil when no one listens.
	progress func(Progress)
	// skipCycles: count, rather than run, the micro-batches that repeat a cycle of allocator states (Simulate).
	skipCycles bool

	logits *tensor.Tensor // the last forward's logits, while Config.Logits keeps them

	// What the leak bugs (or their fixed code paths) keep.
	lossHistory []*tensor.Tensor          // retain-graph: the losses themselves
	evalOutputs []*tensor.Tensor          // eval-no-grad: the outputs with their graphs
	stash       []*tensor.Tensor          // stash-activations: every hidden output
	totalLoss   *tensor.Tensor            // tensor-loss-sum
	attributes  map[string]*tensor.Tensor // module-attribute: each module's self.intermediate
}

// errInterrupted ends a run cancelled by its context between two phases; errOverLimit one whose reserved
// memory passed its limit.
var (
	errInterrupted = errors.New("interrupted")
	errOverLimit   = errors.New("over the limit")
)

// Run trains the model cfg describes and records it through rec (nil records nothing). It returns when the
// steps are done, at an out-of-memory error (Result.OOM, not an error: recording it is the point), or when ctx
// is cancelled (Result.Interrupted), with the device, whose allocator holds the final state. The error is for
// a configuration that cannot run.
func Run(ctx context.Context, cfg Config, rec *tracer.Recorder) (*Result, *device.Device, error) {
	return runWithin(ctx, cfg, rec, 0)
}

// RunWithin runs cfg as Run does with nothing recorded, but stops at the first phase boundary after its
// reserved memory passed limit (Result.OverLimit), where a planner knows the configuration does not fit
// whatever the rest of the run does: reserved memory's peak only grows. A run that stays within limit
// is Run's, figure for figure.
func RunWithin(ctx context.Context, cfg Config, limit int64) (*Result, error) {
	res, _, err := runWithin(ctx, cfg, nil, max(limit, 1))
	return res, err
}

func runWithin(ctx context.Context, cfg Config, rec *tracer.Recorder, limit int64) (*Result, *device.Device, error) {
	if err := cfg.Validate(); err != nil {
		return nil, nil, err
	}
	return runValid(ctx, cfg, rec, limit, nil)
}

// runValid is runWithin of a configuration already validated: Record validates before it writes the header.
func runValid(ctx context.Context, cfg Config, rec *tracer.Recorder, limit int64, progress func(Progress)) (*Result, *device.Device, error) {
	return runValidWith(ctx, cfg, rec, limit, progress, false)
}

// runValidWith is runValid, skipping the repeated cycles of a step's micro-batches where skipCycles says so
// (Simulate).
func runValidWith(ctx context.Context, cfg Config, rec *tracer.Recorder, limit int64, progress func(Progress), skipCycles bool) (*Result, *device.Device, error) {
	r, err := newRun(ctx, cfg, rec)
	if err != nil {
		return nil, nil, err
	}
	r.limit, r.progress, r.skipCycles = limit, progress, skipCycles
	err = r.rt.Catch(r.train)
	var oom *tensor.OOMError
	switch {
	case errors.As(err, &oom):
		r.res.OOM = &OOM{Message: oom.Error(), Phase: r.phase, Iteration: r.iteration, Tensor: oom.Label}
		var ae *allocator.OutOfMemoryError
		if errors.As(err, &ae) {
			r.res.OOM.Request, r.res.OOM.Allocated, r.res.OOM.Reserved, r.res.OOM.DeviceFree =
				int64(ae.Rounded), int64(ae.Allocated), int64(ae.Reserved), int64(ae.DeviceFree)
		}
	case errors.Is(err, errInterrupted):
		r.res.Interrupted = true
		r.heapDump("interrupted")
	case errors.Is(err, errOverLimit):
		r.res.OverLimit = true
	case err != nil:
		return nil, nil, err
	}
	r.endPhase()
	if m, ok := r.dev.Managed(); ok {
		ms := m.ManagedStats()
		r.res.Paged, r.res.PagedEvicted = ms.Allocated, ms.Evicted
	}
	r.endStep()
	st := r.dev.Allocator().Stats()
	r.res.PeakAllocated = max(r.res.PeakAllocated, st.AllocatedBytes.All().Peak)
	r.res.PeakReserved = max(r.res.PeakReserved, st.ReservedBytes.All().Peak)
	r.res.UnallocatedAtPeak = r.mem.unallocatedAtPeak
	if r.scaler != nil {
		r.res.SkippedSteps = r.scaler.Skipped
	}
	if r.rank != nil {
		r.res.Traffic = r.rank.Traffic()
	}
	if r.host != nil {
		r.res.Host = r.host.Device().Host().Stats()
	}
	return r.res, r.dev, nil
}

// newRun sets up the device and runtime of a validated configuration.
func newRun(ctx context.Context, cfg Config, rec *tracer.Recorder) (*run, error) {
	cfg, st := cfg.ofRank()
	dev, err := device.Open(cfg.Device, 0, cfg.GPUMemory, cfg.ContextReserve, cfg.AllocConf.Config)
	if err != nil {
		return nil, err
	}
	var tr tensor.Tracer
	mem := &memTracker{}
	if rec != nil {
		mem.next = rec
		tr = rec
	}
	dev.Allocator().SetObserver(mem)
	r := &run{cfg: cfg, ctx: ctx, rec: rec, dev: dev, rt: tensor.NewRuntime(dev, tr, cfg.Seed), res: &Result{},
		amp: ampDType(cfg.AMP), iteration: -1, lengths: newLengthSampler(&cfg), mem: mem, stage: st}
	r.rt.OnOOM(r.onOOM)
	r.rt.SetVersions(cfg.Versions)
	r.rt.SetCheckpointPolicy(planCheckpoint(cfg.Checkpoint).policy)
	if m, ok := dev.Managed(); ok && rec != nil {
		m.SetManagedObserver(r.onManaged)
	}
	if cfg.Parallel.Parallel() {
		if err := r.newRank(); err != nil {
			return nil, err
		}
	}
	r.setActivationOffload()
	return r, nil
}

// newRank makes the data-parallel rank the run is, and its host memory when it offloads.
func (r *run) newRank() error {
	cfg := r.cfg
	if cfg.Parallel.Offload != dist.OffloadNone {
		r.hostRuntime()
	}
	var annotate func(string)
	if r.rec != nil {
		annotate = r.rec.Annotate
	}
	rank, err := dist.New(cfg.Parallel, dist.Env{RT: r.rt, Host: r.host, Annotate: annotate, AMP: r.amp,
		Optimizer: optim.Config{Kind: cfg.Optimizer, LR: cfg.LR, WeightDecay: cfg.WeightDecay, Impl: cfg.OptimizerImpl}})
	if err != nil {
		return err
	}
	r.rank = rank
	if !rank.Autocast() {
		r.amp = tensor.F32 // DeepSpeed's bf16 and fp16 modes: the model is half itself, nothing to autocast
	}
	return nil
}

// onManaged records what unified memory (a paged optimizer's state) does: its resident bytes as a device
// reading after every movement, and each eviction as an annotation with the bytes moved to host, so the
// timeline shows what the allocator's own figures leave out.
func (r *run) onManaged(e allocator.ManagedEvent) {
	dev := r.dev.Index()
	r.rec.Sample(dev, "paged.resident", int64(e.Stats.Resident))
	if e.Evicted > 0 {
		r.rec.Sample(dev, "paged.evicted", int64(e.Stats.Evicted))
		r.rec.Annotate(fmt.Sprintf("paged: %s of optimizer state evicted to host to make room for %s",
			units.FormatSize(int64(e.Evicted)), units.FormatSize(int64(e.Cause))))
	}
}

// train is the training loop; an OOM panics out of it (see tensor.Runtime.Catch).
func (r *run) train() {
	cfg := r.cfg
	r.setup()
	evalEvery := cfg.EvalEvery
	if cfg.Bug == BugEvalNoGrad && evalEvery == 0 {
		evalEvery = 1 // the bug needs an evaluation to happen
	}

	for step := range cfg.Steps {
		r.iterate(step, evalEvery > 0 && (step+1)%evalEvery == 0)
	}
}

// iterate is one training iteration, an evaluation if asked, and the heap dump at its end.
func (r *run) iterate(step int, eval bool) {
	r.checkInterrupt()
	r.iteration = step
	if r.rec != nil {
		r.rec.BeginIteration(step)
	}
	r.beginStep(step)
	r.step()
	if eval {
		r.evaluate()
	}
	r.endPhase()
	if r.cfg.EmptyCache != EmptyCacheNever { // torch.cuda.empty_cache() at the end of the step
		r.emptyCache()
		r.stepEmptied = true
	}
	r.endStep()
	r.heapDump("iteration end")
	r.res.Steps++
	if r.progress != nil {
		r.progress(Progress{Done: r.res.Steps, Of: r.cfg.Steps, Loss: r.res.Losses[len(r.res.Losses)-1]})
	}
}

// ModelParameters builds cfg's model on a meta device of unlimited memory, with nothing recorded, and
// returns its parameter count and how many of them train (peft's get_nb_trainable_parameters).
func ModelParameters(cfg Config) (all, trainable int, err error) {
	if err := cfg.Validate(); err != nil {
		return 0, 0, err
	}
	cfg.Device, cfg.GPUMemory, cfg.ContextReserve = device.Meta, MaxGPUMemory, 0
	cfg.Parallel, cfg.Split = dist.Settings{}, Split{} // the whole model, not a rank's share of it
	r, err := newRun(context.Background(), cfg, nil)
	if err != nil {
		return 0, 0, err
	}
	if err := r.rt.Catch(r.build); err != nil {
		return 0, 0, err
	}
	return r.res.Parameters, r.res.Trainable, nil
}

// DistinctRanks returns the ranks of cfg's job whose memory differs from every lower rank's, rank 0 first
// (dist.DistinctRanks): the ranks worth simulating. For a single GPU it is rank 0 alone.
func DistinctRanks(cfg Config) ([]int, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, pp, _ := cfg.Split.Sizes(); pp > 1 {
		// Each stage holds its own layers and its own micro-batches in flight (the first stage the most, the
		// last the head): the first rank of every stage. Within a stage the data-parallel ranks are taken to
		// hold alike.
		ranks := make([]int, pp)
		for s := range ranks {
			ranks[s] = s * (cfg.Parallel.World() / pp)
		}
		return ranks, nil
	}
	if !cfg.Parallel.Parallel() || cfg.Split.On() {
		return []int{0}, nil
	}
	cfg.Device, cfg.GPUMemory, cfg.ContextReserve = device.Meta, MaxGPUMemory, 0
	p := cfg.Parallel
	cfg.Parallel = dist.Settings{}
	r, err := newRun(context.Background(), cfg, nil)
	if err != nil {
		return nil, err
	}
	if err := r.rt.Catch(r.build); err != nil {
		return nil, err
	}
	var numels []int64
	for _, prm := range nn.Trainable(r.model) {
		numels = append(numels, int64(prm.Tensor.Numel()))
	}
	return dist.DistinctRanks(p, numels), nil
}

// setup is the setup phase: the model on the device (after the load phase, when the run loads it as
// from_pretrained does), peft's preparation of a quantized model, the optimizer and, for fp16, the grad
// scaler.
func (r *run) setup() {
	if r.cfg.Load == LoadHF {
		r.setPhase(snapshot.PhaseLoad)
		r.load()
	}
	r.setPhase(snapshot.PhaseSetup)
	if r.model == nil {
		r.build()
	}
	if r.cfg.kbitPrep() {
		nn.PrepareForKbitTraining(r.model)
	}
	if r.rank != nil {
		r.rank.Wrap(r.model) // the strategy wraps the model and makes the optimizer
	} else {
		// The optimizer gets what requires grad, as Trainer.create_optimizer does (all parameters but a
		// frozen base's).
		oc := optim.Config{Kind: r.cfg.Optimizer, LR: r.cfg.LR, WeightDecay: r.cfg.WeightDecay, Impl: r.cfg.OptimizerImpl}
		newOptimizer := optim.New
		if r.cfg.OptimizerInBackward {
			newOptimizer = func(rt *tensor.Runtime, ps []*nn.Parameter, oc optim.Config) (optim.Optimizer, error) {
				return optim.NewInBackward(rt, ps, oc, r.cfg.ZeroGrad == knob.ZeroGradNone)
			}
		}
		opt, err := newOptimizer(r.rt, nn.Trainable(r.model), oc)
		if err != nil {
			panic(err) // Validate accepted the kind
		}
		r.opt = opt
	}
	if r.amp == tensor.F16 {
		r.scaler = optim.NewGradScaler(r.rt)
	}
}

// load is from_pretrained: the model built on the device as transformers loads a checkpoint, each weight
// put there in the checkpoint's dtype and a 4-bit one quantized there (nn.LlamaConfig.Prequantized false).
// Its name is what the importer's frame rules read as the load phase.
func (r *run) load() { r.build() }

// build allocates the model and the dataset.
func (r *run) build() {
	cfg := r.cfg
	switch cfg.Model {
	case "mlp":
		m := nn.NewMLP(r.rt, nn.MLPConfig{In: cfg.InFeatures, Hidden: cfg.Hidden, Layers: cfg.Layers, Classes: cfg.Classes, DType: tensor.F32})
		m.Net.AfterLayer = func(l nn.Layer, out *tensor.Tensor) {
			switch l.(type) {
			case *nn.ReLU:
				r.forwardHook(l.Name(), out)
			case *nn.Linear:
				r.keepOnModule(l.Name(), out)
			}
		}
		r.model, r.mlp = m, m
		r.data = newBlobs(cfg.InFeatures, cfg.Classes, cfg.Seed)
	case "gpt":
		g, err := nn.NewGPT(r.rt, nn.GPTConfig{BlockSize: cfg.Seq, Vocab: cfg.Vocab, Layers: cfg.Layers, Heads: cfg.Heads,
			DModel: cfg.DModel, Dropout: cfg.Dropout, Bias: cfg.Bias, Attention: cfg.Attention.String(),
			DType: r.paramDType(tensor.F32), Built: r.builtBlock()})
		if err != nil {
			panic(err) // Validate checked the shape
		}
		plan := planCheckpoint(cfg.Checkpoint)
		g.Checkpoint, g.CheckpointAttention = plan.blocks, plan.attention
		g.AfterBlock = func(b *nn.Block, out *tensor.Tensor) { r.forwardHook(b.Name(), out) }
		for _, b := range g.Blocks {
			b.Attn.AfterQKV = func(a *nn.CausalSelfAttention, qkv *tensor.Tensor) { r.keepOnModule(a.Name(), qkv) }
		}
		r.model = g
		r.data = newTokens(cfg.Vocab, cfg.Seed)
	case "llama":
		if r.stage != nil {
			r.model = r.buildStage()
		} else if cfg.family() != "" {
			r.model = r.buildDecoder()
		} else {
			r.model = r.buildLlama()
		}
		d := newTokens(cfg.Vocab, cfg.Seed)
		d.labelsAreInputs = true // HF's collator: labels = input_ids.clone(); the model shifts them
		r.data = d
	case "bert":
		r.model = r.buildBert()
		d := newTokens(cfg.Vocab, cfg.Seed)
		d.labelsAreInputs = cfg.Task == TaskMLM // the MLM collator's labels: the inputs (-100 where not masked)
		if cfg.Task == TaskClassify {
			d.classes = cfg.Family.Labels
		}
		r.data = d
	}
	r.res.Parameters = nn.CountParameters(r.model)
	r.res.Trainable = nn.CountTrainable(r.model)
	if r.stage != nil { // a split job's rank: count the whole model
		r.res.Parameters, r.res.Trainable, _ = ModelParameters(r.stage.whole)
	} else if r.rank != nil { // the strategy sharded the model as it was built: count the whole model
		r.res.Parameters, r.res.Trainable, _ = ModelParameters(cfg)
	}
}

// paramDType is the dtype the model's parameters are built in: requested, or the strategy's.
func (r *run) paramDType(requested tensor.DType) tensor.DType {
	if r.rank == nil {
		return requested
	}
	return r.rank.ParamDType(requested)
}

// builtBlock returns the hook a model calls with each block it builds: the strategy's, or nil.
func (r *run) builtBlock() func(nn.Module) {
	if r.rank == nil {
		return nil
	}
	return r.rank.BuiltBlock
}

// step is one training iteration: for each micro-batch data, forward and backward; then the optimizer and
// zero_grad.
func (r *run) step() {
	if r.stage != nil {
		r.res.Losses = append(r.res.Losses, r.pipelineStep())
	} else {
		r.res.Losses = append(r.res.Losses, r.accumulate())
	}

	r.checkInterrupt()
	r.setPhase(snapshot.PhaseOptimizer)
	switch {
	case r.rank != nil:
		r.rank.Step(r.scaler)
	case r.scaler != nil:
		r.scaler.Step(r.opt, nn.Trainable(r.model))
		r.scaler.Update()
	default:
		r.opt.Step()
	}

	if r.cfg.Bug == BugNoZeroGrad { // the loop never calls optimizer.zero_grad()
		return
	}
	r.setPhase(snapshot.PhaseZeroGrad)
	if r.rank != nil {
		r.rank.ZeroGrad(r.cfg.ZeroGrad == knob.ZeroGradNone)
	} else {
		r.opt.ZeroGrad(r.cfg.ZeroGrad == knob.ZeroGradNone)
	}
}

// accumulate runs the step's micro-batches one after the other, each forward then backward, skipping the
// repeated cycles where the run may, and returns the step's loss.
func (r *run) accumulate() float32 {
	var lossSum float32
	cycles := r.newCycleFinder()
	for micro := 0; micro < r.cfg.Accum; micro++ {
		if cycles != nil && micro > 0 && micro < r.cfg.Accum-1 {
			if n, loss := cycles.skip(r, micro, r.cfg.Accum, lossSum); n > 0 {
				micro, lossSum, cycles = micro+n, lossSum+loss, nil
			}
		}
		lossSum += r.microStep(micro == r.cfg.Accum-1)
	}
	return lossSum
}

// microStep loads one micro-batch, runs forward (under autocast when mixed precision is on) and backward,
// and returns its share of the loss. last says it is the step's last micro-batch, whose gradients a
// data-parallel strategy reduces.
func (r *run) microStep(last bool) float32 {
	r.setPhase(snapshot.PhaseData)
	shape := r.nextBatch()
	x, y := r.data.batch(r.rt, shape, "batch")
	defer x.Release()
	defer y.Release()
	r.attentionMask(shape, "batch")

	if r.rank != nil {
		r.rank.BeginForward(r.iteration, last)
	}
	loss := r.forward(x, y)
	defer loss.Release()
	r.checkInterrupt()
	r.setPhase(snapshot.PhaseBackward)
	retain := r.cfg.Bug == BugRetainGraph
	if r.scaler != nil {
		scaled := r.scaler.Scale(loss)
		scaled.Backward(retain)
		scaled.Release()
	} else {
		loss.Backward(retain)
	}
	if r.rank != nil {
		r.rank.EndBackward()
	}
	r.keepLoss(loss)
	return loss.Item()
}

// forward is the forward phase: with autocast: logits, loss = model(X, Y); loss = loss / accum. The logits
// are kept (nanoGPT: the name holds them until the next forward returns and rebinds it) or dropped before
// backward (HF Trainer), as Config.Logits says.
func (r *run) forward(x, y *tensor.Tensor) *tensor.Tensor {
	r.setPhase(snapshot.PhaseForward)
	keep := r.cfg.Logits == LogitsKeep
	var logits, loss *tensor.Tensor
	r.autocast(func() {
		r.rt.OffloadForward(func() { // with OffloadActivations(): the model; its head and loss without
			if keep {
				logits, loss = r.model.ForwardLoss(x, y)
			} else {
				loss = r.model.Loss(x, y)
			}
		})
		if r.cfg.Accum > 1 { // loss = loss / accum, so the accumulated gradient is the mean's
			scaled := tensor.Scale(loss, 1/float32(r.cfg.Accum))
			loss.Release()
			loss = scaled
		}
	})
	if keep {
		if r.logits != nil {
			r.logits.Release()
		}
		r.logits = logits.SetName("logits")
	}
	return loss
}

// autocast runs f under torch.autocast when mixed precision is on.
func (r *run) autocast(f func()) {
	if r.amp == tensor.F32 {
		f()
		return
	}
	r.rt.Autocast(r.amp, f)
}

// keepLoss is what the loop keeps of the loss after backward. The fixed path keeps only its value
// (total_loss += loss.item()), which microStep returns into Result.Losses; the bugs keep the tensor.
func (r *run) keepLoss(loss *tensor.Tensor) {
	switch r.cfg.Bug {
	case BugRetainGraph: // loss_history.append(loss): the tensor, and with it the retained graph
		r.lossHistory = append(r.lossHistory, loss.Ref().SetName(fmt.Sprintf("loss_history[%d]", len(r.lossHistory))))
	case BugTensorLossSum: // total_loss += loss: a new scalar whose graph chains every loss (host memory)
		if r.totalLoss == nil {
			r.totalLoss = loss.Ref().SetName("total_loss")
			return
		}
		sum := tensor.Add(r.totalLoss, loss)
		r.totalLoss.Release()
		r.totalLoss = sum.SetName("total_loss")
	}
}

// forwardHook is a forward hook on every hidden layer (MLP) or block (GPT) that keeps its outputs for
// inspection. The stash-activations bug keeps each output itself, graph and all; the fixed code,
// activations[name] = output.detach().cpu(), keeps a host copy, which takes no device memory.
func (r *run) forwardHook(name string, out *tensor.Tensor) {
	if r.phase != snapshot.PhaseForward || r.cfg.Bug != BugStashActivations {
		return
	}
	r.stash = append(r.stash, out.Ref().SetName(fmt.Sprintf("activation_stash[%d]", len(r.stash))))
}

// keepOnModule is the module-attribute bug, self.intermediate = out in the forward of the module named name
// (the fixed code keeps it in a local, which goes when forward returns). Assigning drops what the attribute
// held, so each module holds its newest intermediate: with its graph until backward frees what the graph
// saved, then the tensor alone, until the next forward replaces it.
func (r *run) keepOnModule(name string, out *tensor.Tensor) {
	if r.cfg.Bug != BugModuleAttribute {
		return
	}
	if r.attributes == nil {
		r.attributes = map[string]*tensor.Tensor{}
	}
	if old := r.attributes[name]; old != nil {
		old.Release()
	}
	r.attributes[name] = out.Ref().SetName(name + ".intermediate")
}

// evaluate runs the model on a held-out batch: under no_grad with .item() metrics on the fixed path; with
// grad on and the outputs kept under the eval-no-grad bug.
func (r *run) evaluate() {
	r.setPhase(snapshot.PhaseEval)
	shape := r.nextBatch()
	x, y := r.data.batch(r.rt, shape, "eval_batch")
	defer x.Release()
	defer y.Release()
	r.attentionMask(shape, "eval_batch")
	if r.cfg.Bug == BugEvalNoGrad { // eval_outputs.append(model(x)) without torch.no_grad()
		var out *tensor.Tensor
		r.autocast(func() {
			if r.mlp != nil {
				out = r.mlp.Forward(x)
			} else {
				out = r.model.Loss(x, y)
			}
		})
		r.evalOutputs = append(r.evalOutputs, out.SetName(fmt.Sprintf("eval_outputs[%d]", len(r.evalOutputs))))
		return
	}
	r.rt.NoGrad(func() {
		r.autocast(func() {
			if r.mlp != nil {
				logits := r.mlp.Forward(x)
				r.res.Accuracy = accuracy(logits, y, r.cfg.Classes)
				logits.Release()
			} else {
				r.model.Loss(x, y).Release()
			}
		})
	})
}

// setPhase ends the current phase and begins p.
func (r *run) setPhase(p snapshot.Phase) {
	r.checkLimit()
	r.endPhase()
	r.phaseEnds(p)
	r.notePeaks()
	r.phase = p
	cat := snapshot.CategoryTemporary
	if p == snapshot.PhaseData {
		cat = snapshot.CategoryInput
	}
	r.rt.SetCategory(cat)
	r.rt.SetPhase(p)
	r.dev.Allocator().ResetPeakStats()
	r.res.Phases = append(r.res.Phases, PhaseStat{Iteration: r.iteration, Phase: p})
	r.phaseMark = true
}

// endPhase closes the open phase's statistics.
func (r *run) endPhase() {
	if !r.phaseMark {
		return
	}
	st := r.dev.Allocator().Stats()
	ps := &r.res.Phases[len(r.res.Phases)-1]
	ps.Peak, ps.End = st.AllocatedBytes.All().Peak, st.AllocatedBytes.All().Current
	r.res.PeakAllocated = max(r.res.PeakAllocated, ps.Peak)
	// Every phase resets the peaks; reserved memory falls when empty_cache or the OOM retry frees segments,
	// so its peak is the highest of every phase's, not the last one's.
	r.res.PeakReserved = max(r.res.PeakReserved, st.ReservedBytes.All().Peak)
	r.phaseMark = false
}

// onOOM takes the heap dump at the moment of the OOM, while every holder still holds.
func (r *run) onOOM(*tensor.OOMError) { r.heapDump("oom") }

// heapDump records who retains each live tensor.
func (r *run) heapDump(reason string) {
	if r.rec == nil {
		return
	}
	edges := r.rt.Retainers()
	out := make([]tracer.Retainer, len(edges))
	for i, e := range edges {
		out[i] = tracer.Retainer{Holder: e.Holder, Parent: e.Parent, Description: e.Description, Device: r.dev.Index(), Addr: e.Addr}
	}
	r.rec.HeapDump(reason, out)
}

// checkInterrupt unwinds the loop when the context is cancelled, or its reserved memory passed the limit.
func (r *run) checkInterrupt() {
	if r.ctx.Err() != nil {
		tensor.Abort(errInterrupted)
	}
	r.checkLimit()
}

// checkLimit unwinds the loop when its reserved memory passed the limit.
func (r *run) checkLimit() {
	if r.limit > 0 && r.mem.maxReserved > r.limit {
		tensor.Abort(errOverLimit)
	}
}
