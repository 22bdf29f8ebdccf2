package load

// What one event of a snapshot costs each command, loaded and analysed, in bytes: a command's Budget.PerEvent.
// They are peak resident memory over events, measured with /usr/bin/time -f %M on an 11.7M-event recording
// of gpt2-small (report 43, diff 45 a file with both files held, check 8, export 83 for perfetto and 50 for
// torch, replay 33, view 38 with its collector at GOGC 50 and up to 59 at the default 100), rounded up. The
// events are held in columns that share the fields a training loop repeats (snapshot.Events): a recording
// whose events share nothing takes up to 50 bytes more an event. A snapshot whose events would not fit
// --max-memory at these rates is refused while it is read, before the analysis starts.
const (
	CostAnalyse = 48 // report, check, diff: the events, their Timeline index and the analysis
	CostExport  = 96 // export: perfetto's per-event counters besides
	CostReplay  = 40 // replay: the trace and the allocator model
	// CostView is what the TUI takes for an event of a run it holds whole, with its Timeline index and room
	// for the garbage collector: view refuses a file past it, and the TUI pages a run whose events would
	// take more than its budget at this rate.
	CostView = 64
)
