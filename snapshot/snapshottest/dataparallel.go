package snapshottest

import (
	_ "embed"
	"slices"
)

//go:embed testdata/dataparallel-oom.json
var dataParallelOOM []byte

// DataParallelOOM returns a PyTorch memory snapshot in _dump_snapshot's schema (as JSON, which the importer
// reads as it reads the pickle) of the shape of a real out-of-memory error under nn.DataParallel on three
// GPUs with expandable segments (shared/fixtures f8), in MiB where that one is in GiB. Written by hand from
// the allocator's rules, its figures are known without oomdbg:
//
//   - allocator_settings: expandable_segments:True; one expandable segment a device, mapped in 20 MiB pages.
//   - cuda:0 holds the model's 8 MiB of parameters and 4 activations of 2 MiB: 16 MiB allocated, 20 mapped.
//   - cuda:1 and cuda:2 each get an 8 MiB replica of the parameters in forward; cuda:2's forward makes 5, 5
//     and 4 MiB: 22 MiB allocated, 40 mapped.
//   - cuda:1's forward makes 14 activations of 5 MiB: 78 MiB allocated, 80 mapped; the next 5 MiB request
//     fails with 1 MiB free on the device: 78 + 5 = 83 MiB is more than the 80 + 1 the allocator could have,
//     a capacity OOM on cuda:1, with 116 MiB allocated over the three devices.
//   - The exception unwinds cuda:1's forward: its activations are freed; the final state is the trace's end.
func DataParallelOOM() []byte { return slices.Clone(dataParallelOOM) }
