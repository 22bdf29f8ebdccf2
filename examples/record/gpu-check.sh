#!/usr/bin/env bash
# oomdbg record on a real GPU: the whole path the tests run against a fake CUDA on the CPU. Not run by CI.
#
#   OOMDBG=path/to/oomdbg bash examples/record/gpu-check.sh [OUTDIR]
#
# It needs python3 with a CUDA torch, transformers and peft, and an oomdbg binary for this machine (built here
# with go when there is one, else OOMDBG). Each check prints one line, PASS or FAIL, then what it saw.
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${1:-$(mktemp -d)}
mkdir -p "$out"
oomdbg=${OOMDBG:-}
if [[ -z $oomdbg ]]; then
	go build -o "$out/oomdbg" ./cmd/oomdbg || exit 2
	oomdbg=$out/oomdbg
fi
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1
"$py" -c 'import torch; print("torch", torch.__version__, torch.cuda.get_device_name(0))' || exit 2
fails=0
check() { # name, wanted exit status, then the command
	local name=$1 want=$2
	shift 2
	"$@" >"$out/$name.log" 2>&1
	local got=$?
	if [[ $got == "$want" ]]; then echo "PASS $name (exit $got)"; else echo "FAIL $name: exit $got, want $want"; fails=$((fails + 1)); fi
	grep -E '^oomdbg record: ' "$out/$name.log" | tail -2
}
rec() { local dir=$1; shift; "$oomdbg" record --force -o "$out/$dir" "$@"; }
L=examples/record/llama_lora.py

check loop-clean 0 rec loop -- "$py" examples/record/loop.py --steps 6 --device cuda
check loop-report 0 "$oomdbg" report "$out/loop/rank0.end.pickle"
grep -E '^iterations|by category' "$out/loop-report.log" | head -2
check lora-clean 0 rec clean -- "$py" $L --steps 8
check lora-clean-check 0 "$oomdbg" check "$out/clean/rank0.end.pickle"
check lora-leak 0 rec leak -- "$py" $L --mode leak --steps 12
check lora-leak-check 1 "$oomdbg" check "$out/leak/rank0.end.pickle"
head -1 "$out/lora-leak-check.log"
check lora-oom 1 rec oom -- "$py" $L --mode oom
check lora-oom-report 0 "$oomdbg" report "$out/oom/rank0.oom.pickle"
grep -E '^OOM|^iterations' "$out/lora-oom-report.log" | head -3
check torchrun-1 0 rec torchrun -- torchrun --standalone --nproc-per-node 1 $L --steps 6
ls "$out/torchrun"
check trainer 0 rec trainer -- "$py" $L --trainer --steps 6
check trainer-report 0 "$oomdbg" report "$out/trainer/rank0.end.pickle"
grep -E '^iterations' "$out/trainer-report.log"
check every 0 rec every --every 2 --keep 2 -- "$py" $L --steps 8
ls "$out/every"

# What the hooks cost per step, and what recording costs against not recording at all.
for stacks in none python all; do
	for scopes in true false; do
		"$oomdbg" record --force -o "$out/hc" --stacks $stacks --scopes=$scopes -- "$py" examples/record/hookcost.py 300 2>/dev/null |
			sed "s/^/hooks, stacks=$stacks scopes=$scopes: /"
	done
done
echo "without oomdbg:  $("$py" $L --steps 30 --times | tail -1)"
for stacks in none python all; do
	echo "record --stacks $stacks: $("$oomdbg" record --force -o "$out/t" --stacks $stacks -- "$py" $L --steps 30 --times 2>/dev/null | tail -1)"
done
echo "$fails check(s) failed; logs and snapshots in $out"
[[ $fails == 0 ]]
