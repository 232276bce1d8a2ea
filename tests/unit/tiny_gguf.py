"""Writes a tiny synthetic Llama GGUF (random weights, byte-level BPE vocabulary) for conversion tests."""

from __future__ import annotations

from pathlib import Path

import numpy as np


def write_tiny_llama_gguf(path: Path, seed: int = 0) -> Path:
    import gguf

    rng = np.random.default_rng(seed)
    hidden, ffn, layers, heads, kv_heads = 16, 32, 2, 2, 1
    byte_tokens = [bytes([b]).decode("latin-1") for b in range(33, 127)]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", *byte_tokens, "Ġ", "he", "ll", "llo"]
    merges = ["h e", "l l", "ll o"]
    vocab = len(tokens)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny-llama")
    w.add_context_length(64)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_block_count(layers)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_dimension_count(hidden // heads)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (vocab - 3))
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_pad_token_id(2)
    w.add_unk_token_id(0)

    def t(name: str, *shape: int) -> None:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32) * 0.02)

    t("token_embd.weight", vocab, hidden)
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    head_dim = hidden // heads
    for i in range(layers):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        t(f"blk.{i}.attn_q.weight", heads * head_dim, hidden)
        t(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden)
        t(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden)
        t(f"blk.{i}.attn_output.weight", hidden, heads * head_dim)
        t(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        t(f"blk.{i}.ffn_up.weight", ffn, hidden)
        t(f"blk.{i}.ffn_down.weight", hidden, ffn)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
