// Package whatif is the what-if: a fix applied to a recorded trace and replayed through the allocator
// model, before and after, with a verdict. It owns the whole of it: the transformations of a trace's
// requests (whatif/transform), a fix's preparation and replay (prepare.go), the verdict and its report
// (report.go), and the catalogue of fixes the TUI offers on a trace, ranked (catalogue.go). oomdbg whatif
// and the TUI's fixes pane both call Evaluate.
//
// Where a fix places releases the trace does not record (checkpointing), it replays both ends of what the
// trace allows, and a verdict that differs between them is at the edge.
package whatif
