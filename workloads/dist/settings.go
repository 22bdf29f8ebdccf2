package dist

import (
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/oomdbg/oomdbg/internal/words"
)

// Strategy is how the ranks of a data-parallel job share the work (--dp).
type Strategy uint8

// The strategies. Single, the zero value, is one process on one GPU.
const (
	Single     Strategy = iota
	DDP                 // torch.nn.parallel.DistributedDataParallel: everything replicated, gradients all-reduced in buckets
	ZeRO1               // DeepSpeed ZeRO stage 1: optimizer state (and fp32 master weights) partitioned
	ZeRO2               // stage 2: gradients partitioned too
	ZeRO3               // stage 3: parameters partitioned too, gathered module by module
	FSDPFull            // FullyShardedDataParallel, ShardingStrategy.FULL_SHARD
	FSDPGradOp          // FSDP SHARD_GRAD_OP: parameters stay gathered from forward to backward
	HSDP                // FSDP HYBRID_SHARD: FULL_SHARD within a node, replicated across nodes
	FSDP2               // fully_shard (FSDP2): each parameter sharded on dim 0 (DTensor Shard(0))
)

var strategyNames = []string{"none", "ddp", "zero1", "zero2", "zero3", "fsdp-full", "fsdp-grad-op", "hsdp", "fsdp2"}

// Strategies lists every data-parallel strategy (all but Single), for a planner to choose among.
var Strategies = []Strategy{DDP, ZeRO1, ZeRO2, ZeRO3, FSDPFull, FSDPGradOp, HSDP, FSDP2}

// ParseStrategy reads a strategy: none, ddp, zero1, zero2, zero3, fsdp-full, fsdp-grad-op, hsdp or fsdp2 ("" is
// none).
func ParseStrategy(s string) (Strategy, error) {
	i, err := words.Parse(strategyNames, "data-parallel strategy", s)
	return Strategy(i), err
}

func (s Strategy) String() string                   { return words.Name(strategyNames, int(s), "strategy") }
func (s Strategy) MarshalText() ([]byte, error)     { return []byte(s.String()), nil }
func (s *Strategy) UnmarshalText(text []byte) error { return words.Into(s, ParseStrategy, text) }

// ZeRO reports whether s is one of DeepSpeed's stages.
func (s Strategy) ZeRO() bool { return s == ZeRO1 || s == ZeRO2 || s == ZeRO3 }

// FSDP reports whether s is one of FSDP's sharding strategies, FSDP2's included.
func (s Strategy) FSDP() bool { return s == FSDPFull || s == FSDPGradOp || s == HSDP || s == FSDP2 }

// Reshard is FSDP2's reshard_after_forward (--reshard-after-forward): whether a module's parameters are
// freed after its forward and gathered again in backward. The zero value is fully_shard's default, true
// (the root module's excepted: fully_shard keeps the root's gathered for backward).
type Reshard uint8

// The settings of reshard_after_forward.
const (
	ReshardTrue Reshard = iota
	ReshardFalse
)

var reshardNames = []string{"true", "false"}

// ParseReshard reads reshard_after_forward: true or false ("" is true).
func ParseReshard(s string) (Reshard, error) {
	i, err := words.Parse(reshardNames, "reshard_after_forward", s)
	return Reshard(i), err
}

func (r Reshard) String() string                   { return words.Name(reshardNames, int(r), "reshard") }
func (r Reshard) MarshalText() ([]byte, error)     { return []byte(r.String()), nil }
func (r *Reshard) UnmarshalText(text []byte) error { return words.Into(r, ParseReshard, text) }

// Offload is what moves to host memory (--offload).
type Offload uint8

// The offloads. None is the zero value.
const (
	OffloadNone Offload = iota
	// OffloadOptimizer keeps the optimizer state and fp32 master weights in host memory and runs the
	// optimizer step there (DeepSpeed's offload_optimizer, ZeRO-Offload).
	OffloadOptimizer
	// OffloadOptimizerParams offloads the parameters' shards too (DeepSpeed ZeRO-3's offload_param; FSDP's
	// CPUOffload(offload_params=True), which offloads gradients and the step with them).
	OffloadOptimizerParams
)

var offloadNames = []string{"none", "optimizer", "optimizer+params"}

// Offloads lists the offloads a planner may choose among, none first.
var Offloads = []Offload{OffloadNone, OffloadOptimizer, OffloadOptimizerParams}

// ParseOffload reads an offload: none, optimizer or optimizer+params ("" is none).
func ParseOffload(s string) (Offload, error) {
	i, err := words.Parse(offloadNames, "offload", s)
	return Offload(i), err
}

func (o Offload) String() string                   { return words.Name(offloadNames, int(o), "offload") }
func (o Offload) MarshalText() ([]byte, error)     { return []byte(o.String()), nil }
func (o *Offload) UnmarshalText(text []byte) error { return words.Into(o, ParseOffload, text) }

// Wrap is FSDP's wrapping policy (--fsdp-wrap): which modules are units of their own.
type Wrap uint8

// The wrapping policies. WrapBlock, the zero value, is transformer_auto_wrap_policy on the model's repeated
// blocks (a GPT's transformer blocks, a Llama's decoder layers, an MLP's linear layers), the rest of the
// model forming the root unit; WrapModel is FSDP(model) with no auto-wrap: one unit.
const (
	WrapBlock Wrap = iota
	WrapModel
)

var wrapNames = []string{"block", "model"}

// Wraps lists the wrapping policies.
var Wraps = []Wrap{WrapBlock, WrapModel}

// ParseWrap reads a wrapping policy: block or model ("" is block).
func ParseWrap(s string) (Wrap, error) {
	i, err := words.Parse(wrapNames, "fsdp wrap", s)
	return Wrap(i), err
}

func (w Wrap) String() string                   { return words.Name(wrapNames, int(w), "wrap") }
func (w Wrap) MarshalText() ([]byte, error)     { return []byte(w.String()), nil }
func (w *Wrap) UnmarshalText(text []byte) error { return words.Into(w, ParseWrap, text) }

// The defaults each implementation ships with, used for a setting left at zero.
const (
	// DefaultBucketCapMB is DistributedDataParallel's bucket_cap_mb (torch/nn/parallel/distributed.py).
	DefaultBucketCapMB = 25
	// FirstBucketBytes is dist._DEFAULT_FIRST_BUCKET_BYTES (c10d's kDefaultFirstBucketBytes, 1 MiB): the
	// cap of the first bucket the reducer rebuilds after the first iteration, so that the first all-reduce
	// starts early.
	FirstBucketBytes = 1 << 20

	// DeepSpeed's runtime/zero/config.py defaults, in elements.
	DefaultReduceBucketSize          = 500_000_000   // reduce_bucket_size
	DefaultAllgatherBucketSize       = 500_000_000   // allgather_bucket_size
	DefaultPrefetchBucketSize        = 50_000_000    // stage3_prefetch_bucket_size
	DefaultMaxLiveParameters         = 1_000_000_000 // stage3_max_live_parameters
	DefaultMaxReuseDistance          = 1_000_000_000 // stage3_max_reuse_distance
	DefaultParamPersistenceThreshold = 100_000       // stage3_param_persistence_threshold
	DefaultSubGroupSize              = 1_000_000_000 // sub_group_size: fp32 gradients made for this many elements at a time

	// MaxGPUs bounds the world size: past it, no job runs (and a rank's share is rounding).
	MaxGPUs = 1 << 20
	// MaxBucketElements bounds DeepSpeed's element counts: 2^40 elements is 2 TiB of fp16.
	MaxBucketElements = 1 << 40
)

// Settings is a data-parallel job as one of its ranks sees it: how many GPUs on how many nodes, the
// strategy, which rank is simulated, what is offloaded, and each implementation's knobs. A zero knob takes
// the implementation's default; the zero Settings is one GPU.
type Settings struct {
	GPUs     int      `json:"gpus,omitempty"`  // the world size, every node's GPUs together
	Nodes    int      `json:"nodes,omitempty"` // nodes, each with GPUs/Nodes of them (0: one)
	Strategy Strategy `json:"strategy,omitzero"`
	Rank     int      `json:"rank,omitempty"` // the rank simulated, from 0
	Offload  Offload  `json:"offload,omitzero"`
	// OffloadPageable keeps DeepSpeed's offloaded buffers in pageable memory (offload_*.pin_memory false);
	// by default they are pinned (its default, true) and go through the caching host allocator. FSDP always
	// pins its offloaded shards and gradients.
	OffloadPageable bool `json:"offload_pageable,omitempty"`

	// DDP.
	BucketCapMB          float64 `json:"bucket_cap_mb,omitempty"` // MiB (0: DefaultBucketCapMB)
	GradientAsBucketView bool    `json:"gradient_as_bucket_view,omitempty"`

	// DeepSpeed ZeRO, in elements (0: the defaults above).
	ReduceBucketSize          int64 `json:"reduce_bucket_size,omitempty"`
	AllgatherBucketSize       int64 `json:"allgather_bucket_size,omitempty"`
	PrefetchBucketSize        int64 `json:"stage3_prefetch_bucket_size,omitempty"`
	MaxLiveParameters         int64 `json:"stage3_max_live_parameters,omitempty"`
	MaxReuseDistance          int64 `json:"stage3_max_reuse_distance,omitempty"`
	ParamPersistenceThreshold int64 `json:"stage3_param_persistence_threshold,omitempty"`

	// FSDP.
	Wrap Wrap `json:"fsdp_wrap,omitzero"`
	// ReshardAfterForward is FSDP2's reshard_after_forward.
	ReshardAfterForward Reshard `json:"reshard_after_forward,omitzero"`

	// OneStream runs communication on the default stream, as oomdbg's model did before it had streams:
	// every block is reusable at once, and FSDP's second unit in flight is gathered early instead. By
	// default each implementation's collectives run on its own streams (docs/distributed.md, "Streams").
	OneStream bool `json:"one_stream,omitempty"`
}

// World returns the number of GPUs (1 for the zero Settings).
func (s Settings) World() int { return max(s.GPUs, 1) }

// NodeCount returns the number of nodes (1 for the zero Settings).
func (s Settings) NodeCount() int { return max(s.Nodes, 1) }

// PerNode returns the GPUs of one node.
func (s Settings) PerNode() int { return s.World() / s.NodeCount() }

// Parallel reports whether s describes a data-parallel job (a strategy other than Single).
func (s Settings) Parallel() bool { return s.Strategy != Single }

// ShardGroup returns how many ranks share one copy of what the strategy shards: the world, or for HSDP
// the ranks of one node.
func (s Settings) ShardGroup() int {
	if s.Strategy == HSDP {
		return s.PerNode()
	}
	return s.World()
}

// withDefaults returns s with every zero knob set to its implementation's default.
func (s Settings) withDefaults() Settings {
	set := func(v *int64, d int64) {
		if *v == 0 {
			*v = d
		}
	}
	if s.BucketCapMB == 0 {
		s.BucketCapMB = DefaultBucketCapMB
	}
	set(&s.ReduceBucketSize, DefaultReduceBucketSize)
	set(&s.AllgatherBucketSize, DefaultAllgatherBucketSize)
	set(&s.PrefetchBucketSize, DefaultPrefetchBucketSize)
	set(&s.MaxLiveParameters, DefaultMaxLiveParameters)
	set(&s.MaxReuseDistance, DefaultMaxReuseDistance)
	set(&s.ParamPersistenceThreshold, DefaultParamPersistenceThreshold)
	return s
}

// BucketCapBytes is DDP's bucket_bytes_cap: int(bucket_cap_mb * 1024 * 1024).
func (s Settings) BucketCapBytes() int64 {
	return int64(s.withDefaults().BucketCapMB * 1024 * 1024)
}

// SettingError is a setting that holds a value it cannot hold. Field is the setting's JSON name.
type SettingError struct {
	Field  string
	Value  any
	Reason string
}

func (e *SettingError) Error() string { return fmt.Sprintf("%s %v: %s", e.Field, e.Value, e.Reason) }

// Validate checks every number of s and how the settings combine, and says what is wrong in one line.
func (s Settings) Validate() error {
	type check struct {
		field string
		value int64
		max   int64
	}
	for _, c := range []check{{"gpus", int64(s.GPUs), MaxGPUs}, {"nodes", int64(s.Nodes), MaxGPUs},
		{"reduce_bucket_size", s.ReduceBucketSize, MaxBucketElements}, {"allgather_bucket_size", s.AllgatherBucketSize, MaxBucketElements},
		{"stage3_prefetch_bucket_size", s.PrefetchBucketSize, MaxBucketElements}, {"stage3_max_live_parameters", s.MaxLiveParameters, MaxBucketElements},
		{"stage3_max_reuse_distance", s.MaxReuseDistance, MaxBucketElements},
		{"stage3_param_persistence_threshold", s.ParamPersistenceThreshold, MaxBucketElements}} {
		if c.value < 0 || c.value > c.max {
			return &SettingError{c.field, c.value, fmt.Sprintf("must be in [0, %d] (0: the default)", c.max)}
		}
	}
	switch {
	case math.IsNaN(s.BucketCapMB) || s.BucketCapMB < 0 || s.BucketCapMB > 1<<30:
		return &SettingError{"bucket_cap_mb", s.BucketCapMB, "must be a number of MiB in [0, 2^30] (0: 25)"}
	case s.Strategy > FSDP2 || s.Offload > OffloadOptimizerParams || s.Wrap > WrapModel || s.ReshardAfterForward > ReshardFalse:
		return fmt.Errorf("invalid data-parallel settings: %s, %s, %s, %s", s.Strategy, s.Offload, s.Wrap, s.ReshardAfterForward)
	case s.ReshardAfterForward != ReshardTrue && s.Strategy != FSDP2:
		return fmt.Errorf("reshard_after_forward false is fully_shard's (--dp fsdp2); FSDP1 keeps parameters gathered with --dp fsdp-grad-op")
	case s.World()%s.NodeCount() != 0:
		return &SettingError{"nodes", s.Nodes, fmt.Sprintf("do not divide the %d GPUs", s.World())}
	case s.Rank < 0 || s.Rank >= s.World():
		return &SettingError{"rank", s.Rank, fmt.Sprintf("is not one of the %d ranks (0 to %d)", s.World(), s.World()-1)}
	case !s.Parallel() && (s.World() > 1 || s.Offload != OffloadNone):
		return fmt.Errorf("%d GPUs and offload %s need a data-parallel strategy (--dp)", s.World(), s.Offload)
	}
	switch {
	case s.Offload == OffloadNone:
	case s.Strategy == DDP:
		return fmt.Errorf("ddp offloads nothing: offload the optimizer with zero1, zero2 or zero3, or parameters with zero3 or fsdp")
	case s.Strategy == FSDP2:
		return fmt.Errorf("fsdp2's CPUOffloadPolicy is not modelled: offload with fsdp-full (CPUOffload) or zero3")
	case s.Strategy.FSDP() && s.Offload == OffloadOptimizer:
		return fmt.Errorf("fsdp offloads parameters, gradients and the step together (CPUOffload(offload_params=True)): use --offload optimizer+params")
	case (s.Strategy == ZeRO1 || s.Strategy == ZeRO2) && s.Offload == OffloadOptimizerParams:
		return fmt.Errorf("deepspeed offloads parameters only at stage 3 (offload_param): use zero3, or --offload optimizer")
	}
	return nil
}

// ParseElements reads an element count as DeepSpeed's config accepts one: an integer, or a number in
// scientific notation that is one (5e8), from 0 to MaxBucketElements.
func ParseElements(s string) (int64, error) {
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil || f != math.Trunc(f) || f < 0 || f > MaxBucketElements {
		return 0, fmt.Errorf("%q is not a number of elements from 0 to 2^40 (e.g. 500000000 or 5e8)", s)
	}
	return int64(f), nil
}
