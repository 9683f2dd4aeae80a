#!/usr/bin/env python3
"""Server throughput with and without speculative decoding on input-grounded
prompts: starts `megakern serve` once per configuration (alternated, --rounds
times each), sends --requests chat requests from --concurrency clients at
once (greedy, end-of-text ignored), and reports each run's output tokens/s,
the ratio of the speculative runs' mean to the plain runs' mean, whether
every request's text was the same in every run, the acceptance seen in
/metrics, and the load average before and after.

  scripts/bench_spec_serve.py --binary build/megakern -m smollm2-135m \\
      --spec ngram --concurrency 16 --requests 32 --output-len 128 --rounds 2
"""
import argparse
import concurrent.futures
import json
import os
import pathlib
import re
import subprocess
import sys
import time
import urllib.request

ROOT = pathlib.Path(__file__).resolve().parent.parent
ASKS = [
    "Repeat the following text exactly, word for word:",
    "Copy this passage without changing anything:",
    "Quote this paragraph in full:",
    "Rewrite this text with every sentence kept as it is:",
]


def prompts(n):
    """n prompts, each an instruction to reproduce a different passage of the GPL."""
    text = (ROOT / "bench" / "data" / "gpl-3.0.txt").read_text(encoding="utf-8")
    paras = [p.strip() for p in re.split(r"\n\s*\n", text) if 300 <= len(p.strip()) <= 900]
    return [f"{ASKS[i % len(ASKS)]}\n\n{paras[(7 * i) % len(paras)]}" for i in range(n)]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    return 0.0


def run(args, spec, texts):
    cmd = [args.binary, "serve", "-m", args.model, "--port", "0", "--batch", str(args.batch), "-t", str(args.threads),
           "--context", "2048", "--max-tokens", str(args.output_len)]
    if args.step_tokens:
        cmd += ["--step-tokens", str(args.step_tokens)]
    if spec:
        cmd += ["--spec", spec, "--draft", str(args.draft)]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        port = None
        for line in proc.stderr:
            m = re.search(r"on http://[^:]+:(\d+)", line)
            if m:
                port = int(m.group(1))
                break
        if port is None:
            sys.exit(f"server did not start: {' '.join(cmd)}")
        body = lambda t: {"messages": [{"role": "user", "content": t}], "max_tokens": args.output_len,
                          "temperature": 0, "ignore_eos": True}
        post(port, body("warm up"))
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(args.concurrency) as ex:
            outs = list(ex.map(lambda t: post(port, body(t)), texts))
        dt = time.monotonic() - t0
        tokens = sum(o["usage"]["completion_tokens"] for o in outs)
        drafted = metric(port, "megakern_spec_draft_tokens_total")
        accepted = metric(port, "megakern_spec_accepted_tokens_total")
        return tokens / dt, [o["choices"][0]["message"]["content"] for o in outs], drafted, accepted
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--binary", default=str(ROOT / "build" / "megakern"))
    ap.add_argument("-m", "--model", default="smollm2-135m")
    ap.add_argument("--spec", default="ngram")
    ap.add_argument("--draft", type=int, default=6)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--step-tokens", type=int, default=0)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    texts = prompts(args.requests)
    load0 = os.getloadavg()
    rates = {"plain": [], "spec": []}
    outputs = []
    for r in range(args.rounds):
        for name, spec in (("plain", ""), ("spec", args.spec)):
            tps, outs, drafted, accepted = run(args, spec, texts)
            rates[name].append(tps)
            outputs.append(outs)
            extra = f", {accepted:.0f} of {drafted:.0f} drafts accepted" if spec else ""
            print(f"round {r + 1} {name:5}: {tps:7.1f} tokens/s{extra}  (load {os.getloadavg()[0]:.1f})", flush=True)
    same = all(o == outputs[0] for o in outputs)
    mean = lambda v: sum(v) / len(v)
    print(f"spec/plain: {mean(rates['spec']) / mean(rates['plain']):.2f}x (per round: "
          f"{', '.join(f'{s / p:.2f}x' for s, p in zip(rates['spec'], rates['plain']))}); outputs identical: {same}; "
          f"load average {load0[0]:.1f} before, {os.getloadavg()[0]:.1f} after")
    if not same:
        sys.exit("speculative outputs differ from plain ones")


if __name__ == "__main__":
    main()
