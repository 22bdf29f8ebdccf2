// Package recorder runs a PyTorch training job unchanged under oomdbg's recorder (oomdbg record -- COMMAND):
// a Python module carried inside the binary, written with a sitecustomize hook into a private temporary
// directory put first on PYTHONPATH, turns on torch.cuda.memory's history when the job starts using CUDA,
// marks its iterations and phases from hooks on modules, autograd and optimizers, records which blocks hold
// parameters, gradients, optimizer state and the batch, and dumps PyTorch snapshots with those tags, one
// set of files per rank, at an out-of-memory error, on SIGUSR1 and SIGTERM, at exit and every N steps.
//
// Run starts the job with its standard streams passed through, forwards SIGINT, SIGTERM and SIGHUP to it
// and returns its exit status untouched; Dumps lists what it wrote. The dumps are ordinary pickles of
// torch.cuda.memory._snapshot() (memory_viz opens them) with one key added, "oomdbg", which snapshot/torch
// reads (docs/pytorch-snapshots.md, "Recorded tags").
package recorder
