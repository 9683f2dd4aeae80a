#!/usr/bin/env python3
"""End-to-end test of `megakern serve` with the real `openai` Python client.

Starts the server on a free port with SmolLM2-135M-Instruct, then checks chat
and completions, streamed and not, stop strings, logprobs and echo prompt
scoring (as lm-evaluation-harness asks for them), errors (400, 401), a client
that hangs up mid-stream, a load of concurrent clients whose every response is
checked while the server's resident memory must come back near its level
after a warm-up round, and a clean exit 0 on SIGTERM with a request in flight.

    scripts/test_server.py [--binary build/megakern] [--model smollm2-135m]
                           [--clients 40] [--rounds 2]

Exits non-zero on the first failure; needs the `openai` package (scripts/setup.sh
installs it into .venv-test/).
"""
import argparse
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request

import openai

API_KEY = "test-key"


def log(msg):
    print(f"[test_server] {msg}", flush=True)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def metric(port, name):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/metrics",
                                 headers={"Authorization": f"Bearer {API_KEY}"})
    text = urllib.request.urlopen(req, timeout=30).read().decode()
    m = re.search(r"^" + re.escape(name) + r" (\S+)$", text, re.M)
    check(m, f"metric {name} missing")
    return float(m.group(1))


class Server:
    def __init__(self, binary, model, batch):
        cmd = [binary, "serve", "-m", model, "--port", "0", "--batch", str(batch), "--queue", "64",
               "--context", "1024", "--max-tokens", "256", "--api-key", API_KEY, "--drain-timeout", "30"]
        log("starting " + " ".join(cmd))
        self.proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.port = None
        ready = threading.Event()

        def reader():
            for line in self.proc.stderr:
                self.lines.append(line.rstrip())
                m = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
                if m and self.port is None:
                    self.port = int(m.group(1))
                    ready.set()
            ready.set()

        threading.Thread(target=reader, daemon=True).start()
        ready.wait(120)
        check(self.port is not None, "server did not start:\n" + "\n".join(self.lines))

    def client(self, key=API_KEY):
        return openai.OpenAI(base_url=f"http://127.0.0.1:{self.port}/v1", api_key=key, max_retries=0,
                             timeout=300)


def chat_text(client, content, **kw):
    r = client.chat.completions.create(model="smollm2-135m", messages=[{"role": "user", "content": content}], **kw)
    return r


def test_basics(srv):
    c = srv.client()
    models = c.models.list()
    check([m.id for m in models.data] == ["smollm2-135m"], f"models: {models}")

    r = chat_text(c, "What is the capital of France?", temperature=0, max_tokens=24)
    whole = r.choices[0].message.content
    log(f"chat: {whole!r}")
    check("Paris" in whole, f"no Paris in {whole!r}")
    check(r.choices[0].finish_reason in ("stop", "length"), r.choices[0].finish_reason)
    check(r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 10, f"usage {r.usage}")
    check(r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens, "total_tokens")

    stream = c.chat.completions.create(model="smollm2-135m", temperature=0, max_tokens=24, stream=True,
                                       stream_options={"include_usage": True},
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    pieces, usage, finish, chunks = [], None, None, 0
    for ch in stream:
        chunks += 1
        if ch.usage is not None:
            usage = ch.usage
        for choice in ch.choices:
            if choice.delta.content:
                pieces.append(choice.delta.content)
            if choice.finish_reason:
                finish = choice.finish_reason
    check("".join(pieces) == whole, f"streamed {''.join(pieces)!r} != {whole!r}")
    check(chunks > 3, f"only {chunks} chunks")
    check(finish == r.choices[0].finish_reason, f"finish {finish}")
    check(usage is not None and usage.completion_tokens == r.usage.completion_tokens, f"stream usage {usage}")

    comp = c.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0, max_tokens=8)
    text = comp.choices[0].text
    log(f"completion: {text!r}")
    check(len(text) > 0 and comp.choices[0].finish_reason in ("stop", "length"), f"completion {comp}")
    streamed = "".join(ch.choices[0].text for ch in
                       c.completions.create(model="smollm2-135m", prompt="The capital of France is", temperature=0,
                                            max_tokens=8, stream=True) if ch.choices)
    check(streamed == text, f"streamed completion {streamed!r} != {text!r}")

    # Stop strings: the text ends before the stop string, which never shows.
    r = chat_text(c, "What is the capital of France?", temperature=0, max_tokens=24, stop=["Paris"])
    check("Paris" not in r.choices[0].message.content and r.choices[0].finish_reason == "stop",
          f"stop: {r.choices[0]}")
    check(whole.startswith(r.choices[0].message.content), "stop text is not a prefix of the whole answer")

    # Seeded sampling repeats itself.
    a = chat_text(c, "Tell me a word.", temperature=0.9, top_p=0.95, seed=7, max_tokens=12).choices[0].message.content
    b = chat_text(c, "Tell me a word.", temperature=0.9, top_p=0.95, seed=7, max_tokens=12).choices[0].message.content
    check(a == b, f"seeded sampling differs: {a!r} vs {b!r}")
    log("chat, completions, streaming, usage, stop strings, seeds: ok")


def tokenize(port, text):
    import json
    req = urllib.request.Request(f"http://127.0.0.1:{port}/tokenize", data=json.dumps({"content": text}).encode(),
                                 headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=30).read())["tokens"]


def test_logprobs(srv):
    c = srv.client()
    # Chat: logprobs with alternatives, whole and streamed alike.
    r = chat_text(c, "What is the capital of France?", temperature=0, max_tokens=12, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    check(len(content) == r.usage.completion_tokens, f"{len(content)} entries for {r.usage.completion_tokens} tokens")
    for e in content:
        check(len(e.top_logprobs) == 3 and e.logprob <= 0 and bytes(e.bytes).decode("utf-8", "replace") is not None,
              f"entry {e}")
        check(abs(e.top_logprobs[0].logprob - e.logprob) < 1e-9, f"greedy token not the likeliest: {e}")
    stream = c.chat.completions.create(model="smollm2-135m", temperature=0, max_tokens=12, stream=True, logprobs=True,
                                       top_logprobs=3,
                                       messages=[{"role": "user", "content": "What is the capital of France?"}])
    streamed = [e for ch in stream for choice in ch.choices if choice.logprobs for e in choice.logprobs.content]
    check([(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content],
          "streamed chat logprobs differ")
    # Completions as lm-evaluation-harness's local-completions scores a
    # continuation: token prompts, echo, logprobs 1, max_tokens 0 and 1.
    ctx, cont = "The capital of France is", " Paris"
    ids = tokenize(srv.port, ctx + cont)
    n_ctx = len(tokenize(srv.port, ctx))
    scored = c.completions.create(model="smollm2-135m", prompt=[ids, ids[:n_ctx]], echo=True, max_tokens=0,
                                  logprobs=1, temperature=0)
    check([ch.index for ch in scored.choices] == [0, 1], f"choices {[ch.index for ch in scored.choices]}")
    lp = scored.choices[0].logprobs
    check(len(lp.token_logprobs) == len(ids) and lp.token_logprobs[0] is None, "prompt scoring shape")
    check(lp.top_logprobs[0] is None and all(len(t) == 1 for t in lp.top_logprobs[1:]), "top_logprobs shape")
    check(scored.choices[0].text == ctx + cont and "".join(lp.tokens) == ctx + cont, f"echo {scored.choices[0].text!r}")
    check(lp.text_offset == sorted(lp.text_offset) and lp.text_offset[0] == 0, f"offsets {lp.text_offset}")
    check(scored.choices[1].logprobs.token_logprobs == lp.token_logprobs[:n_ctx], "a prefix scores the same")
    loglik = sum(lp.token_logprobs[n_ctx:])
    greedy = all(abs(t - max(top.values())) < 1e-9 for t, top in zip(lp.token_logprobs[n_ctx:], lp.top_logprobs[n_ctx:]))
    one = c.completions.create(model="smollm2-135m", prompt=[ids], echo=True, max_tokens=1, logprobs=1, temperature=0)
    check(len(one.choices[0].logprobs.token_logprobs) == len(ids) + 1, "echo with one generated token")
    check(one.choices[0].logprobs.token_logprobs[:len(ids)] == lp.token_logprobs, "echo differs with max_tokens 1")
    log(f"logprobs: chat and streamed, echo scoring: log P({cont!r} | {ctx!r}) = {loglik:.4f}, greedy {greedy}: ok")


def test_errors(srv):
    c = srv.client()
    bad = [dict(n=2), dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(model="gpt-4")]
    for kw in bad:
        args = dict(model="smollm2-135m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        args.update(kw)
        try:
            c.chat.completions.create(**args)
            raise AssertionError(f"accepted {kw}")
        except openai.BadRequestError as e:
            check(e.status_code == 400 and isinstance(e.body, dict) and e.body.get("message"), f"{kw}: {e.body}")
    try:
        c.completions.create(model="smollm2-135m", prompt="word " * 1100, max_tokens=4)
        raise AssertionError("accepted a prompt longer than the context")
    except openai.BadRequestError as e:
        check(e.code == "context_length_exceeded", f"code {e.code}")
    try:
        srv.client(key="wrong").models.list()
        raise AssertionError("accepted a wrong API key")
    except openai.AuthenticationError as e:
        check(e.status_code == 401, "401")
    log("400 and 401 paths: ok")


def test_disconnect(srv):
    c = srv.client()
    before = metric(srv.port, 'megakern_requests_finished_total{reason="cancelled"}')
    stream = c.completions.create(model="smollm2-135m", prompt="Once upon a time", max_tokens=250, stream=True,
                                  extra_body={"ignore_eos": True})
    for i, _ in enumerate(stream):
        if i == 2:
            break
    stream.close()
    deadline = time.time() + 30
    while time.time() < deadline:
        if metric(srv.port, 'megakern_requests_finished_total{reason="cancelled"}') > before:
            break
        time.sleep(0.1)
    else:
        raise AssertionError("a client that hung up was not cancelled")
    log("client disconnect cancels its request: ok")


PROMPTS = ["What is 2+2?", "Name a color.", "Say hello.", "What is the capital of Italy?", "Count to three."]


def one_client(srv, i, barrier):
    c = srv.client()
    barrier.wait()
    prompt = PROMPTS[i % len(PROMPTS)]
    max_tokens = 4 + (i % 4) * 4
    # A short system turn replaces SmolLM2's default one: prompts stay short,
    # so the round's time goes to decoding the batch rather than to prefill.
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": prompt}]
    if i % 2:
        pieces, finish, usage = [], None, None
        for ch in c.chat.completions.create(model="smollm2-135m", max_tokens=max_tokens, temperature=0.7, seed=i,
                                            stream=True, stream_options={"include_usage": True},
                                            messages=messages):
            if ch.usage is not None:
                usage = ch.usage
            for choice in ch.choices:
                pieces.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        text, completion_tokens = "".join(pieces), usage.completion_tokens if usage else -1
    else:
        r = c.chat.completions.create(model="smollm2-135m", max_tokens=max_tokens, temperature=0.7, seed=i,
                                      messages=messages)
        text, finish, completion_tokens = r.choices[0].message.content, r.choices[0].finish_reason, \
            r.usage.completion_tokens
    check(finish in ("stop", "length"), f"client {i}: finish {finish}")
    check(0 < completion_tokens <= max_tokens, f"client {i}: {completion_tokens} tokens for max {max_tokens}")
    check(finish == "stop" or completion_tokens == max_tokens, f"client {i}: length finish with fewer tokens")
    check(len(text) > 0 or finish == "stop", f"client {i}: empty text")
    return completion_tokens


def load_round(srv, clients):
    barrier = threading.Barrier(clients)
    t0 = time.time()
    with concurrent.futures.ThreadPoolExecutor(max_workers=clients) as ex:
        tokens = list(ex.map(lambda i: one_client(srv, i, barrier), range(clients)))
    return sum(tokens), time.time() - t0


def test_load(srv, clients, rounds):
    pid = srv.proc.pid
    tokens, dt = load_round(srv, clients)  # warm-up: every row, thread and buffer in use once
    base = rss_kib(pid)
    log(f"warm-up: {clients} concurrent clients, {tokens} tokens in {dt:.1f} s; RSS {base / 1024:.1f} MiB")
    for r in range(rounds):
        tokens, dt = load_round(srv, clients)
        check(srv.proc.poll() is None, "the server died under load")
        log(f"round {r + 1}: {clients} concurrent clients, every response checked, {tokens} tokens in {dt:.1f} s")
    time.sleep(0.5)
    after = rss_kib(pid)
    log(f"RSS after load {after / 1024:.1f} MiB (baseline {base / 1024:.1f} MiB)")
    check(after <= base * 1.10 + 16 * 1024, f"RSS grew from {base} KiB to {after} KiB")
    check(metric(srv.port, "megakern_queue_depth") == 0, "queue not empty after the load")
    check(metric(srv.port, "megakern_active_sequences") == 0, "sequences left active after the load")


def test_sigterm(srv):
    c = srv.client()
    got = []

    def stream():
        try:
            for ch in c.completions.create(model="smollm2-135m", prompt="Once", max_tokens=16, stream=True,
                                           extra_body={"ignore_eos": True}):
                if ch.choices:
                    got.append(ch.choices[0].text)
        except Exception as e:  # noqa: BLE001 - reported below
            got.append(e)

    t = threading.Thread(target=stream)
    t.start()
    time.sleep(0.3)
    srv.proc.send_signal(signal.SIGTERM)
    rc = srv.proc.wait(timeout=60)
    t.join(30)
    check(rc == 0, f"exit status {rc} after SIGTERM:\n" + "\n".join(srv.lines[-10:]))
    check(not any(isinstance(g, Exception) for g in got), f"in-flight request failed: {got}")
    log(f"SIGTERM with a request in flight: it finished ({len(got)} chunks), exit status 0")


def main():
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--binary", default=os.path.join(root, "build", "megakern"))
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    check(args.clients >= 32, "the load test wants at least 32 clients")
    t0 = time.time()
    srv = Server(args.binary, args.model, args.batch)
    try:
        test_basics(srv)
        test_logprobs(srv)
        test_errors(srv)
        test_disconnect(srv)
        test_load(srv, args.clients, args.rounds)
        test_sigterm(srv)
    except BaseException:
        if srv.proc.poll() is None:
            srv.proc.kill()
        log("server log tail:\n" + "\n".join(srv.lines[-20:]))
        raise
    log(f"all passed in {time.time() - t0:.1f} s")


if __name__ == "__main__":
    try:
        main()
    except AssertionError as e:
        print(f"[test_server] FAILED: {e}", file=sys.stderr)
        sys.exit(1)
