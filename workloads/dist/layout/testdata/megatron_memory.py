"""Runs Megatron-LM's report_theoretical_memory (theoretical_memory_usage.py beside this file) on the
configurations given as a JSON list in argv[1] and prints, for each, the three figures it returns
(weight and optimizer, activation, total, in Megatron's "MB" of 2^20 bytes) as a JSON list."""

import contextlib
import json
import math
import os
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import theoretical_memory_usage as tmu  # noqa: E402


def padded_vocab_size(vocab_size, make_vocab_size_divisible_by, tensor_model_parallel_size):
    # megatron/training/vocab_utils.py, _calculate_padded_vocab_size_cached, at the same commit.
    multiple = make_vocab_size_divisible_by * tensor_model_parallel_size
    return int(math.ceil(vocab_size / multiple) * multiple)


def args_of(c):
    """Megatron's parsed arguments for one configuration, with the defaults of megatron/training/arguments.py
    for what a dense GPT does not set (no MoE, MLA or multi-token prediction; expert TP defaults to TP)."""
    tp, pp, cp, dp = c["tp"], c["pp"], c["cp"], c["dp"]
    groups = c.get("query_groups") or c["heads"]
    return types.SimpleNamespace(
        num_layers=c["layers"],
        hidden_size=c["hidden"],
        num_attention_heads=c["heads"],
        kv_channels=c.get("kv_channels") or c["hidden"] // c["heads"],
        group_query_attention=groups != c["heads"],
        num_query_groups=groups,
        ffn_hidden_size=c["ffn"],
        padded_vocab_size=padded_vocab_size(c["vocab"], 128, tp),
        seq_length=c["seq"],
        micro_batch_size=c["micro_batch"],
        swiglu=c["swiglu"],
        normalization="RMSNorm" if c["rmsnorm"] else "LayerNorm",
        untie_embeddings_and_output_weights=c["untied"],
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        context_parallel_size=cp,
        virtual_pipeline_model_parallel_size=c.get("virtual"),
        data_parallel_size=dp,
        world_size=dp * tp * pp * cp,
        use_distributed_optimizer=c["distributed_optimizer"],
        # megatron/training/arguments.py turns sequence parallelism off when TP is 1.
        sequence_parallel=c["sequence_parallel"] and tp > 1,
        recompute_granularity=c.get("recompute"),
        num_experts=None,
        moe_layer_freq=1,
        moe_ffn_hidden_size=None,
        moe_shared_expert_intermediate_size=None,
        moe_latent_size=None,
        moe_router_topk=2,
        add_bias_linear=True,
        mtp_num_layers=None,
        multi_latent_attention=False,
        expert_tensor_parallel_size=tp,
        expert_model_parallel_size=1,
        is_hybrid_model=False,
    )


def main():
    results = []
    for c in json.loads(sys.argv[1]):
        with contextlib.redirect_stdout(sys.stderr):
            figures = tmu.report_theoretical_memory(args_of(c), num_microbatches=c["microbatches"])
        results.append(list(figures))
    json.dump(results, sys.stdout)


main()
