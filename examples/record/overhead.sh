#!/usr/bin/env bash
# What oomdbg record's hooks cost per training step, on the CPU: examples/record/loop.py under the fake CUDA
# history of oomdbg's tests (recorder/testdata/fakecuda), with the history turned on by hand as
# docs/pytorch.md's recipe does (the baseline), and under oomdbg record, which turns on the same history and
# adds its hooks. The difference is the hooks. Stack capture here is the fake's (Python's traceback), not
# PyTorch's unwinder: examples/record/gpu-check.sh measures the real one on a GPU.
#
#   bash examples/record/overhead.sh [STEPS] [PYTHON]
set -euo pipefail
cd "$(dirname "$0")/../.."
steps=${1:-60}
py=${2:-/usr/bin/python3}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/oomdbg" ./cmd/oomdbg
export PYTHONPATH=$PWD/recorder/testdata/fakecuda FAKECUDA_TORCH=2.5 OMP_NUM_THREADS=1
rounds=${ROUNDS:-3}
loop=(examples/record/loop.py --device cpu --steps "$steps")
# The median step of a run (its first 5 steps left out), in milliseconds of CPU time.
median() { "$py" -c 'import json,sys,statistics; t=json.load(open(sys.argv[1]))[5:]; print(1000*statistics.median(t))' "$1"; }
declare -A ms
run() { # key, then the command
	local key=$1
	shift
	"$@" --timings "$out/t.json" >/dev/null 2>"$out/err" || { cat "$out/err"; exit 1; }
	ms[$key]+=" $(median "$out/t.json")"
}
# Rounds interleave the variants, so that what else the machine does falls on all of them alike.
for ((r = 0; r < rounds; r++)); do
	for stacks in none python all; do
		run "hand $stacks" "$py" "${loop[@]}" --history "$stacks"
		run "record-noscopes $stacks" "$out/oomdbg" record --force -o "$out/d" --stacks "$stacks" --scopes=false -- "$py" "${loop[@]}"
		run "record $stacks" "$out/oomdbg" record --force -o "$out/d" --stacks "$stacks" -- "$py" "${loop[@]}"
	done
done
mid() { "$py" -c 'import sys,statistics; print("%.3f" % statistics.median(float(x) for x in sys.argv[1:]))' $1; }
echo "CPU ms per step, median of $rounds runs of $steps steps, $("$py" -c 'import torch; print("torch", torch.__version__)'), loop.py's default shape"
printf '%-8s %12s %16s %16s %22s\n' stacks "by hand" "record" "hooks cost" "hooks, --scopes=false"
for stacks in none python all; do
	h=$(mid "${ms[hand $stacks]}") rec=$(mid "${ms[record $stacks]}") ns=$(mid "${ms[record-noscopes $stacks]}")
	"$py" -c 'import sys; h,r,n=map(float,sys.argv[2:]); print("%-8s %12.3f %16.3f %9.3f (%+.0f%%) %15.3f (%+.0f%%)" % (sys.argv[1], h, r, r-h, 100*(r-h)/h, n-h, 100*(n-h)/h))' "$stacks" "$h" "$rec" "$ns"
done
