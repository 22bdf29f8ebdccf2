"""A tiny Llama with LoRA adapters, fine-tuned on random tokens: the GPU check of oomdbg record.

    python3 examples/record/llama_lora.py [--mode clean|leak|oom] [--trainer] [--steps N]

clean trains for --steps steps; leak keeps every step's logits (and so their graph) in a list, as a loss
history kept without .item() does; oom makes step 2's batch large enough to run out of memory on any GPU.
--trainer runs the same model through Hugging Face's Trainer with gradient accumulation. It needs
transformers and peft (pip install transformers peft); it prints the loss of every step.
"""

import argparse
import time

import torch


def build(layers, d, device):
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=4096, hidden_size=d, intermediate_size=4 * d, num_hidden_layers=layers,
                      num_attention_heads=8, num_key_value_heads=8, max_position_embeddings=2048)
    cfg._attn_implementation = "eager"  # the scores are materialised: their size is what runs out
    model = LlamaForCausalLM(cfg).to(device)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(model, lora)


def batch(size, seq, step, device):
    g = torch.Generator().manual_seed(step)
    ids = torch.randint(0, 4096, (size, seq), generator=g)
    return {"input_ids": ids.to(device), "labels": ids.to(device)}


def loop(args):
    dev = torch.device("cuda")
    torch.manual_seed(0)
    model = build(args.layers, args.d, dev)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    kept = []
    times = []
    for step in range(args.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        size = args.batch * (4096 if args.mode == "oom" and step == 2 else 1)
        out = model(**batch(size, args.seq, step, dev))
        if args.mode == "leak":
            kept.append(out.logits)
        out.loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        print("step %d loss %.4f" % (step, out.loss.item()), flush=True)
    if args.times:
        ts = sorted(times[3:])
        print("median step %.3f ms" % (1000 * ts[len(ts) // 2]), flush=True)


def trainer(args):
    from transformers import Trainer, TrainingArguments

    class Tokens(torch.utils.data.Dataset):
        def __len__(self):
            return 64

        def __getitem__(self, i):
            g = torch.Generator().manual_seed(i)
            ids = torch.randint(0, 4096, (args.seq,), generator=g)
            return {"input_ids": ids, "labels": ids}

    torch.manual_seed(0)
    model = build(args.layers, args.d, torch.device("cuda"))
    targs = TrainingArguments(output_dir="/tmp/oomdbg-trainer", per_device_train_batch_size=args.batch,
                              gradient_accumulation_steps=2, max_steps=args.steps, logging_steps=1, report_to=[],
                              save_strategy="no", dataloader_num_workers=0)
    Trainer(model=model, args=targs, train_dataset=Tokens()).train()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["clean", "leak", "oom"], default="clean")
    ap.add_argument("--trainer", action="store_true")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--times", action="store_true", help="print the median step time")
    args = ap.parse_args()
    trainer(args) if args.trainer else loop(args)


if __name__ == "__main__":
    main()
