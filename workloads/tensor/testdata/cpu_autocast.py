# What PyTorch's CPU autocast does where it follows the same rule as CUDA autocast, for oomdbg's tests:
#   - cached_cast (aten/src/ATen/autocast_mode.cpp) caches the cast of a float32 leaf that requires grad and
#     is not a view, whatever the grad mode, for CPU as for CUDA;
#   - torch/utils/checkpoint.py records the autocast state of the forward (_get_autocast_kwargs) and
#     re-enters it around the recompute, for the CPU (torch.cpu.amp.autocast) as for CUDA.
# It prints one JSON object. "linear" is the dtype F.linear gives under CPU autocast: the tests rely on linear
# being in CPU autocast's lower-precision list, and check it.
import json

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.checkpoint import checkpoint


class Casts(TorchDispatchMode):
    """Logs the shape of every tensor cast (aten::_to_copy) below autocast."""

    def __init__(self):
        super().__init__()
        self.shapes = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            self.shapes.append(list(args[0].shape))
        return func(*args, **(kwargs or {}))


def casts(grad, weight_requires_grad):
    torch.manual_seed(0)
    w = torch.randn(64, 32, requires_grad=weight_requires_grad)
    b = torch.randn(64, requires_grad=weight_requires_grad)
    x = torch.randn(16, 32)
    log = Casts()
    with torch.set_grad_enabled(grad), torch.autocast("cpu", dtype=torch.bfloat16), log:
        F.linear(x, w, b)
        F.linear(x, w, b)
    return log.shapes


def recompute_dtypes(forward_autocast, backward_autocast):
    """The dtype of a checkpointed linear's output each time the function runs: forward, then recompute."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(8, 6)
    x = torch.randn(4, 8, requires_grad=True)
    seen = []

    def f(h):
        y = lin(h)
        seen.append(str(y.dtype).replace("torch.", ""))
        return torch.relu(y)

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=forward_autocast):
        out = checkpoint(f, x, use_reentrant=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=backward_autocast):
        out.float().sum().backward()
    return seen


with torch.autocast("cpu", dtype=torch.bfloat16):
    linear = str(F.linear(torch.randn(2, 3), torch.randn(4, 3)).dtype).replace("torch.", "")

print(json.dumps({
    "version": torch.__version__,
    "linear": linear,
    "casts": {
        "grad": casts(True, True),
        "no_grad": casts(False, True),
        "no_grad, frozen weight": casts(False, False),
    },
    "recompute": {
        "autocast": recompute_dtypes(True, False),
        "off, backward under autocast": recompute_dtypes(False, True),
    },
}))
