#!/usr/bin/env python3
"""Trains the DSpark-style block drafter shipped for SmolLM2-135M-Instruct.

One command, end to end (needs build/megakern, models/smollm2-135m.gguf and
`pip install -r requirements-train.txt`):

  python3 scripts/train_drafter.py

Stages (each prints its wall time):
  1. data:   `megakern gen-drafter-data` answers the training prompts
             (scripts/drafter/train_prompts.jsonl) greedily with the target
             itself and dumps the target's taps at every position, exactly as
             speculative decoding feeds them to the drafter (--check-taps
             compares them with one-row steps).
  2. train:  PyTorch on the CPU. The drafter is the engine's DSpark block
             drafter (src/spec/block_drafter.h): fc over the concatenated
             taps, hidden_norm, `--layers` Qwen3-style layers with per-head
             q/k norms, a block of the anchor plus block-1 mask rows that
             attends causally to itself and to the context keys/values made
             from the taps, every row predicting the position after its own,
             and a rank-r Markov term of the previous token. The target's
             token embedding and LM head are frozen and shared (not stored);
             the head is restricted to a draft vocabulary of the tokens the
             target emits most. Loss: cross-entropy per block row, weighted
             exp(-k / gamma) by the row k.
  3. export: assets/drafters/smollm2-135m-dspark/{config.json,
             model.safetensors (BF16), model.safetensors.sha256}, and the
             loss curve as loss.svg beside this script.
"""
import argparse
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg):
    print(msg, flush=True)


class Stage:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.t0 = time.time()
        log(f"== stage {self.name}")
        return self

    def __exit__(self, *exc):
        log(f"== stage {self.name}: {time.time() - self.t0:.1f} s wall")


# ------------------------------------------------------------------ data


def read_taps(path):
    """Records of gen-drafter-data: (tokens int32 [n], n_prompt, taps f32 [n][W])."""
    with open(path, "rb") as f:
        buf = f.read()
    if buf[:8] != b"MKTAPS01":
        raise SystemExit(f"{path}: not a gen-drafter-data file")
    off = 8
    W, n_taps = np.frombuffer(buf, np.int32, 2, off)
    off += 8
    layers = np.frombuffer(buf, np.int32, int(n_taps), off).tolist()
    off += 4 * int(n_taps)
    (n_vocab,) = np.frombuffer(buf, np.int32, 1, off)
    off += 4
    seqs = []
    while off + 8 <= len(buf):
        n, n_prompt = np.frombuffer(buf, np.int32, 2, off)
        if off + 8 + 4 * int(n) * (1 + int(W)) > len(buf):
            log(f"{path}: the last record is cut short (the run was stopped); using {len(seqs)} sequences")
            break
        off += 8
        toks = np.frombuffer(buf, np.int32, int(n), off)
        off += 4 * int(n)
        taps = np.frombuffer(buf, np.float32, int(n) * int(W), off).reshape(int(n), int(W))
        off += 4 * int(n) * int(W)
        seqs.append((toks, int(n_prompt), taps))
    return int(W), layers, int(n_vocab), seqs


def target_matrices(gguf_path):
    """The target's token embedding and LM head as f32 [V][H] (tied if no output.weight)."""
    from gguf import GGUFReader
    from gguf.quants import dequantize

    r = GGUFReader(gguf_path)
    by_name = {t.name: t for t in r.tensors}

    def deq(t):
        a = dequantize(t.data, t.tensor_type)
        return np.ascontiguousarray(a.reshape(-1, a.shape[-1]).astype(np.float32))

    embed = deq(by_name["token_embd.weight"])
    head = deq(by_name["output.weight"]) if "output.weight" in by_name else embed
    n_layer = sum(1 for n in by_name if n.endswith(".attn_q.weight"))
    return embed, head, n_layer


# ------------------------------------------------------------------ model


def build_model(torch, cfg, head_rows, tap_scale):
    nn = torch.nn
    F = torch.nn.functional
    D, hd, nh, nkv = cfg["hidden"], cfg["head_dim"], cfg["n_head"], cfg["n_head_kv"]
    eps, base = cfg["eps"], cfg["rope_base"]

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w

    inv = base ** (-torch.arange(0, hd // 2, dtype=torch.float64) * 2 / hd)

    def rope(x, pos):  # x [n, heads, hd], pos [n]; pairs (i, i + hd/2)
        ang = pos.double()[:, None] * inv[None, :]
        c, s = torch.cos(ang).float()[:, None, :], torch.sin(ang).float()[:, None, :]
        a, b = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([a * c - b * s, a * s + b * c], -1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_layernorm = nn.Parameter(torch.ones(D))
            self.q_proj = nn.Linear(D, nh * hd, bias=False)
            self.k_proj = nn.Linear(D, nkv * hd, bias=False)
            self.v_proj = nn.Linear(D, nkv * hd, bias=False)
            self.o_proj = nn.Linear(nh * hd, D, bias=False)
            self.q_norm = nn.Parameter(torch.ones(hd))
            self.k_norm = nn.Parameter(torch.ones(hd))
            self.post_attention_layernorm = nn.Parameter(torch.ones(D))
            self.gate_proj = nn.Linear(D, cfg["ffn"], bias=False)
            self.up_proj = nn.Linear(D, cfg["ffn"], bias=False)
            self.down_proj = nn.Linear(cfg["ffn"], D, bias=False)

        def ctx_kv(self, ctx, pos):
            k = rope(rms(self.k_proj(ctx).view(-1, nkv, hd), self.k_norm), pos)
            return k, self.v_proj(ctx).view(-1, nkv, hd)

        def forward(self, h, pos, ck, cv, mask):
            x = rms(h, self.input_layernorm)
            q = rope(rms(self.q_proj(x).view(-1, nh, hd), self.q_norm), pos)
            kb = rope(rms(self.k_proj(x).view(-1, nkv, hd), self.k_norm), pos)
            vb = self.v_proj(x).view(-1, nkv, hd)
            k = torch.cat([ck, kb], 0).repeat_interleave(nh // nkv, 1)
            v = torch.cat([cv, vb], 0).repeat_interleave(nh // nkv, 1)
            att = F.scaled_dot_product_attention(
                q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), attn_mask=mask
            )
            h = h + self.o_proj(att.transpose(0, 1).reshape(-1, nh * hd))
            x = rms(h, self.post_attention_layernorm)
            return h + self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    class Drafter(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(cfg["n_taps"] * cfg["target_hidden"], D, bias=False)
            # Fixed per-feature input scale (1 / RMS over the training taps):
            # a few residual-stream dimensions are thousands of times larger
            # than the rest and would swamp fc. Exported folded into fc.weight,
            # so the engine's fc . taps is unchanged.
            self.register_buffer("tap_scale", torch.from_numpy(tap_scale))
            self.hidden_norm = nn.Parameter(torch.ones(D))
            self.layers = nn.ModuleList([Layer() for _ in range(cfg["n_layer"])])
            self.norm = nn.Parameter(torch.ones(D))
            r, vo = cfg["markov_rank"], cfg["draft_vocab"]
            self.markov_w1 = nn.Parameter(torch.randn(vo, r) * 0.02)
            self.markov_w2 = nn.Parameter(torch.zeros(vo, r))
            self.register_buffer("head", torch.from_numpy(head_rows))

        def forward(self, taps, ctx_pos, emb, blk_pos, mask, prev_row):
            ctx = rms(self.fc(taps * self.tap_scale), self.hidden_norm)
            h = emb
            for L in self.layers:
                ck, cv = L.ctx_kv(ctx, ctx_pos)
                h = L(h, blk_pos, ck, cv, mask)
            logits = rms(h, self.norm) @ self.head.T
            ok = prev_row >= 0
            bias = self.markov_w1[prev_row.clamp(min=0)] @ self.markov_w2.T
            return logits + bias * ok[:, None].float()

    return Drafter()


def batch_of(torch, seq, cfg, embed, t2d, rng, max_anchors):
    """One sequence's training blocks: anchors in its answer, block rows, targets, mask."""
    toks, n_prompt, taps = seq
    T, B = len(toks), cfg["block"]
    anchors = list(range(max(1, n_prompt), T - 1))
    if not anchors:
        return None
    if len(anchors) > max_anchors:
        anchors = sorted(rng.sample(anchors, max_anchors))
    A = len(anchors)
    N = np.repeat(np.array(anchors), B)
    k = np.tile(np.arange(B), A)
    pos = N + k
    tgt_pos = pos + 1
    tgt = np.where(tgt_pos < T, t2d[toks[np.minimum(tgt_pos, T - 1)]], -1)
    # prev token of row k: the anchor (k = 0) or the true token at N + k.
    prev = t2d[toks[np.minimum(pos, T - 1)]]
    prev = np.where(pos < T, prev, -1)
    ids = np.where(k == 0, toks[N], cfg["mask_token"])
    emb = torch.from_numpy(embed[ids])
    # Context positions 0..T-2 (the last token's taps are never context).
    C = T - 1
    cpos = np.arange(C)
    win = cfg["window"]
    ctx_ok = (cpos[None, :] < N[:, None]) & (cpos[None, :] >= (N[:, None] - win))
    blk = np.arange(A * B)
    same = (blk[None, :] // B) == (blk[:, None] // B)
    causal = (blk[None, :] % B) <= (blk[:, None] % B)
    mask = np.concatenate([ctx_ok, same & causal], 1)
    return dict(
        taps=torch.from_numpy(np.array(taps[:C])),
        ctx_pos=torch.from_numpy(cpos),
        emb=emb,
        blk_pos=torch.from_numpy(pos),
        mask=torch.from_numpy(mask),
        prev=torch.from_numpy(prev.astype(np.int64)),
        tgt=torch.from_numpy(tgt.astype(np.int64)),
        k=torch.from_numpy(k),
    )


def svg_curve(points, path, title):
    """A small hand-written SVG line chart of (step, loss) series."""
    w, h, pad = 560, 300, 48
    xs = [p[0] for s in points.values() for p in s]
    ys = [p[1] for s in points.values() for p in s]
    x0, x1, y0, y1 = 0, max(xs), min(ys), max(ys)
    y1 = y1 if y1 > y0 else y0 + 1

    def X(x):
        return pad + (w - 2 * pad) * (x - x0) / max(1, x1 - x0)

    def Y(y):
        return h - pad - (h - 2 * pad) * (y - y0) / (y1 - y0)

    colours = ["#1f77b4", "#d62728", "#2ca02c"]
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="11">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="16" text-anchor="middle" font-size="13">{title}</text>',
           f'<line x1="{pad}" y1="{h - pad}" x2="{w - pad}" y2="{h - pad}" stroke="black"/>',
           f'<line x1="{pad}" y1="{pad}" x2="{pad}" y2="{h - pad}" stroke="black"/>',
           f'<text x="{w / 2}" y="{h - 10}" text-anchor="middle">training step (one sequence each)</text>']
    for i in range(5):
        yv = y0 + (y1 - y0) * i / 4
        out.append(f'<text x="{pad - 4}" y="{Y(yv) + 4:.1f}" text-anchor="end">{yv:.2f}</text>')
        xv = x0 + (x1 - x0) * i / 4
        out.append(f'<text x="{X(xv):.1f}" y="{h - pad + 14}" text-anchor="middle">{int(xv)}</text>')
    for j, (name, s) in enumerate(points.items()):
        d = " ".join(f"{X(x):.1f},{Y(y):.1f}" for x, y in s)
        c = colours[j % len(colours)]
        out.append(f'<polyline fill="none" stroke="{c}" stroke-width="1.5" points="{d}"/>')
        out.append(f'<text x="{w - pad - 4}" y="{pad + 14 * j}" text-anchor="end" fill="{c}">{name}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megakern", default=os.path.join(ROOT, "build", "megakern"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--gguf", default=os.path.join(ROOT, "models", "smollm2-135m.gguf"))
    ap.add_argument("--prompts", default=os.path.join(ROOT, "scripts", "drafter", "train_prompts.jsonl"))
    ap.add_argument("--limit", type=int, default=150, help="training prompts used (from the top of the file)")
    ap.add_argument("--n-predict", type=int, default=128, help="most answer tokens per prompt")
    ap.add_argument("--taps", default="9,19,29", help="target layers tapped after")
    ap.add_argument("--work", default=os.path.join(ROOT, "build", "drafter-train"))
    ap.add_argument("--out", default=os.path.join(ROOT, "assets", "drafters", "smollm2-135m-dspark"))
    ap.add_argument("--curve", default=os.path.join(ROOT, "scripts", "drafter", "loss.svg"))
    ap.add_argument("--layers", type=int, default=1)
    ap.add_argument("--block", type=int, default=8)
    ap.add_argument("--draft-vocab", type=int, default=4096)
    ap.add_argument("--markov-rank", type=int, default=32)
    ap.add_argument("--epochs", type=float, default=2.5)
    ap.add_argument("--lr", type=float, default=1.5e-3)
    ap.add_argument("--gamma", type=float, default=4.0, help="row weight exp(-k / gamma)")
    ap.add_argument("--max-anchors", type=int, default=96, help="blocks per sequence and step")
    ap.add_argument("--holdout", type=int, default=16, help="sequences kept out of training to track loss")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=35)
    ap.add_argument("--skip-data", action="store_true", help="reuse the work folder's taps")
    args = ap.parse_args()

    import torch

    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rng = random.Random(args.seed)
    os.makedirs(args.work, exist_ok=True)
    t_all = time.time()
    taps_path = os.path.join(args.work, "taps.bin")

    with Stage("data"):
        if not args.skip_data:
            sub = os.path.join(args.work, "prompts.jsonl")
            with open(args.prompts) as f, open(sub, "w") as g:
                lines = [l for l in f if l.strip()][: args.limit]
                g.writelines(lines)
            cmd = [args.megakern, "gen-drafter-data", "-m", args.model, "--prompts", sub, "-o", taps_path,
                   "--taps", args.taps, "-n", str(args.n_predict), "-t", str(args.threads), "--check-taps"]
            log(" ".join(cmd))
            subprocess.run(cmd, check=True)
        W, tap_layers, n_vocab, seqs = read_taps(taps_path)
        embed, head, n_layer = target_matrices(args.gguf)
        H = embed.shape[1]
        log(f"{len(seqs)} sequences, {sum(len(s[0]) - s[1] for s in seqs)} answer tokens, taps {tap_layers} "
            f"({W} wide), target {n_layer} layers, vocab {n_vocab}, hidden {H}")

    with Stage("train"):
        # Draft vocabulary: the tokens the target emits most, ascending ids.
        counts = np.zeros(n_vocab, np.int64)
        for toks, n_prompt, _ in seqs:
            np.add.at(counts, toks[n_prompt:], 1)
        order = np.argsort(-counts, kind="stable")
        vo = min(args.draft_vocab, n_vocab)
        vo -= vo % 32
        d2t = np.sort(order[:vo]).astype(np.int32)
        covered = counts[d2t].sum() / max(1, counts.sum())
        t2d = np.full(n_vocab, -1, np.int64)
        t2d[d2t] = np.arange(vo)
        mask_token = n_vocab - 1
        log(f"draft vocabulary: {vo} tokens, {100 * covered:.2f}% of the answer tokens")
        cfg = dict(target_hidden=H, n_taps=len(tap_layers), hidden=H, n_layer=args.layers, n_head=9, n_head_kv=3,
                   head_dim=64, ffn=1536, block=args.block, markov_rank=args.markov_rank, draft_vocab=vo,
                   mask_token=mask_token, window=2048, rope_base=10000.0, eps=1e-5)
        if W != cfg["n_taps"] * H:
            raise SystemExit(f"taps are {W} wide, expected {cfg['n_taps']} x {H}")
        sample = np.concatenate([s[2][:: max(1, len(s[2]) // 16)] for s in seqs])
        tap_scale = (1.0 / np.sqrt((sample.astype(np.float64) ** 2).mean(0) + 1e-6)).astype(np.float32)
        model = build_model(torch, cfg, np.ascontiguousarray(head[d2t]), tap_scale)
        held, train = seqs[: args.holdout], seqs[args.holdout :]
        steps = int(args.epochs * len(train))
        params = [p for p in model.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min(1.0, (s + 1) / 50) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / max(1, steps)))))
        weights = torch.exp(-torch.arange(args.block, dtype=torch.float32) / args.gamma)

        def loss_of(b):
            logits = model(b["taps"], b["ctx_pos"], b["emb"], b["blk_pos"], b["mask"], b["prev"])
            ok = b["tgt"] >= 0
            ce = torch.nn.functional.cross_entropy(logits, b["tgt"].clamp(min=0), reduction="none")
            w = weights[b["k"]] * ok.float()
            acc = ((logits.argmax(-1) == b["tgt"]) & ok).float()
            return (ce * w).sum() / w.sum(), acc, ok, b["k"]

        held_batches = [b for b in (batch_of(torch, s, cfg, embed, t2d, random.Random(1), 10 ** 9) for s in held) if b]

        def evaluate():
            model.eval()
            tot, n = 0.0, 0
            # Expected accepted drafts per block: mean over blocks of the
            # length of the leading run of correct rows (teacher-forced Markov
            # input, so an estimate).
            run_sum, blocks = 0.0, 0
            with torch.no_grad():
                for b in held_batches:
                    loss, acc, ok, k = loss_of(b)
                    tot += float(loss)
                    n += 1
                    a = acc.view(-1, args.block)
                    run_sum += float(torch.cumprod(a, 1).sum())
                    blocks += a.shape[0]
            model.train()
            return tot / max(1, n), 1 + run_sum / max(1, blocks)

        def export(out, step):
            """config.json, model.safetensors (BF16) and its sha256 of the drafter as it is now."""
            from safetensors.torch import save_file

            os.makedirs(out, exist_ok=True)
            sd = {}
            bf = torch.bfloat16
            sd["fc.weight"] = (model.fc.weight.detach() * model.tap_scale[None, :]).to(bf)
            sd["hidden_norm.weight"] = model.hidden_norm.detach().to(bf)
            for i, L in enumerate(model.layers):
                p = f"layers.{i}."
                sd[p + "input_layernorm.weight"] = L.input_layernorm.detach().to(bf)
                for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                    sd[p + f"self_attn.{n}.weight"] = getattr(L, n).weight.detach().to(bf)
                sd[p + "self_attn.q_norm.weight"] = L.q_norm.detach().to(bf)
                sd[p + "self_attn.k_norm.weight"] = L.k_norm.detach().to(bf)
                sd[p + "post_attention_layernorm.weight"] = L.post_attention_layernorm.detach().to(bf)
                for n in ("gate_proj", "up_proj", "down_proj"):
                    sd[p + f"mlp.{n}.weight"] = getattr(L, n).weight.detach().to(bf)
            sd["norm.weight"] = model.norm.detach().to(bf)
            sd["markov_head.markov_w1.weight"] = model.markov_w1.detach().to(bf)
            sd["markov_head.markov_w2.weight"] = model.markov_w2.detach().to(bf)
            sd["d2t"] = torch.from_numpy(d2t)
            sd = {k: v.contiguous() for k, v in sd.items()}
            st_path = os.path.join(out, "model.safetensors")
            save_file(sd, st_path)
            config = {
                "speculators_model_type": "dspark",
                "transformer_layer_config": {
                    "hidden_size": H, "num_hidden_layers": cfg["n_layer"], "num_attention_heads": cfg["n_head"],
                    "num_key_value_heads": cfg["n_head_kv"], "head_dim": cfg["head_dim"],
                    "intermediate_size": cfg["ffn"], "vocab_size": n_vocab, "sliding_window": cfg["window"],
                    "rope_parameters": {"rope_theta": cfg["rope_base"]}, "rms_norm_eps": cfg["eps"],
                },
                "aux_hidden_state_layer_ids": [l + 1 for l in tap_layers],
                "mask_token_id": mask_token,
                "markov_rank": cfg["markov_rank"],
                "markov_top_m": 0,
                "block_size": cfg["block"],
                "draft_vocab_size": vo,
                "tie_target_embeddings": True,
                "target_num_hidden_layers": n_layer,
                "training": {
                    "prompts": len(seqs), "answer_tokens": int(counts.sum()), "steps": step, "lr": args.lr,
                    "gamma": args.gamma, "seed": args.seed, "max_anchors": args.max_anchors,
                    "checkpoints": [{"step": s, "heldout_loss": round(l, 4), "estimated_acceptance": round(e, 3)}
                                    for s, l, e in checkpoints],
                },
            }
            with open(os.path.join(out, "config.json"), "w") as f:
                json.dump(config, f, indent=2)
                f.write("\n")
            digest = hashlib.sha256(open(st_path, "rb").read()).hexdigest()
            with open(st_path + ".sha256", "w") as f:
                f.write(f"{digest}  model.safetensors\n")
            log(f"wrote {st_path} ({os.path.getsize(st_path) / 1e6:.1f} MB, sha256 {digest})")

        curve_train, curve_held = [], []
        ev0 = evaluate()
        curve_held.append((0, ev0[0]))
        log(f"step 0: held-out loss {ev0[0]:.3f}, estimated acceptance length {ev0[1]:.2f}")
        ema, t0 = None, time.time()
        checkpoints = []
        for step in range(1, steps + 1):
            s = train[rng.randrange(len(train))]
            b = batch_of(torch, s, cfg, embed, t2d, rng, args.max_anchors)
            if b is None:
                continue
            loss, _, _, _ = loss_of(b)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            lv = float(loss.detach())
            ema = lv if ema is None else 0.98 * ema + 0.02 * lv
            if step % 20 == 0:
                curve_train.append((step, ema))
            if step % max(1, steps // 8) == 0 or step == steps:
                hl, est = evaluate()
                curve_held.append((step, hl))
                checkpoints.append((step, hl, est))
                log(f"step {step}/{steps}: train loss (ema) {ema:.3f}, held-out loss {hl:.3f}, estimated "
                    f"acceptance length {est:.2f}, {time.time() - t0:.0f} s")
            if step == steps // 2:
                # A checkpoint at half the steps, to measure how acceptance grows.
                export(os.path.join(args.work, f"checkpoint-{step}"), step)

    with Stage("export"):
        export(args.out, steps)
        svg_curve({"train (EMA)": curve_train, "held-out sequences": curve_held}, args.curve,
                  f"DSpark drafter for {args.model}: weighted block loss")
        log(f"wrote {args.curve}")
    log(f"total {time.time() - t_all:.1f} s wall")


if __name__ == "__main__":
    main()
