// Package nvml reads live device memory from the NVIDIA driver through NVML (internal/nvmlib).
//
// A [Session] lists the devices ([Session.Devices]: name, UUID, memory, utilization and the processes using
// each GPU) and takes cheap memory readings ([Session.Sample]) that a [Sampler] polls in the background while a
// workload runs, so a recording can set the driver's view of a device next to the allocator's.
//
// libnvidia-ml.so.1 is loaded with dlopen when the session opens, without cgo, so programs build without a C
// compiler and start on machines without an NVIDIA driver. There [Open] fails with an error that matches [ErrNoDriver] and says so in one line;
// callers show that line and carry on without GPU readings.
//
// Processes are reported by PID as NVML sees them: NVML reports PIDs of the host's PID namespace. Inside a
// container with its own PID namespace those PIDs usually do not exist (or name another process), so such
// processes are listed with their memory but flagged as not visible ([Process.Visible]) instead of being
// given a wrong name or failing the listing. [WithProcRoot] points the lookup at a host /proc mounted in the
// container.
//
// Tests inject a binding with [WithLibrary] (internal/nvmlib/nvmlibtest's fake DGX H100), or load the real
// binding on a fake library built from C (testdata/fakenvml) with [WithLibraryPath].
package nvml
