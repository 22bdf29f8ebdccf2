package main

import (
	"strconv"

	"github.com/spf13/pflag"

	"github.com/oomdbg/oomdbg/workloads/dist"
)

// addParallelFlags puts the data-parallel settings on flags, with s's values as defaults.
func addParallelFlags(fs *pflag.FlagSet, s *dist.Settings) {
	fs.IntVar(&s.GPUs, "gpus", s.GPUs, "GPUs in the job, every node's together (the world size; more than 1 without --dp is ddp)")
	fs.IntVar(&s.Nodes, "nodes", s.Nodes, "nodes the GPUs are on (hsdp shards within a node, replicates across)")
	fs.Var(textFlag{&s.Strategy}, "dp", "data-parallel strategy: none, ddp, zero1, zero2, zero3 (DeepSpeed), fsdp-full, fsdp-grad-op or hsdp (FSDP)")
	fs.IntVar(&s.Rank, "rank", s.Rank, "the rank simulated (zero1 and zero2 ranks differ where their partitions cut parameters)")
	fs.Var(textFlag{&s.Offload}, "offload", "what goes to host memory: none, optimizer (zero1-3) or optimizer+params (zero3, fsdp)")
	fs.BoolVar(&s.OffloadPageable, "offload-pageable", s.OffloadPageable, "deepspeed: keep offloaded buffers in pageable memory (pin_memory false; pinned by default)")
	fs.Float64Var(&s.BucketCapMB, "bucket-cap-mb", s.BucketCapMB, "ddp: gradient bucket size in MiB (0: 25, with a first bucket of 1 MiB)")
	fs.BoolVar(&s.GradientAsBucketView, "gradient-as-bucket-view", s.GradientAsBucketView, "ddp: gradients are views of their buckets, not copies")
	for _, e := range []struct {
		name string
		v    *int64
		def  int64
		doc  string
	}{
		{"reduce-bucket-size", &s.ReduceBucketSize, dist.DefaultReduceBucketSize, "deepspeed: elements reduced at a time (reduce_bucket_size)"},
		{"allgather-bucket-size", &s.AllgatherBucketSize, dist.DefaultAllgatherBucketSize, "deepspeed: elements all-gathered at a time (allgather_bucket_size)"},
		{"prefetch-bucket-size", &s.PrefetchBucketSize, dist.DefaultPrefetchBucketSize, "zero3: parameter elements fetched ahead of use (stage3_prefetch_bucket_size)"},
		{"max-live-parameters", &s.MaxLiveParameters, dist.DefaultMaxLiveParameters, "zero3: most parameter elements gathered at once (stage3_max_live_parameters)"},
		{"max-reuse-distance", &s.MaxReuseDistance, dist.DefaultMaxReuseDistance, "zero3: keep a parameter used again within this many elements (stage3_max_reuse_distance)"},
		{"param-persistence-threshold", &s.ParamPersistenceThreshold, dist.DefaultParamPersistenceThreshold, "zero3: parameters this small stay gathered (stage3_param_persistence_threshold)"},
	} {
		fs.Var(elementsFlag{e.v}, e.name, e.doc+" (0: "+strconv.FormatInt(e.def, 10)+")")
	}
	fs.Var(textFlag{&s.Wrap}, "fsdp-wrap", "fsdp: units: block (each transformer block, decoder layer or linear layer; the rest is the root) or model (one unit)")
}

// elementsFlag is an element count, as DeepSpeed's config writes them (5e8 or 500000000).
type elementsFlag struct{ v *int64 }

func (f elementsFlag) String() string {
	if f.v == nil {
		return "0"
	}
	return strconv.FormatInt(*f.v, 10)
}

func (f elementsFlag) Set(s string) error {
	n, err := dist.ParseElements(s)
	if err != nil {
		return err
	}
	*f.v = n
	return nil
}

func (elementsFlag) Type() string { return "elements" }
