#!/usr/bin/env python3
"""Writes random-weight GGUF files of a Qwen3-style ~0.6B model for peer
benchmarks (scripts/bench_peer.sh): one F16 file written with the `gguf`
package, then Q8_0 / Q4_0 / Q4_K_M / Q6_K / Q5_K_M / IQ4_XS copies made by
llama.cpp's llama-quantize (build it first: scripts/bench_peer.sh --build-only).

Shapes follow Qwen3-0.6B: hidden 1024, 28 layers, MLP 3072, 16 query heads and
8 key/value heads of 128, per-head q/k norms, tied embeddings. The vocabulary
is a SentencePiece-style list of placeholder pieces (byte pieces included) so
that both engines load it; benchmarks feed token ids, so its content does not
matter, only its size (--vocab, default 151936 as Qwen3).

Weights are N(0, 0.02) with unit norms: throughput does not depend on values,
and these files are not meant to produce text.

Usage: make_peer_models.py [--out DIR] [--vocab N] [--layers N]
                           [--quantize PATH] [--types q8_0,q4_0,...]
Needs numpy and gguf (pip install numpy gguf).
"""

import argparse
import os
import subprocess
import sys

import numpy as np
import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TYPES = ["Q8_0", "Q4_0", "Q4_K_M", "Q6_K", "Q5_K_M", "IQ4_XS"]


def write_f16(path, vocab, n_layer, seed):
    hidden, ffn, n_head, n_kv, head_dim = 1024, 3072, 16, 8, 128
    rng = np.random.default_rng(seed)

    def mat(rows, cols):
        # numpy [rows][cols] is GGUF shape {cols, rows}: row j = output j.
        return (rng.standard_normal((rows, cols), dtype=np.float32) * 0.02).astype(np.float16)

    w = gguf.GGUFWriter(path, "qwen3")
    w.add_name("qwen3-style-0.6b-random")
    w.add_block_count(n_layer)
    w.add_context_length(40960)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(ffn)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_kv)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)

    # Placeholder SentencePiece vocabulary: <unk>, <s>, </s>, the 256 byte
    # pieces, then distinct filler pieces.
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    tokens += [f"\u2581t{i}" for i in range(vocab - len(tokens))]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    types += [gguf.TokenType.NORMAL] * (vocab - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores([-float(i) for i in range(vocab)])
    w.add_token_types(types)
    w.add_unk_token_id(0)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_add_bos_token(True)

    w.add_tensor("token_embd.weight", mat(vocab, hidden))
    w.add_tensor("output_norm.weight", np.ones(hidden, dtype=np.float32))
    for l in range(n_layer):
        p = f"blk.{l}."
        w.add_tensor(p + "attn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(p + "attn_q.weight", mat(n_head * head_dim, hidden))
        w.add_tensor(p + "attn_k.weight", mat(n_kv * head_dim, hidden))
        w.add_tensor(p + "attn_v.weight", mat(n_kv * head_dim, hidden))
        w.add_tensor(p + "attn_output.weight", mat(hidden, n_head * head_dim))
        w.add_tensor(p + "attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(p + "attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        w.add_tensor(p + "ffn_norm.weight", np.ones(hidden, dtype=np.float32))
        w.add_tensor(p + "ffn_gate.weight", mat(ffn, hidden))
        w.add_tensor(p + "ffn_up.weight", mat(ffn, hidden))
        w.add_tensor(p + "ffn_down.weight", mat(hidden, ffn))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(ROOT, "build-peer", "models"))
    ap.add_argument("--vocab", type=int, default=151936)
    ap.add_argument("--layers", type=int, default=28)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--quantize", default=os.path.join(ROOT, "build-peer", "llama-build", "bin", "llama-quantize"))
    ap.add_argument("--types", default=",".join(TYPES), help="comma-separated llama-quantize types")
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.vocab < 259 or a.layers < 1:
        sys.exit("error: --vocab must be at least 259 and --layers at least 1")
    os.makedirs(a.out, exist_ok=True)
    f16 = os.path.join(a.out, "qwen3-0.6b-random-F16.gguf")
    if not os.path.exists(f16):
        print(f"writing {f16}", flush=True)
        write_f16(f16 + ".tmp", a.vocab, a.layers, a.seed)
        os.replace(f16 + ".tmp", f16)
    types = [t for t in a.types.split(",") if t]
    if types and not os.access(a.quantize, os.X_OK):
        sys.exit(f"error: {a.quantize} not found; build it with scripts/bench_peer.sh --build-only")
    for t in types:
        dst = os.path.join(a.out, f"qwen3-0.6b-random-{t}.gguf")
        if os.path.exists(dst):
            continue
        print(f"quantising to {t}: {dst}", flush=True)
        r = subprocess.run([a.quantize, f16, dst + ".tmp", t, str(a.threads)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if r.returncode != 0:
            sys.exit(f"error: llama-quantize to {t} failed:\n{r.stderr[-4000:]}")
        os.replace(dst + ".tmp", dst)
    print("done:", ", ".join(sorted(f for f in os.listdir(a.out) if f.endswith(".gguf"))))


if __name__ == "__main__":
    main()
