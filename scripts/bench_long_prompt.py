#!/usr/bin/env python3
"""Mixed load against a running `megakern serve`: N greedy streams decode
while one long prompt arrives in the middle of them; prints each stream's
inter-token gaps (p50 / p99 / max, and max against the median), before,
during and after the long prompt, and the long prompt's time to first token.

    build/megakern serve -m smollm2-135m --port 8080 &
    scripts/bench_long_prompt.py --url http://127.0.0.1:8080 --streams 4 \\
        --output-len 256 --long-prompt-tokens 2000 --long-prompt-at 1.0

The long prompt is token ids (the tokenized text of bench/data/gpl-3.0.txt,
repeated as needed, cut to --long-prompt-tokens), so its length is exact.
The server's --max-tokens must allow --output-len. A gap is the time between two consecutive server-sent events of a stream
that carry text; the first event (time to first token) is not a gap.
Exits 1 when a request fails, or with --max-ratio R when some stream's
longest gap exceeds R times its median gap.
"""
import argparse
import http.client
import json
import os
import statistics
import sys
import threading
import time
import urllib.parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def post_json(url, path, body, timeout=600):
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    if r.status != 200:
        raise RuntimeError(f"{path}: HTTP {r.status}: {data[:200]!r}")
    return json.loads(data)


def stream(url, body, out):
    """Streams a completion; out gets the arrival times of events with text."""
    u = urllib.parse.urlparse(url)
    c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=600)
    body = dict(body, stream=True)
    out["sent"] = time.monotonic()
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
        return
    times, text = [], []
    while True:
        line = r.readline()
        if not line:
            break
        line = line.strip()
        if not line.startswith(b"data: "):
            continue
        data = line[6:]
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        t = ev["choices"][0].get("text", "") if ev.get("choices") else ""
        if t:
            times.append(time.monotonic())
            text.append(t)
    out["times"] = times
    out["text"] = "".join(text)


def pct(xs, q):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080")
    ap.add_argument("--streams", type=int, default=4, help="streams decoding while the long prompt arrives")
    ap.add_argument("--output-len", type=int, default=256, help="tokens each stream generates")
    ap.add_argument("--prompt", default="The history of the city of Paris begins")
    ap.add_argument("--long-prompt-tokens", type=int, default=2000)
    ap.add_argument("--long-prompt-at", type=float, default=1.0,
                    help="seconds after the streams start that the long prompt is sent")
    ap.add_argument("--long-output-len", type=int, default=8)
    ap.add_argument("--max-ratio", type=float, default=0, help="fail when max gap / median gap exceeds this")
    a = ap.parse_args()
    if a.streams < 1 or a.output_len < 2 or a.long_prompt_tokens < 1 or a.long_prompt_at < 0:
        sys.exit("--streams >= 1, --output-len >= 2, --long-prompt-tokens >= 1 and --long-prompt-at >= 0 please")

    with open(os.path.join(ROOT, "bench", "data", "gpl-3.0.txt"), encoding="utf-8") as f:
        ids = post_json(a.url, "/tokenize", {"content": f.read()})["tokens"]
    long_ids = (ids * (a.long_prompt_tokens // max(1, len(ids)) + 1))[: a.long_prompt_tokens]

    common = {"max_tokens": a.output_len, "temperature": 0, "ignore_eos": True}
    outs = [{} for _ in range(a.streams)]
    threads = [threading.Thread(target=stream, args=(a.url, dict(common, prompt=a.prompt), o)) for o in outs]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(a.long_prompt_at)
    long_out = {}
    long_t = threading.Thread(target=stream, args=(a.url, {"prompt": long_ids, "max_tokens": a.long_output_len,
                                                           "temperature": 0, "ignore_eos": True}, long_out))
    long_t.start()
    for t in threads + [long_t]:
        t.join()
    failed = [o.get("error") for o in outs + [long_out] if "error" in o]
    if failed:
        sys.exit(f"requests failed: {failed}")
    sent = long_out["sent"]
    first = long_out["times"][0] if long_out["times"] else float("nan")
    done = long_out["times"][-1] if long_out["times"] else float("nan")
    print(f"{a.streams} streams x {a.output_len} tokens; a {a.long_prompt_tokens}-token prompt sent at "
          f"{sent - t0:.2f} s, first token after {1000 * (first - sent):.0f} ms")
    print(f"{'stream':>6} {'tokens':>6} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'max/p50':>8} "
          f"{'p50 before':>10} {'max during':>10} {'p50 during':>10}")
    worst = 0.0
    for i, o in enumerate(outs):
        ts = o["times"]
        gaps = [1000 * (b - x) for x, b in zip(ts, ts[1:])]
        during = [1000 * (b - x) for x, b in zip(ts, ts[1:]) if b > sent and x < first]
        before = [1000 * (b - x) for x, b in zip(ts, ts[1:]) if b <= sent]
        p50 = statistics.median(gaps)
        ratio = max(gaps) / p50
        worst = max(worst, ratio)
        print(f"{i:>6} {len(ts):>6} {p50:>8.1f} {pct(gaps, 0.99):>8.1f} {max(gaps):>8.1f} {ratio:>7.1f}x "
              f"{(statistics.median(before) if before else float('nan')):>10.1f} "
              f"{(max(during) if during else float('nan')):>10.1f} "
              f"{(statistics.median(during) if during else float('nan')):>10.1f}")
    print(f"worst max/median gap: {worst:.2f}x")
    if a.max_ratio > 0 and worst > a.max_ratio:
        sys.exit(f"a stream's longest gap is {worst:.2f}x its median, over --max-ratio {a.max_ratio}")


if __name__ == "__main__":
    main()
