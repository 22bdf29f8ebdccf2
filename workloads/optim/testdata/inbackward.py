# The optimizer step in backward as torchtune runs it (training/memory.py, register_optim_in_bwd_hooks): one
# torch.optim optimizer per parameter, stepped by the parameter's post-accumulate-grad hook, then
# zero_grad(), which sets the gradient to None. PyTorch 1.13 has no register_post_accumulate_grad_hook; the
# script registers the same function as a post hook on each parameter's AccumulateGrad node, which is what
# that method does since 2.1 (it runs once the gradient is in .grad).
#
# Argument: a JSON list [batch, seq, d, heads, layers, vocab] of nanoGPT (../../nn/testdata/nanogpt.py, float32,
# dropout 0). It prints, for each hook in the order backward runs them, [parameter name, bytes of every
# gradient alive when the hook starts, bytes of every gradient alive after the step and zero_grad].
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "nn", "testdata"))
import nanogpt  # noqa: E402


def grad_bytes(model):
    return sum(p.grad.element_size() * p.grad.nelement() for p in model.parameters() if p.grad is not None)


def main():
    batch, seq, d, heads, layers, vocab = json.loads(sys.argv[1])
    torch.manual_seed(0)
    model = nanogpt.GPT(vocab, seq, layers, heads, d, 0.0)
    names = {p: n for n, p in model.named_parameters()}
    optim_dict = {p: torch.optim.AdamW([p], foreach=True) for p in model.parameters()}
    events, nodes = [], []

    def hook_for(p):
        def optim_step(*_):
            before = grad_bytes(model)
            optim_dict[p].step()
            optim_dict[p].zero_grad(set_to_none=True)
            events.append([names[p], before, grad_bytes(model)])
        return optim_step

    for p in model.parameters():
        acc = p.expand_as(p).grad_fn.next_functions[0][0]  # the parameter's AccumulateGrad node
        acc.register_hook(hook_for(p))
        nodes.append(acc)  # the node must outlive the expand's graph
    idx = torch.randint(0, vocab, (batch, seq))
    model(idx, idx).backward()
    print(json.dumps(events))


main()
