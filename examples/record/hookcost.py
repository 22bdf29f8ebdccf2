"""What oomdbg record's hooks cost per training step, measured inside one process so that the machine's other
work falls on both sides alike: run under oomdbg record, it trains loop.py's model and alternates, step by
step, between the recorder's hooks on (as they run in any recorded job) and removed (the global module hooks
unregistered, the other wrappers passing straight through). The allocator's history stays on throughout, so
the difference is the hooks alone. It prints the median CPU time of each.

    oomdbg record --force -o /tmp/d --stacks python -- python3 examples/record/hookcost.py [STEPS] [--device cpu]
"""

import json
import os
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loop import Model  # noqa: E402

import oomdbg_record  # present under oomdbg record  # noqa: E402


def main():
    steps = int(sys.argv[1]) if len(sys.argv) > 1 and sys.argv[1].isdigit() else 200
    dev = torch.device("cpu" if "--device" in sys.argv and sys.argv[sys.argv.index("--device") + 1] == "cpu" else "cuda")
    torch.manual_seed(0)
    model = Model(64, 256, 3, 10).to(dev)
    crit = nn.CrossEntropyLoss()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    from torch.nn.modules import module as modmod

    S = oomdbg_record._S
    on, off = [], []
    for step in range(steps):
        active = step % 2 == 0
        if active and not S.handles:
            oomdbg_record._install_module_hooks(modmod)
        elif not active:
            for h in S.handles:
                h.remove()
            S.handles.clear()
        S.started = active or not S.pid  # pid: set once recording started
        if not active:
            S.started = False
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.process_time()
        x = torch.randn(16, 64).to(dev)
        y = torch.randint(0, 10, (16,)).to(dev)
        loss = crit(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if dev.type == "cuda":
            torch.cuda.synchronize()
        (on if active else off).append(time.process_time() - t0)
        S.started = True
    a, b = statistics.median(on[5:]), statistics.median(off[5:])
    print(json.dumps({"hooks_on_ms": 1000 * a, "hooks_off_ms": 1000 * b, "cost_ms": 1000 * (a - b),
                      "cost_percent": 100 * (a - b) / b, "steps": steps}))


if __name__ == "__main__":
    main()
