#!/usr/bin/env python3
"""Writes the model manifests of models/ (NCCL M2N model-config form) from the models' public
configs: every shape below is computed from hidden size, intermediate size, heads, KV heads,
head dim, vocabulary and layer count as the Hugging Face implementations build them.

    python3 models/make_manifests.py [OUT_DIR]       # default: the folder of this script
    python3 models/make_manifests.py --summary       # tensor counts and bytes, no files

Output is compact (one tensor per line) and deterministic, so that a re-run shows no diff.
"""
import json
import os
import sys

BYTES = {"F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1}


def llama_attention(t, p, hidden, heads, kv_heads, head_dim, dtype, bias=False, out_bias=False,
                    qk_norm=False):
    """Llama/Qwen attention: q/k/v/o projections [out, in] (+ biases, + per-head q/k norms)."""
    for proj, out in (("q_proj", heads * head_dim), ("k_proj", kv_heads * head_dim),
                      ("v_proj", kv_heads * head_dim)):
        t[f"{p}.self_attn.{proj}.weight"] = ([out, hidden], dtype)
        if bias:
            t[f"{p}.self_attn.{proj}.bias"] = ([out], dtype)
    t[f"{p}.self_attn.o_proj.weight"] = ([hidden, heads * head_dim], dtype)
    if out_bias:
        t[f"{p}.self_attn.o_proj.bias"] = ([hidden], dtype)
    if qk_norm:
        t[f"{p}.self_attn.q_norm.weight"] = ([head_dim], dtype)
        t[f"{p}.self_attn.k_norm.weight"] = ([head_dim], dtype)


def swiglu(t, p, hidden, inter, dtype):
    t[f"{p}.gate_proj.weight"] = ([inter, hidden], dtype)
    t[f"{p}.up_proj.weight"] = ([inter, hidden], dtype)
    t[f"{p}.down_proj.weight"] = ([hidden, inter], dtype)


def gpt2(layers, h, heads, f, v=50257, n=1024, dt="F32"):
    """The GPT-2 layout: LayerNorm with biases, biases on every linear, GELU MLP, tied lm_head
    (not in the checkpoint). Written with Llama-style names and q/k/v split (HF GPT-2's Conv1D
    c_attn is fused and stored [in, out], transposed against every other model)."""
    t = {"model.embed_tokens.weight": ([v, h], dt), "model.embed_positions.weight": ([n, h], dt)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = ([h], dt)
        t[f"{p}.input_layernorm.bias"] = ([h], dt)
        llama_attention(t, p, h, heads, heads, h // heads, dt, bias=True, out_bias=True)
        t[f"{p}.post_attention_layernorm.weight"] = ([h], dt)
        t[f"{p}.post_attention_layernorm.bias"] = ([h], dt)
        t[f"{p}.mlp.up_proj.weight"] = ([f, h], dt)
        t[f"{p}.mlp.up_proj.bias"] = ([f], dt)
        t[f"{p}.mlp.down_proj.weight"] = ([h, f], dt)
        t[f"{p}.mlp.down_proj.bias"] = ([h], dt)
    t["model.norm.weight"] = ([h], dt)
    t["model.norm.bias"] = ([h], dt)
    return t


def gpt2_small():
    """GPT-2 124M (openai-community/gpt2): n_layer 12, n_embd 768, n_head 12, n_inner 3072,
    vocab 50257, n_positions 1024; F32 (a trainer's master copy)."""
    return gpt2(12, 768, 12, 3072)


def gpt2_medium():
    """GPT-2 355M (openai-community/gpt2-medium): n_layer 24, n_embd 1024, n_head 16, n_inner
    4096, vocab 50257, n_positions 1024; F32 (a trainer's master copy). 388 tensors: the
    emulated-cluster benchmark's model (bench/run-sync.sh)."""
    return gpt2(24, 1024, 16, 4096)


def gpt2_deep_narrow():
    """Synthetic (no published model): the GPT-2 layout at 64 layers of width 256 (4 heads, MLP
    1024), 1,028 tensors of which 768 are norms and biases of 256 to 1,024 elements; F32. The
    shared-memory benchmark's many-small-tensors case."""
    return gpt2(64, 256, 4, 1024)


def qwen25_05b():
    """Qwen2.5-0.5B (Qwen/Qwen2.5-0.5B config.json): 24 layers, hidden 896, 14 heads, 2 KV heads
    (head_dim 64), intermediate 4864, vocab 151936, q/k/v biases, RMSNorm, tied embeddings (no
    lm_head in the checkpoint), BF16."""
    h, f, v, layers, dt = 896, 4864, 151936, 24, "BF16"
    t = {"model.embed_tokens.weight": ([v, h], dt)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = ([h], dt)
        llama_attention(t, p, h, 14, 2, 64, dt, bias=True)
        t[f"{p}.post_attention_layernorm.weight"] = ([h], dt)
        swiglu(t, f"{p}.mlp", h, f, dt)
    t["model.norm.weight"] = ([h], dt)
    return t


def qwen3_moe(layers, hidden, heads, kv_heads, head_dim, experts, moe_inter, vocab, dt="BF16"):
    """Qwen3-MoE (Qwen3MoeForCausalLM): attention with q_norm/k_norm, every layer sparse, router
    mlp.gate [experts, hidden], experts.E.{gate,up,down}_proj, no shared experts, untied head."""
    t = {"model.embed_tokens.weight": ([vocab, hidden], dt)}
    for i in range(layers):
        p = f"model.layers.{i}"
        t[f"{p}.input_layernorm.weight"] = ([hidden], dt)
        llama_attention(t, p, hidden, heads, kv_heads, head_dim, dt, qk_norm=True)
        t[f"{p}.post_attention_layernorm.weight"] = ([hidden], dt)
        t[f"{p}.mlp.gate.weight"] = ([experts, hidden], dt)
        for e in range(experts):
            swiglu(t, f"{p}.mlp.experts.{e}", hidden, moe_inter, dt)
    t["model.norm.weight"] = ([hidden], dt)
    t["lm_head.weight"] = ([vocab, hidden], dt)
    return t


def moe_tiny():
    """A scaled-down Qwen3-MoE for runs on one machine: 8 layers, hidden 1024, 16 heads x 64,
    4 KV heads, 8 experts of intermediate 768, vocab 32000."""
    return qwen3_moe(8, 1024, 16, 4, 64, 8, 768, 32000)


def qwen3_235b():
    """Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B config.json): 94 layers, hidden 4096, 64 heads,
    4 KV heads, head_dim 128, 128 experts (8 active) of moe_intermediate 1536, vocab 151936,
    tie_word_embeddings false."""
    return qwen3_moe(94, 4096, 64, 4, 128, 128, 1536, 151936)


def deepseek_v3():
    """DeepSeek-V3 (deepseek-ai/DeepSeek-V3 config.json): 61 layers, hidden 7168, first 3 dense
    (intermediate 18432), MLA (q_lora_rank 1536, kv_lora_rank 512, qk_nope 128, qk_rope 64,
    v_head 128, 128 heads), 256 routed experts of moe_intermediate 2048 plus 1 shared expert,
    router with e_score_correction_bias (F32 in the checkpoint), vocab 129280, untied head. The
    multi-token-prediction layer 61 is left out (inference does not load it). Every weight is
    BF16, as the trainer holds it; the released checkpoint stores linear weights as F8_E4M3 with
    F32 weight_scale_inv blocks, which a BF16 trainer does not have."""
    h, layers, dense, heads, dt = 7168, 61, 3, 128, "BF16"
    q_lora, kv_lora, nope, rope, vdim = 1536, 512, 128, 64, 128
    experts, moe_inter, inter, vocab = 256, 2048, 18432, 129280
    t = {"model.embed_tokens.weight": ([vocab, h], dt)}
    for i in range(layers):
        p = f"model.layers.{i}"
        a = f"{p}.self_attn"
        t[f"{p}.input_layernorm.weight"] = ([h], dt)
        t[f"{a}.q_a_proj.weight"] = ([q_lora, h], dt)
        t[f"{a}.q_a_layernorm.weight"] = ([q_lora], dt)
        t[f"{a}.q_b_proj.weight"] = ([heads * (nope + rope), q_lora], dt)
        t[f"{a}.kv_a_proj_with_mqa.weight"] = ([kv_lora + rope, h], dt)
        t[f"{a}.kv_a_layernorm.weight"] = ([kv_lora], dt)
        t[f"{a}.kv_b_proj.weight"] = ([heads * (nope + vdim), kv_lora], dt)
        t[f"{a}.o_proj.weight"] = ([h, heads * vdim], dt)
        t[f"{p}.post_attention_layernorm.weight"] = ([h], dt)
        if i < dense:
            swiglu(t, f"{p}.mlp", h, inter, dt)
            continue
        t[f"{p}.mlp.gate.weight"] = ([experts, h], dt)
        t[f"{p}.mlp.gate.e_score_correction_bias"] = ([experts], "F32")
        for e in range(experts):
            swiglu(t, f"{p}.mlp.experts.{e}", h, moe_inter, dt)
        swiglu(t, f"{p}.mlp.shared_experts", h, moe_inter, dt)
    t["model.norm.weight"] = ([h], dt)
    t["lm_head.weight"] = ([vocab, h], dt)
    return t


MODELS = {
    "gpt2-small": gpt2_small,
    "gpt2-medium": gpt2_medium,
    "gpt2-deep-narrow": gpt2_deep_narrow,
    "qwen2.5-0.5b": qwen25_05b,
    "moe-tiny": moe_tiny,
    "qwen3-235b-a22b": qwen3_235b,
    "deepseek-v3": deepseek_v3,
}


def size(tensors):
    total = 0
    for shape, dtype in tensors.values():
        n = 1
        for e in shape:
            n *= e
        total += n * BYTES[dtype]
    return total


def write(tensors, path):
    lines = [json.dumps(name) + ': {"shape": ' + json.dumps(shape) + ', "dtype": "' + dt + '"}'
             for name, (shape, dt) in tensors.items()]
    with open(path, "w") as f:
        f.write("{\n" + ",\n".join(lines) + "\n}\n")


def main(argv):
    summary = "--summary" in argv
    args = [a for a in argv if a != "--summary"]
    out = args[0] if args else os.path.dirname(os.path.abspath(__file__))
    for name, make in MODELS.items():
        t = make()
        if not summary:
            path = os.path.join(out, name + ".json")
            write(t, path)
            print(f"{path}: {len(t)} tensors, {size(t)} bytes, {os.path.getsize(path)} file bytes")
        else:
            print(f"{name}: {len(t)} tensors, {size(t)} bytes")


if __name__ == "__main__":
    main(sys.argv[1:])
