#!/usr/bin/env python3
"""Reads a PyTorch memory snapshot with Python's own pickle (classes refused) and prints, as JSON, the counts
and peaks TestFixturesAgainstPython compares Import's result with.

Usage: python3 truth.py SNAPSHOT

Everything here follows memory_viz (torch/utils/viz/MemoryViz.js, process_alloc_data.js), not the Go code:
  actions          trace entries per action, all devices
  segments/blocks  the final state's segments and blocks
  devices          device ordinals seen in segments or in a non-empty trace
  pre_existing     blocks alive before the trace: a free whose address the trace never allocated before it
                   ("alloc not recorded"), and active blocks of the final state the trace never mentions (ghosts)
  active_peak      per device, the peak of the Active Memory Timeline: the sum of the requested sizes of the
                   blocks alive, counting pre-existing ones as alive from the start
  reserved_peak    per device, the peak of reserved bytes: the final segments' total, rolled back over the
                   trace's segment events to the start, then replayed forward
  allocated_end    per device, the bytes of the final state's active_allocated blocks
  forward_allocs   alloc entries made inside a module's __call__ (torch/nn/modules/module.py _call_impl or
                   _wrapped_call_impl on the stack) with no frame of backward, checkpoint recompute, an
                   optimizer or zero_grad: what the importer labels forward
"""
import collections
import json
import pickle
import sys


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError("refused %s.%s" % (module, name))


MODULE = "torch/nn/modules/module.py"
CHECKPOINT = "torch/utils/checkpoint.py"


def names_other_phase(f):
    """Whether a frame says backward, recompute, optimizer or zero_grad."""
    name, file = f["name"], f["filename"]
    return ("torch::autograd::Engine::" in name or "torch::autograd::python::PythonEngine::" in name
            or "torch::autograd::AccumulateGrad::" in name
            or ("torch::autograd::generated::" in name and "Backward" in name)
            or (file.endswith("torch/autograd/__init__.py") and name in ("backward", "grad"))
            or (file.endswith("torch/autograd/graph.py") and name == "_engine_run_backward")
            or (file.endswith("torch/_tensor.py") and name == "backward")
            or (file.endswith(CHECKPOINT) and name in ("backward", "unpack", "unpack_hook", "recompute_fn"))
            or (name == "zero_grad" and ("/torch/optim/" in file or file.endswith(MODULE)))
            or ("/torch/optim/" in file and "lr_scheduler" not in file))


def main(path):
    with open(path, "rb") as f:
        data = SafeUnpickler(f).load()
    if isinstance(data, list):
        data = {"segments": data, "device_traces": []}
    segments = data.get("segments", [])
    traces = data.get("device_traces", [])

    out = {"actions": collections.Counter(), "segments": len(segments),
           "blocks": sum(len(s["blocks"]) for s in segments), "devices": set(), "pre_existing": 0,
           "active_peak": {}, "reserved_peak": {}, "allocated_end": collections.Counter(), "forward_allocs": 0}
    for s in segments:
        out["devices"].add(s["device"])
        for b in s["blocks"]:
            if b["state"] == "active_allocated":
                out["allocated_end"][s["device"]] += b["size"]
    for dev, trace in enumerate(traces):
        if trace:
            out["devices"].add(dev)
        for e in trace:
            out["actions"][e["action"]] += 1
            frames = e.get("frames") or []
            if (e["action"] == "alloc"
                    and any(f["filename"].endswith(MODULE) and f["name"] in ("_call_impl", "_wrapped_call_impl")
                            for f in frames)
                    and not any(names_other_phase(f) for f in frames)):
                out["forward_allocs"] += 1

    for dev in sorted(out["devices"]):
        trace = traces[dev] if dev < len(traces) else []
        # Active memory: requested bytes of live blocks.
        alive = {}
        seen = set()
        initial = 0
        for e in trace:
            a = e["action"]
            if a == "alloc":
                alive[e["addr"]] = e["size"]
                seen.add(e["addr"])
            elif a in ("free_requested", "free_completed"):
                if e["addr"] not in alive and e["addr"] not in seen:
                    initial += e["size"]  # allocated before the trace
                    out["pre_existing"] += 1
                    seen.add(e["addr"])
                elif a == "free_completed":
                    alive.pop(e["addr"], None)
        for s in segments:
            if s["device"] != dev:
                continue
            addr = s["address"]
            for b in s["blocks"]:
                baddr = b.get("address", addr)
                addr = baddr + b["size"]
                if b["state"] != "inactive" and baddr not in seen:
                    initial += b["requested_size"]
                    out["pre_existing"] += 1
        cur = peak = initial
        alive_req = {}
        for e in trace:
            a = e["action"]
            if a == "alloc":
                alive_req[e["addr"]] = e["size"]
                cur += e["size"]
                peak = max(peak, cur)
            elif a == "free_completed":
                cur -= alive_req.pop(e["addr"], e["size"])
        out["active_peak"][dev] = peak

        # Reserved memory: roll the final total back to the start, then forward.
        total = sum(s["total_size"] for s in segments if s["device"] == dev)
        for e in trace:
            if e["action"] in ("segment_alloc", "segment_map"):
                total -= e["size"]
            elif e["action"] in ("segment_free", "segment_unmap"):
                total += e["size"]
        cur = peak = total
        for e in trace:
            if e["action"] in ("segment_alloc", "segment_map"):
                cur += e["size"]
                peak = max(peak, cur)
            elif e["action"] in ("segment_free", "segment_unmap"):
                cur -= e["size"]
        out["reserved_peak"][dev] = peak

    out["devices"] = sorted(out["devices"])
    out["allocated_end"] = {str(k): v for k, v in out["allocated_end"].items()}
    out["active_peak"] = {str(k): v for k, v in out["active_peak"].items()}
    out["reserved_peak"] = {str(k): v for k, v in out["reserved_peak"].items()}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1])
