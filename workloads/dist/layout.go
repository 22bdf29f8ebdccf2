package dist

import (
	"math"
	"slices"

	"github.com/oomdbg/oomdbg/workloads/tensor"
)

// How each implementation lays parameters out: pure arithmetic on sizes, shared by the ranks and by what
// compares ranks.

// bucketAssignment is the reducer's compute_bucket_assignment_by_size (torch/csrc/distributed/c10d/
// reducer.cpp): tensors, taken in the order given, go to the open bucket of their dtype, which closes as soon
// as it holds at least its limit; each dtype walks limits in order, the last repeating. The result lists the
// buckets in the order they closed, the ones left open at the end after them, each bucket's indices in
// order. (The reducer also sorts by smallest index when given no tensor indices, which happens only for the
// single bucket of the first iteration.)
func bucketAssignment(sizes []int64, dtypes []tensor.DType, limits []int64) [][]int {
	type open struct {
		indices []int
		size    int64
		limit   int
	}
	var result [][]int
	buckets := map[tensor.DType]*open{}
	var order []tensor.DType // dtypes by first appearance: the reducer's map is unordered, this one is not
	for i, size := range sizes {
		b := buckets[dtypes[i]]
		if b == nil {
			b = &open{}
			buckets[dtypes[i]] = b
			order = append(order, dtypes[i])
		}
		b.indices = append(b.indices, i)
		b.size += size
		if b.size >= limits[b.limit] {
			result = append(result, b.indices)
			b.indices, b.size = nil, 0
			b.limit = min(b.limit+1, len(limits)-1)
		}
	}
	for _, d := range order {
		if b := buckets[d]; len(b.indices) > 0 {
			result = append(result, b.indices)
		}
	}
	return result
}

// noLimit is the single bucket's limit of the first iteration (sys.maxsize).
const noLimit = math.MaxInt64

// zeroPartition is how DeepSpeed's stage 1 and 2 divide a flat group of parameters among the ranks
// (runtime/zero/stage_1_and_2.py): the group is flattened in order and padded to a multiple of
// nccl_start_alignment_factor (2) times the world size; each rank owns an equal slice of it.
type zeroPartition struct {
	aligned int64 // elements of the flat buffer, padding included
	size    int64 // elements of each rank's partition
	padding int64 // elements of padding, all in the last partitions
}

func newZeroPartition(total int64, world int) zeroPartition {
	alignment := int64(2 * world)
	aligned := ceilDiv(total, alignment) * alignment
	return zeroPartition{aligned: aligned, size: aligned / int64(world), padding: aligned - total}
}

// paramsIn returns, for rank, the parameters (given by their element counts, in flat order) that overlap
// its partition (get_partition_info's params_in_partition, whole parameters, those straddling its edges
// included) and the sum of their elements: the size of its grads_in_partition buffer.
func (z zeroPartition) paramsIn(numels []int64, rank int) (in []int, elements int64) {
	start, end := z.size*int64(rank), z.size*int64(rank+1)
	var off int64
	for i, n := range numels {
		if off < end && off+n > start {
			in = append(in, i)
			elements += n
		}
		off += n
	}
	return in, elements
}

// DistinctRanks returns the ranks whose memory differs from every lower rank's, rank 0 first: under ZeRO
// stages 1 and 2 a rank's gradient buffer holds every parameter that reaches into its partition, whole, so
// ranks whose partition edges cut large parameters hold more. Every other strategy gives each rank the same
// shares (FSDP and ZeRO-3 pad every shard to the same size), so its list is rank 0 alone. numels are the
// trainable parameters' element counts in registration order.
func DistinctRanks(s Settings, numels []int64) []int {
	if s.Strategy != ZeRO1 && s.Strategy != ZeRO2 {
		return []int{0}
	}
	var total int64
	for _, n := range numels {
		total += n
	}
	z := newZeroPartition(total, s.World())
	var seen []int64
	var ranks []int
	for r := range s.World() {
		_, e := z.paramsIn(numels, r)
		if !slices.Contains(seen, e) {
			seen = append(seen, e)
			ranks = append(ranks, r)
		}
	}
	return ranks
}
