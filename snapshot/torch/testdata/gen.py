#!/usr/bin/env python3
"""Writes the small PyTorch snapshots package torch's tests import, one per schema generation, and the seed
corpus of FuzzImport.

Run from this directory:  python3 gen.py

Each snapshot is built here as PyTorch builds one (docs/pytorch-reference.md §1): the same keys per generation,
frame dicts and traceback lists shared between entries as py_symbolize shares them (so the pickle memo repeats
them with BINGET), a trace consistent with the final segment state under the caching allocator's rules. The
Go tests state what each must import to; the scenario is described next to the data below.

Scenario (device 0; device 1 adds a second trace in G2 and later):
  pre-existing large segment P (20 MiB), allocated before the trace:
      [P, 8 MiB) in use the whole time (a "ghost": only the final state shows it)
      [P+8, P+14 MiB) in use at the start, freed by the trace (request 6 MiB - 100, so block 6 MiB)
      [P+14, P+20 MiB) in use the whole time (ghost)
  small segment S (2 MiB) made by the trace: alloc 1000 B (block 1024), alloc 1500 B (block 1536), free the first
  large segment L (20 MiB) made by the trace: alloc 7 MiB (the free 6 MiB block of P is too small, so a new
      segment; split: block 7 MiB), alloc 12.5 MiB (the 13 MiB rest is not split: block 13 MiB), free the first
"""
import json
import os
import pickle

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "snapshots")
FUZZ = os.path.join(HERE, "fuzz", "FuzzImport")

MiB = 1 << 20
P = 0x7F0000000000
S = 0x7F0002000000
L = 0x7F0004000000
D1 = 0x7E0000000000  # device 1's small segment
T0 = 1700000000000000  # time_us of the first entry


def frame(name, filename, line=0):
    return {"filename": filename, "line": line, "name": name}


# Frames, each dict made once and shared, as PyTorch shares them.
UNWIND = frame("torch::unwind::unwind()", "??")  # hidden by memory_viz's frameFilter
GATHER = frame("torch::CapturedTraceback::gather(bool, bool, bool)", "??")  # hidden
EVAL = frame("_PyEval_EvalFrameDefault", "??")  # hidden
MODEL = frame("forward", "/work/model.py", 42)
TRAIN = frame("train_step", "/work/train.py", 7)
ENGINE = frame("torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::GraphTask>&)", "engine.cpp")
ADAM = frame("_single_tensor_adam", "/usr/lib/python3/dist-packages/torch/optim/adam.py", 350)
STEP = frame("step", "/usr/lib/python3/dist-packages/torch/optim/adam.py", 166)

FWD = [UNWIND, GATHER, MODEL, EVAL, TRAIN]  # a forward allocation: stack forward <- train_step
BWD = [UNWIND, ENGINE]  # an allocation on the autograd thread
OPT = [UNWIND, ADAM, STEP, EVAL, TRAIN]  # the optimizer step


def trace_dev0(gen):
    """The trace of device 0, oldest first: (action, addr, size, frames)."""
    t = [
        ("free_requested", P + 8 * MiB, 6 * MiB - 100, FWD),  # the pre-existing block, freed
        ("free_completed", P + 8 * MiB, 6 * MiB - 100, FWD),
        ("segment_alloc", S, 2 * MiB, FWD),
        ("alloc", S, 1000, FWD),
        ("alloc", S + 1024, 1500, BWD),
        ("free_requested", S, 1000, FWD),
        ("free_completed", S, 1000, FWD),
        ("segment_alloc", L, 20 * MiB, OPT),
        ("alloc", L, 7 * MiB, OPT),
        ("alloc", L + 7 * MiB, 12 * MiB + MiB // 2, OPT),
        ("free_requested", L, 7 * MiB, OPT),
        ("free_completed", L, 7 * MiB, OPT),
    ]
    return t


def entry(gen, action, addr, size, frames, time_us, stream=0):
    e = {"action": action, "addr": addr, "size": size, "stream": stream}
    if gen >= 2:
        e["time_us"] = time_us
    if gen >= 4:
        e["compile_context"] = "N/A"
        e["user_metadata"] = ""
    if gen >= 5:
        e["pool_id"] = (0, 0)
    if frames is not None and gen >= 1:
        e["frames"] = frames
    return e


def block(gen, addr, size, requested, state, frames):
    if gen == 0:
        hist = [{"addr": addr, "real_size": requested, "frames": frames}] if state != "inactive" else []
        return {"size": size, "requested_size": requested, "state": state, "history": hist}
    return {"address": addr, "size": size, "requested_size": requested, "state": state,
            "frames": frames if state != "inactive" else []}


def segment(gen, device, addr, blocks, seg_type, frames, stream=0):
    total = sum(b["size"] for b in blocks)
    alloc = sum(b["size"] for b in blocks if b["state"] == "active_allocated")
    active = sum(b["size"] for b in blocks if b["state"] != "inactive")
    req = sum(b["requested_size"] for b in blocks if b["state"] != "inactive")
    s = {"device": device, "address": addr, "total_size": total, "allocated_size": alloc, "active_size": active,
         "requested_size": req, "stream": stream, "segment_type": seg_type}
    if gen >= 1:
        s["segment_pool_id"] = (0, 0)
        s["is_expandable"] = False
        s["frames"] = frames
    s["blocks"] = blocks
    return s


def final_segments(gen, two_devices):
    segs = [
        segment(gen, 0, P, [
            block(gen, P, 8 * MiB, 8 * MiB, "active_allocated", FWD),
            block(gen, P + 8 * MiB, 6 * MiB, 6 * MiB - 100, "inactive", []),
            block(gen, P + 14 * MiB, 6 * MiB, 6 * MiB, "active_allocated", []),
        ], "large", []),
        segment(gen, 0, S, [
            block(gen, S, 1024, 1000, "inactive", []),
            block(gen, S + 1024, 1536, 1500, "active_allocated", BWD),
            block(gen, S + 2560, 2 * MiB - 2560, 0, "inactive", []),
        ], "small", FWD),
        segment(gen, 0, L, [
            block(gen, L, 7 * MiB, 7 * MiB, "inactive", []),
            block(gen, L + 7 * MiB, 13 * MiB, 12 * MiB + MiB // 2, "active_allocated", OPT),
        ], "large", OPT),
    ]
    if two_devices:
        segs.append(segment(gen, 1, D1, [
            block(gen, D1, 512, 100, "active_allocated", FWD),
            block(gen, D1 + 512, 2 * MiB - 512, 0, "inactive", []),
        ], "small", FWD))
    return segs


def snapshot(gen):
    two = gen >= 2
    traces = [[], []] if two else [[]]
    t = T0
    for action, addr, size, frames in trace_dev0(gen):
        traces[0].append(entry(gen, action, addr, size, frames, t))
        t += 10
    if two:
        # Device 1 works between device 0's entries: 5 us after device 0's first two.
        traces[1] += [entry(gen, "segment_alloc", D1, 2 * MiB, FWD, T0 + 5),
                      entry(gen, "alloc", D1, 100, FWD, T0 + 6)]
        # An OOM on device 1, which the program caught: the rounded request and the device's free bytes.
        oom = entry(gen, "oom", 0, 8 * MiB, FWD, T0 + 200)
        del oom["addr"]
        oom["device_free"] = 3 * MiB
        traces[1].append(oom)
        # A snapshot() taken earlier, as some traces hold.
        traces[1].append(entry(gen, "snapshot", 0, 512, None, T0 + 300))
    d = {"segments": final_segments(gen, two), "device_traces": traces}
    if gen >= 3:
        d["allocator_settings"] = {
            "PYTORCH_CUDA_ALLOC_CONF": "",
            "max_split_size": -1,
            "garbage_collection_threshold": 0.0,
            "expandable_segments": False,
            "pinned_num_register_threads": 1,
            "release_lock_on_cudamalloc": False,
            "pinned_use_cuda_host_register": False,
            "roundup_power2_divisions": {str(1 << i): (4 if i == 2 else 0) for i in range(16)},
        }
        if gen >= 4:
            d["allocator_settings"]["graph_capture_record_stream_reuse"] = False
        if gen >= 5:
            d["allocator_settings"]["max_round_threshold"] = 0
            d["allocator_settings"]["max_cached_size"] = 0
        # record_function regions: step 3 covers everything; the optimizer step covers the large segment's
        # allocations; a user region covers the first small alloc.
        d["external_annotations"] = [
            {"stage": "START", "name": "ProfilerStep#3", "device": 0, "time_us": T0 - 1},
            {"stage": "START", "name": "my_region", "device": 0, "time_us": T0 + 25},
            {"stage": "END", "name": "my_region", "device": 0, "time_us": T0 + 35},
            {"stage": "START", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": T0 + 65},
            {"stage": "END", "name": "Optimizer.step#Adam.step", "device": 0, "time_us": T0 + 95},
            {"stage": "END", "name": "ProfilerStep#3", "device": 0, "time_us": T0 + 1000},
        ]
    if gen >= 4:
        # user_metadata on one entry; the memory profiler's category on another (_profile_to_snapshot).
        traces[0][3]["user_metadata"] = "layer.0"
        traces[0][4]["category"] = "ACTIVATION"
    if gen >= 5:
        traces[0][3]["internal_metadata"] = "mallocWithAddress"
        traces[0].append(entry(gen, "annotate", S + 1024, 1500, FWD, T0 + 500))
        traces[0][-1]["user_metadata"] = "kv cache"
        d["host_segments"] = [{"device": -1, "address": 0x1000, "total_size": 4096, "allocated_size": 0,
                               "active_size": 0, "requested_size": 0, "stream": 0, "segment_type": "small",
                               "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
                               "blocks": [{"address": 0x1000, "size": 4096, "requested_size": 0,
                                           "state": "inactive", "frames": []}]}]
        d["host_traces"] = []
    return d


def dump(name, obj, protocol):
    data = pickle.dumps(obj, protocol=protocol)
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
    return data


def fuzz_seed(name, data):
    lit = "".join("\\x%02x" % b for b in data)
    with open(os.path.join(FUZZ, name), "w") as f:
        f.write('go test fuzz v1\n[]byte("%s")\n' % lit)


class Point:  # an instance pickles with GLOBAL (protocol 2) or STACK_GLOBAL
    def __init__(self, x):
        self.x = x


def main():
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(FUZZ, exist_ok=True)
    seeds = {}
    for gen, proto in [(0, 2), (1, 3), (2, 4), (3, 4), (4, 5), (5, 5)]:
        seeds["g%d_p%d" % (gen, proto)] = dump("g%d.pickle" % gen, snapshot(gen), proto)
    seeds["segments_p2"] = dump("segments.pickle", final_segments(1, False), 2)
    # memory_viz reads JSON of the same schema; tuples become lists.
    with open(os.path.join(OUT, "g3.json"), "w") as f:
        json.dump(snapshot(3), f)
    with open(os.path.join(OUT, "g5.json"), "w") as f:
        json.dump(snapshot(5), f)

    small = pickle.dumps(snapshot(1), protocol=2)
    fuzz_seed("valid_g1_p2", small)
    fuzz_seed("valid_g5_p5", seeds["g5_p5"])
    fuzz_seed("valid_segments_p2", seeds["segments_p2"])
    for name, data in seeds.items():
        fuzz_seed("truncated_" + name, data[: len(data) // 2])
        bad = bytearray(data)
        bad[len(bad) // 3] ^= 0x5A
        fuzz_seed("corrupted_" + name, bytes(bad))
    fuzz_seed("json_g3", json.dumps(snapshot(3)).encode())
    fuzz_seed("json_truncated", json.dumps(snapshot(3)).encode()[:300])
    fuzz_seed("json_list", json.dumps(final_segments(1, False)).encode())
    fuzz_seed("global_p2", pickle.dumps(Point(1), protocol=2))
    fuzz_seed("stack_global_p4", pickle.dumps({"segments": [Point(2)]}, protocol=4))
    fuzz_seed("long4_huge", b"\x80\x04\x8b\xff\xff\xff\x7f.")
    fuzz_seed("unicode8_huge", b"\x80\x04\x8d\x00\x00\x00\x00\x00\x01\x00\x00.")
    fuzz_seed("binunicode_huge", b"\x80\x02X\xff\xff\xff\xff.")
    fuzz_seed("frame_huge", b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f}.")
    fuzz_seed("wrong_types", pickle.dumps({"segments": [], "device_traces": [[{"action": "alloc", "addr": 1,
                                                                                 "size": "big"}]]}, protocol=4))
    fuzz_seed("deep_lists", b"\x80\x02" + b"]" * 300 + b"a" * 299 + b".")


if __name__ == "__main__":
    main()
