#!/usr/bin/env python3
"""Times CPython's C pickle.load on the real snapshots, for comparison with BenchmarkDecodeF* (internal/pickle)
and BenchmarkImportF* (snapshot/torch).

Run from anywhere:  python3 internal/pickle/testdata/cpython_bench.py [fixture dir]

For each fixture it reports the best of several rounds of pickle.load(io.BytesIO(data)), with the cyclic
garbage collector on (as a program loading a snapshot runs) and off (CPython's lower bound).
"""
import gc
import io
import os
import pickle
import sys
import time

# The repository is checked out with shared/ beside it.
DIR = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "../../../../shared/fixtures/pytorch-snapshots")
FILES = [
    ("F1", "f1_2023_legacy_history_format.pickle"),
    ("F2", "f2_2024_segments_list_only.pkl"),
    ("F3", "f3_2023_frames_no_time_us.pickle"),
    ("F4", "f4_2024_time_us_no_settings_2dev.pickle"),
    ("F7", "f7_2025_expandable_segments_2dev.pickle"),
]


def best(data, gc_on, rounds=7, budget=0.5):
    n = max(5, int(budget / max(len(data) / 150e6, 1e-6)))  # about budget seconds per round
    (gc.enable if gc_on else gc.disable)()
    try:
        t_best = float("inf")
        for _ in range(rounds):
            t = time.perf_counter()
            for _ in range(n):
                pickle.load(io.BytesIO(data))
            t_best = min(t_best, (time.perf_counter() - t) / n)
        return t_best
    finally:
        gc.enable()


def main():
    print("Python %s" % sys.version.split()[0])
    for name, file in FILES:
        with open(os.path.join(DIR, file), "rb") as f:
            data = f.read()
        on, off = best(data, True), best(data, False)
        print("%s %8d B  gc on: %10.1f us/op %7.1f MB/s   gc off: %10.1f us/op %7.1f MB/s"
              % (name, len(data), on * 1e6, len(data) / on / 1e6, off * 1e6, len(data) / off / 1e6))


if __name__ == "__main__":
    main()
