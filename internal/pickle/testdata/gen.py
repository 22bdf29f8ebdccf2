#!/usr/bin/env python3
"""Writes the Python-made test pickles of package pickle and the truth the Go tests compare against.

Run from this directory:  python3 gen.py

For each case and protocol it writes python/<case>.p<N>.pickle, made by pickle.dumps, and python/<case>.p<N>.json
holding what Python's own pickle.loads makes of that file: either {"render": ...} in the tagged form below, or
{"refused": "<first opcode that would run code>"}, or {"cycle": true} for a self-referencing structure (Python
loads it; the Go decoder refuses it). It also writes the seed corpus of FuzzDecode in fuzz/FuzzDecode.

Rendering (the Go test renders its decode the same way):
  None ["none"]   bool ["bool", b]   int ["int", "<decimal>"]   float ["float", "<IEEE-754 bits, hex>"]
  str ["str", s], or ["strx", "<utf-8 surrogatepass hex>"] when s holds lone surrogates
  bytes ["bytes", hex]   bytearray ["bytearray", hex]   tuple ["tuple", [...]]   frozenset ["frozenset", [...]]
  list ["list", n, [...]]   dict ["dict", n, [[k, v], ...]]   set ["set", n, [...]]
  a list, dict or set met again ["ref", n]
n numbers the mutable containers in depth-first order of first appearance, so sharing is part of the truth.
Set and frozenset elements are sorted by their JSON text: their iteration order is not part of pickle's contract.
"""
import io
import json
import os
import pickle
import pickletools
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "python")
FUZZ = os.path.join(HERE, "fuzz", "FuzzDecode")

UNSAFE = {"GLOBAL", "STACK_GLOBAL", "REDUCE", "BUILD", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "PERSID",
          "BINPERSID", "EXT1", "EXT2", "EXT4", "NEXT_BUFFER", "READONLY_BUFFER"}


class Point:  # an instance pickles with GLOBAL or STACK_GLOBAL
    def __init__(self, x):
        self.x = x


def render(v, ids):
    if v is None:
        return ["none"]
    if isinstance(v, bool):
        return ["bool", v]
    if isinstance(v, int):
        return ["int", str(v)]
    if isinstance(v, float):
        return ["float", struct.pack(">d", v).hex()]
    if isinstance(v, str):
        try:
            v.encode("utf-8")
            return ["str", v]
        except UnicodeEncodeError:
            return ["strx", v.encode("utf-8", "surrogatepass").hex()]
    if isinstance(v, bytes):
        return ["bytes", v.hex()]
    if isinstance(v, bytearray):
        return ["bytearray", bytes(v).hex()]
    if isinstance(v, tuple):
        return ["tuple", [render(x, ids) for x in v]]
    if isinstance(v, frozenset):
        return ["frozenset", sorted((render(x, ids) for x in v), key=lambda r: json.dumps(r))]
    if isinstance(v, (list, dict, set)):
        if id(v) in ids:
            return ["ref", ids[id(v)]]
        n = ids[id(v)] = len(ids)
        if isinstance(v, list):
            return ["list", n, [render(x, ids) for x in v]]
        if isinstance(v, dict):
            return ["dict", n, [[render(k, ids), render(x, ids)] for k, x in v.items()]]
        return ["set", n, sorted((render(x, ids) for x in v), key=lambda r: json.dumps(r))]
    raise TypeError(type(v))


def cases():
    """Yields (name, object, lowest protocol that pickles it without code opcodes)."""
    yield "none", None, 2
    yield "bools", [True, False], 2
    yield "ints", [0, 1, 255, 256, 65535, 65536, -1, -256, -(2**31), 2**31 - 1, 2**31, -(2**31) - 1,
                   2**63 - 1, -(2**63), 2**63, 2**64 - 1, -(2**64), 2**100, -(2**100), 126968225857536,
                   1773270053858957], 2
    yield "long4", [2**3000, -(2**3000) + 7], 2
    yield "floats", [0.0, -0.0, 1.5, -2.25, 1e308, 5e-324, float("inf"), float("-inf"), float("nan")], 2
    yield "strs", ["", "a", "ü€𝄞", "x" * 255, "y" * 256, "\x00\n\r\\\"'"], 2
    yield "surrogate", ["\ud800", "a\udfffb"], 2
    yield "bytes", [b"", b"abc", bytes(range(256)), b"\x00" * 300], 3
    yield "bytearray", [bytearray(b"xy"), bytearray()], 5
    yield "tuples", [(), (1,), (1, 2), (1, 2, 3), (1, 2, 3, 4), ((1,), (2, (3,))), (0, 0)], 2
    yield "lists", [[], [1], [[], [[]]], list(range(2500))], 2
    yield "dicts", [{}, {"a": 1}, {str(i): i for i in range(2500)}], 2
    yield "keys", {1: "int", "1": "str", (1, 2): "tuple", None: "none", 1.5: "float", (0, (1, "x")): "nested",
                   2**70: "big", -5: "neg"}, 2
    yield "bytes_keys", {b"k": 1, "k": 2}, 3
    yield "sets", [set(), {1, 2, 3}, frozenset({"a", "b"}), frozenset(), set(range(2000)),
                   {frozenset({1, 2}): "fs"}], 4
    shared = [1, 2]
    inner = {"k": shared}
    yield "shared", {"a": shared, "b": shared, "c": [shared, inner, inner], "d": (shared, shared)}, 2
    yield "equal_not_shared", {"a": [1], "b": [1]}, 2
    # Distinct but equal str objects: pickle.dump memoizes by identity, so each is written out.
    yield "repeated_keys", [{"".join(["act", "ion"]): i, "".join(["ad", "dr"]): i * 512} for i in range(50)], 2
    yield "snapshot_like", snapshot_like(), 2
    yield "frames", ["%05d" % i * 5 for i in range(3000)], 4  # more than one 64 KiB FRAME


def snapshot_like():
    f1 = {"filename": "train.py", "line": 10, "name": "forward"}
    f2 = {"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::malloc"}
    tb = [f2, f1]
    return {
        "segments": [{"device": 0, "address": 126968225857536, "total_size": 2097152, "allocated_size": 512,
                      "active_size": 512, "requested_size": 4, "stream": 0, "segment_type": "small",
                      "segment_pool_id": (0, 0), "is_expandable": False, "frames": tb,
                      "blocks": [{"address": 126968225857536, "size": 512, "requested_size": 4,
                                  "state": "active_allocated", "frames": tb}]}],
        "device_traces": [[{"action": "segment_alloc", "addr": 126968225857536, "size": 2097152, "stream": 0,
                            "time_us": 1773270053858957, "frames": tb},
                           {"action": "alloc", "addr": 126968225857536, "size": 4, "stream": 0,
                            "time_us": 1773270053858958, "frames": tb}], []],
        "allocator_settings": {"max_split_size": 2**64 - 1, "garbage_collection_threshold": 0.0,
                               "expandable_segments": False, "PYTORCH_CUDA_ALLOC_CONF": ""},
    }


def refused_cases():
    """Yields (name, object, protocols): pickles that need code, for the refusal tests."""
    yield "instance", Point(1), (2, 4)
    yield "set_p2", {1}, (2,)
    yield "bytes_p2", b"abc", (2,)
    yield "complex", 1 + 2j, (2, 4)


def first_unsafe(data):
    for op, _, pos in pickletools.genops(data):
        if op.name in UNSAFE:
            return op.name, pos
    return None, None


def write(name, data, truth):
    with open(os.path.join(OUT, name + ".pickle"), "wb") as f:
        f.write(data)
    with open(os.path.join(OUT, name + ".json"), "w") as f:
        json.dump(truth, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")


def fuzz_seed(name, data):
    lit = "".join("\\x%02x" % b for b in data)
    with open(os.path.join(FUZZ, name), "w") as f:
        f.write('go test fuzz v1\n[]byte("%s")\n' % lit)


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":
        # str hashing is randomized per process, and with it the order sets are pickled in: fix it so that
        # running this script again writes the same files.
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    os.makedirs(OUT, exist_ok=True)
    os.makedirs(FUZZ, exist_ok=True)
    for name, obj, lowest in cases():
        for proto in range(lowest, 6):
            data = pickle.dumps(obj, protocol=proto)
            op, _ = first_unsafe(data)
            assert op is None, (name, proto, op)
            write("%s.p%d" % (name, proto), data, {"render": render(pickle.loads(data), {})})
    for name, obj, protos in refused_cases():
        for proto in protos:
            data = pickle.dumps(obj, protocol=proto)
            op, pos = first_unsafe(data)
            assert op is not None, (name, proto)
            write("refused_%s.p%d" % (name, proto), data, {"refused": op, "offset": pos})
    cyc = []
    cyc.append(cyc)
    for proto in range(2, 6):
        data = pickle.dumps(cyc, protocol=proto)
        loaded = pickle.loads(data)
        assert loaded[0] is loaded
        write("cycle.p%d" % proto, data, {"cycle": True})

    # Fuzz seeds: one small valid pickle per protocol, then truncated and corrupted copies.
    small = {"segments": [{"address": 2**47, "size": 512, "frames": [{"name": "f", "line": 1}]}],
             "device_traces": [[{"action": "alloc", "addr": 2**64 - 1, "time_us": 1.5}]],
             "pool": (0, 0), "ok": True, "none": None}
    for proto in range(2, 6):
        data = pickle.dumps(small, protocol=proto)
        fuzz_seed("valid_p%d" % proto, data)
        fuzz_seed("truncated_p%d" % proto, data[: len(data) // 2])
        bad = bytearray(data)
        bad[len(bad) // 3] ^= 0xFF
        fuzz_seed("corrupted_p%d" % proto, bytes(bad))
    fuzz_seed("sets_p5", pickle.dumps([{1, 2}, frozenset({3}), bytearray(b"x"), b"y"], protocol=5))
    fuzz_seed("global_p2", pickle.dumps(Point(1), protocol=2))
    fuzz_seed("text_p0_ints", b"(I1\nI01\nL12345678901234567890L\nF1.5\ntp0\ng0\n.")
    fuzz_seed("long4_huge", b"\x80\x04\x8b\xff\xff\xff\x7f.")
    fuzz_seed("unicode8_huge", b"\x80\x04\x8d\x00\x00\x00\x00\x00\x01\x00\x00.")
    fuzz_seed("binput_sparse", b"\x80\x02]r\xff\xff\xff\xffj\xff\xff\xff\xff.")
    fuzz_seed("self_append", b"\x80\x02]q\x00h\x00a.")
    fuzz_seed("deep_tuples", b"\x80\x02)" + b"\x85" * 200 + b".")


if __name__ == "__main__":
    sys.exit(main())
