// Package torchrules holds the rules of PyTorch's CUDA caching allocator that more than one part of oomdbg
// needs, in one place: its constants, round_size with the roundup_power2_divisions table,
// get_allocation_size and should_split, the PYTORCH_CUDA_ALLOC_CONF parser (as strict as PyTorch's own),
// format_size and the text of the out-of-memory message.
//
// The allocator model (allocator), the snapshot importer (snapshot/torch), the exporter
// (snapshot/export), the test generator (snapshot/snapshottest) and the OOM explanation (triage) all use
// these, so they cannot drift apart. docs/allocator.md says what each rule is and where PyTorch keeps it.
package torchrules
