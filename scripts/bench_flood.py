#!/usr/bin/env python3
"""Connection flood against `megakern serve`: many idle keep-alive
connections plus streaming clients at once, /health latency measured on
fresh connections meanwhile.

Starts the server itself (or uses --url), opens --idle connections (half make
one request and keep the connection, half never send a byte), starts
--streams streamed completions, probes /health every --probe-ms until they
end, and prints the /health latency percentiles, how many streams completed
and how many idle connections were still served afterwards.

Each connection takes a file descriptor on both ends: the script raises its
own soft RLIMIT_NOFILE to the hard limit (and the server's, which inherits
it); with a hard limit under about 2.5x --idle, raise it first
(`ulimit -Hn`, or LimitNOFILE= in a systemd unit).

    python3 scripts/bench_flood.py --binary build/megakern --model models/smollm2-135m.gguf
"""
import argparse
import asyncio
import resource
import socket
import statistics
import subprocess
import sys
import time


def raise_fd_limit(need):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < need:
        sys.exit(f"bench_flood: needs about {need} file descriptors, the hard limit is {hard} (raise ulimit -Hn)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def http_get(host, port, path):
    r, w = await asyncio.open_connection(host, port)
    w.write(f"GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
    await w.drain()
    data = await r.read()
    w.close()
    return data


async def stream(host, port, max_tokens, model):
    body = ('{"prompt": "Once upon a time", "max_tokens": %d, "ignore_eos": true, "stream": true%s}'
            % (max_tokens, f', "model": "{model}"' if model else ""))
    r, w = await asyncio.open_connection(host, port)
    w.write((f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
             f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n{body}").encode())
    await w.drain()
    data = await r.read()
    w.close()
    return data.startswith(b"HTTP/1.1 200") and b"data: [DONE]" in data


async def run(args, host, port):
    # Idle connections: even ones make one request and keep the connection.
    idle = []
    for i in range(args.idle):
        r, w = await asyncio.open_connection(host, port)
        if i % 2 == 0:
            w.write(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
            await w.drain()
            head = await r.readuntil(b"\r\n\r\n")
            n = int([l for l in head.split(b"\r\n") if l.lower().startswith(b"content-length:")][0].split(b":")[1])
            await r.readexactly(n)
        idle.append((r, w))
    t0 = time.perf_counter()
    tasks = [asyncio.create_task(stream(host, port, args.max_tokens, args.model)) for _ in range(args.streams)]
    lat = []
    while not all(t.done() for t in tasks):
        s = time.perf_counter()
        resp = await http_get(host, port, "/health")
        if resp.startswith(b"HTTP/1.1 200"):
            lat.append((time.perf_counter() - s) * 1000)
        else:
            lat.append(float("inf"))
        await asyncio.sleep(args.probe_ms / 1000)
    ok = sum(t.result() for t in tasks)
    wall = time.perf_counter() - t0
    # Were the idle connections kept?
    alive = 0
    for r, w in idle:
        w.write(f"GET /health HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    for r, w in idle:
        try:
            head = await asyncio.wait_for(r.readuntil(b"\r\n\r\n"), 5)
            alive += head.startswith(b"HTTP/1.1 200")
        except Exception:
            pass
        w.close()
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))]
    print(f"idle connections: {args.idle} held, {alive} still served afterwards")
    print(f"streams: {ok} of {args.streams} completed ({args.max_tokens} tokens each) in {wall:.1f} s")
    print(f"/health on fresh connections: n={len(lat)} p50={q(0.5):.1f} ms p99={q(0.99):.1f} ms max={lat[-1]:.1f} ms")
    return ok == args.streams and alive == args.idle


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--binary", default="build/megakern")
    ap.add_argument("--model", default="dense-mini", help="model for the server (a path or a synthetic preset)")
    ap.add_argument("--url", help="use a running server at http://HOST:PORT instead of starting one")
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--streams", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--probe-ms", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64)
    args = ap.parse_args()
    raise_fd_limit(int(args.idle * 2.5) + 256)
    proc = None
    if args.url:
        host, port = args.url.split("//")[-1].rsplit(":", 1)
        port = int(port)
        args.model = None
    else:
        host, port = "127.0.0.1", free_port()
        # The idle connections must outlast the run: a long keep-alive timeout.
        proc = subprocess.Popen([args.binary, "serve", "-m", args.model, "--port", str(port), "--batch",
                                 str(min(64, args.batch)), "--queue", str(max(64, args.streams)),
                                 "--idle-timeout", "600", "--max-connections", str(args.idle + args.streams + 64)],
                                stdout=subprocess.DEVNULL)
        for _ in range(600):
            try:
                socket.create_connection((host, port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        args.model = None
    try:
        good = asyncio.run(run(args, host, port))
    finally:
        if proc:
            proc.terminate()
            proc.wait(30)
    sys.exit(0 if good else 1)


if __name__ == "__main__":
    main()
