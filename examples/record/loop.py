"""A small training loop to run under `oomdbg record`: clean, leaking, running out of memory, raising, or
waiting to be stopped by a signal.

    oomdbg record -o dumps -- python3 examples/record/loop.py --steps 8
    oomdbg record -o dumps -- python3 examples/record/loop.py --mode leak --steps 20
    oomdbg record -o dumps -- python3 examples/record/loop.py --mode oom --oom-at 3

It knows what each of its tensors is and what it is doing. Under the fake CUDA of oomdbg's tests
(recorder/testdata/fakecuda) it tells the fake, which writes that truth beside the recording for the
tests to compare with; elsewhere it runs as any script does. It prints the loss of every step, which
recording must not change.
"""

import argparse
import json
import os
import signal
import sys
import time

import torch
import torch.nn as nn

try:  # present only under oomdbg's tests
    import fakecuda
except ImportError:
    fakecuda = None


def truth_phase(phase, iteration=None):
    if fakecuda is not None:
        fakecuda.truth_phase(phase, iteration)


def truth_tag(tensors, category):
    if fakecuda is not None:
        for t in tensors:
            if t is not None:
                fakecuda.truth_tag(t, category)


class Block(nn.Module):
    def __init__(self, d, hidden):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, hidden)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden, d)

    def forward(self, x):
        return x + self.fc2(self.act(self.fc1(self.norm(x))))


class Model(nn.Module):
    def __init__(self, d, hidden, layers, classes):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(d, hidden) for _ in range(layers)])
        self.head = nn.Linear(d, classes)

    def forward(self, x):
        return self.head(self.blocks(x))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["clean", "leak", "oom", "raise", "wait"], default="clean")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--d", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--accum", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--zero-grad", choices=["top", "end"], default="end", help="where the loop calls zero_grad")
    ap.add_argument("--set-to-none", choices=["true", "false"], default="true")
    ap.add_argument("--optimizer", choices=["adamw", "sgd"], default="adamw")
    ap.add_argument("--clip", action="store_true", help="clip the gradients' norm before each step")
    ap.add_argument("--oom-at", type=int, default=2, help="--mode oom: the step whose batch is too large")
    ap.add_argument("--oom-scale", type=int, default=4096, help="--mode oom: how much larger that batch is")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--timings", help="write each step's CPU seconds to this JSON file")
    ap.add_argument("--hf-callbacks", action="store_true",
                    help="call Hugging Face Trainer's callbacks at each step's start, as Trainer does, and pass the "
                         "batch to the model as keyword arguments, as Trainer's model(**inputs) does")
    ap.add_argument("--history", choices=["off", "none", "python", "all"], default="off",
                    help="turn on torch.cuda.memory's history itself, as docs/pytorch.md's recipe by hand does "
                         "(none: without stacks): the baseline oomdbg record's hooks are measured against")
    args = ap.parse_args()
    if args.history != "off":
        torch.cuda.memory._record_memory_history(
            "all", context=None if args.history == "none" else "all",
            stacks="python" if args.history == "none" else args.history, max_entries=1000000)

    torch.manual_seed(0)
    dev = torch.device(args.device)
    truth_phase("setup", -1)
    model = Model(args.d, args.hidden, args.layers, 10).to(dev)
    truth_tag(model.parameters(), "parameter")
    criterion = nn.CrossEntropyLoss()
    if args.optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    set_to_none = args.set_to_none == "true"
    kept = []  # --mode leak keeps every step's output, and with it the step's graph
    timings = []
    callbacks = []
    if args.hf_callbacks:
        from transformers.trainer_callback import DEFAULT_CALLBACKS

        callbacks = [cb() for cb in DEFAULT_CALLBACKS]
    for step in range(args.steps):
        t0 = time.process_time()
        for cb in callbacks:
            cb.on_step_begin(None, None, None)  # CPU time: what the steps cost, whatever else the machine runs
        if args.mode == "raise" and step == 2:
            raise RuntimeError("the loop raised at step 2, on purpose")
        if args.mode == "wait" and step == 2:
            print("waiting for a signal (pid %d)" % os.getpid(), flush=True)
            while True:
                time.sleep(0.05)
        if args.zero_grad == "top":
            # Between a step and the next batch, zero_grad counts in the step's iteration, wherever the loop
            # calls it: nothing in a trace tells a loop that calls it last from one that calls it first.
            truth_phase("zero_grad", step - 1)
            opt.zero_grad(set_to_none=set_to_none)
        total = 0.0
        for micro in range(args.accum):
            truth_phase("data", step)
            batch = args.batch
            if args.mode == "oom" and step == args.oom_at:
                batch *= args.oom_scale
            g = torch.Generator().manual_seed(1000 * step + micro)
            x = torch.randn(batch, args.d, generator=g).to(dev)
            y = torch.randint(0, 10, (batch,), generator=g).to(dev)
            truth_tag([x, y], "input")
            truth_phase("forward", step)
            out = model(x=x) if args.hf_callbacks else model(x)
            loss = criterion(out, y) / args.accum
            if args.mode == "leak":
                kept.append(out)
            truth_phase("backward", step)
            loss.backward()
            truth_tag([p.grad for p in model.parameters()], "gradient")
            total += loss.item()
        truth_phase("optimizer", step)
        if args.clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        truth_tag([v for st in opt.state.values() for v in st.values() if isinstance(v, torch.Tensor)],
                  "optimizer_state")
        if args.zero_grad == "end":
            truth_phase("zero_grad", step)
            opt.zero_grad(set_to_none=set_to_none)
        timings.append(time.process_time() - t0)
        print("step %d loss %.6f" % (step, total), flush=True)
    if args.timings:
        with open(args.timings, "w") as f:
            json.dump(timings, f)


if __name__ == "__main__":
    main()
