"""A bounded load test of `serve` on loopback: both backends, plain / streaming / dropping clients, in one run.

    python benchmarks/bench_serve.py                                   # 64 requests, 16 at once, 60 s cap per mode
    python benchmarks/bench_serve.py --n 20 --concurrency 20 --duration 10 --backends engine

For each backend (`default`: the batching sampler; `engine`: `serve --engine`) a server is started as a
subprocess (`python -m mimesis_jax serve --port 0 --host 127.0.0.1`) on a tiny random Qwen3 (or --checkpoint),
warmed up with one untimed pass of every mode, and hit by `openai` clients from a thread pool, --concurrency at a time:

* plain  -- --n chat completions of --max-tokens tokens (temperature 1, a seed per request);
* stream -- the same, streamed; a request counts as a full answer when its last chunk carries a finish reason;
* drop   -- --n streams asking for --drop-max-tokens tokens whose clients close the connection after the first
  chunk. The server should cancel their generations: right after, one plain request is timed ("after drop") and
  compared, as a ratio, with the larger of two references: the median of 3 plain requests timed before any load
  ("baseline") and of 3 timed right after it ("settled"). Uncancelled streams hold up the first request only (they
  are done when it is); a moment when a shared machine is busy slows the settled requests as much.

Every mode stops starting requests after --duration seconds (those not started are reported as `capped`); each
request has a client timeout. Reported per backend and mode: requests sent / full answers / errors, req/s over the
mode's wall time, p50 / p95 / p99 latency (drop: time to the first chunk), the server's RSS (VmRSS, from
/proc) before the load and after it, what /health says the server still holds once the load is over (active
choices; the engine's KV pages), and the status an oversized prompt gets (plain and streamed; 400 expected). --json writes the same numbers for other tools (tests/test_bench_serve.py).
Only 127.0.0.1 is used; the servers are stopped (SIGINT, then SIGKILL after 30 s) whatever happens.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONV = [{"role": "system", "content": "You are a customer."}, {"role": "user", "content": "Hello, how can I help?"}]
MODES = ("plain", "stream", "drop")


def tiny_checkpoint(path: str) -> str:
    """A tiny random Qwen3 in HF format for the tiny tokenizer (what tests/test_serve.py serves)."""
    import jax

    from mimesis_jax import models
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.models.config import ModelConfig

    tok = load_tokenizer("tiny")
    config = ModelConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8, initializer_range=0.3,
                         max_position_embeddings=1024)
    models.save_hf(path, config, models.init_params(config, jax.random.key(0)))
    return path


def rss_mb(pid: int) -> float:
    """Resident set size of a process in MiB (VmRSS of /proc/PID/status; nan where /proc has none)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return float("nan")


class Server:
    """`python -m mimesis_jax serve` on 127.0.0.1 with a free port, as a subprocess."""

    def __init__(self, checkpoint: str, flags: list[str], *, startup_s: float = 300.0):
        env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   PYTHONUNBUFFERED="1")
        cmd = [sys.executable, "-m", "mimesis_jax", "serve", "--checkpoint", checkpoint, "--host", "127.0.0.1",
               "--port", "0", "--model-name", "tiny", *flags]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        found = threading.Event()
        self.url = None

        def read():  # keeps the pipe drained for the server's whole life
            for line in self.proc.stdout:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"serving \S+ on (http://127\.0\.0\.1:\d+/v1)", line)
                if m and self.url is None:
                    self.url = m.group(1)
                    found.set()
            found.set()

        threading.Thread(target=read, daemon=True).start()
        if not found.wait(startup_s) or self.url is None:
            self.stop()
            raise RuntimeError("serve did not start: " + " | ".join(self.lines[-5:]))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation between order statistics; nan for no data."""
    if not xs:
        return float("nan")
    s = sorted(xs)
    k = (len(s) - 1) * q / 100.0
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def one_request(client, mode: str, seed: int, max_tokens: int) -> dict:
    """One request of `mode`; {latency_s, full, tokens} (drop: latency = time to the first chunk, full = False)."""
    t0 = time.perf_counter()
    if mode == "plain":
        r = client.chat.completions.create(model="tiny", messages=CONV, max_tokens=max_tokens, temperature=1.0,
                                           seed=seed)
        c = r.choices[0]
        n = r.usage.completion_tokens
        full = c.finish_reason in ("stop", "length") and n >= 1 and (c.finish_reason != "length" or n == max_tokens)
        return {"latency_s": time.perf_counter() - t0, "full": full, "tokens": n}
    stream = client.chat.completions.create(model="tiny", messages=CONV, max_tokens=max_tokens, temperature=1.0,
                                            seed=seed, stream=True)
    if mode == "drop":
        try:
            next(iter(stream))  # the first chunk (the role delta) ...
            return {"latency_s": time.perf_counter() - t0, "full": False, "tokens": 0}
        finally:
            stream.close()  # ... and the client goes away mid-stream
    finish, chunks = None, 0
    for chunk in stream:
        chunks += 1
        for c in chunk.choices:
            if c.finish_reason is not None:
                finish = c.finish_reason
    return {"latency_s": time.perf_counter() - t0, "full": finish in ("stop", "length"), "tokens": chunks}


def run_mode(url: str, mode: str, n: int, concurrency: int, duration_s: float, max_tokens: int,
             seed0: int) -> dict:
    """`n` requests of `mode`, `concurrency` at a time; none started after `duration_s`."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=max(60.0, 6 * duration_s))
    t0 = time.perf_counter()
    results, errors = [], []
    capped = 0

    def job(i):
        if time.perf_counter() - t0 > duration_s:
            return None
        return one_request(client, mode, seed0 + i, max_tokens)

    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        for fut in [pool.submit(job, i) for i in range(n)]:
            try:
                r = fut.result()
            except Exception as e:  # noqa: BLE001 -- counted and reported
                errors.append(f"{type(e).__name__}: {e}")
                continue
            if r is None:
                capped += 1
            else:
                results.append(r)
    wall = time.perf_counter() - t0
    client.close()
    lat = [r["latency_s"] for r in results]
    return {"mode": mode, "sent": n - capped, "capped": capped, "done": len(results), "errors": len(errors),
            "error_samples": errors[:3], "full": sum(r["full"] for r in results), "wall_s": wall,
            "req_per_s": len(results) / wall if wall > 0 else float("nan"),
            "p50_s": percentile(lat, 50), "p95_s": percentile(lat, 95), "p99_s": percentile(lat, 99),
            "max_tokens": max_tokens}


def timed_plain(url: str, max_tokens: int, seed: int) -> float:
    import openai

    with openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120.0) as client:
        return one_request(client, "plain", seed, max_tokens)["latency_s"]


def held_after_load(url: str, timeout_s: float = 30.0) -> dict:
    """Poll /health until the server holds nothing (no active choice, no KV page) or `timeout_s` passes; its last
    answer and how long it took (a cancelled generation is released when its decode burst returns)."""
    import urllib.request

    base = url[: -len("/v1")] if url.endswith("/v1") else url
    t0 = time.perf_counter()
    while True:
        with urllib.request.urlopen(base + "/health", timeout=30) as r:
            held = json.loads(r.read())
        idle = held.get("active_choices", 0) == 0 and held.get("pages_in_use", 0) == 0
        if idle or time.perf_counter() - t0 > timeout_s:
            return {**held, "idle_after_s": time.perf_counter() - t0}
        time.sleep(0.05)


def oversized(url: str, max_tokens: int) -> dict:
    """A plain and a streamed request whose prompt alone is longer than any tiny model's context: each must be
    refused with 400 before any work (a stream before its first byte). {mode: status code or error text}."""
    import openai

    big = [{"role": "user", "content": "hello " * 20000}]
    out = {}
    with openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120.0) as client:
        for mode in ("plain", "stream"):
            try:
                r = client.chat.completions.create(model="tiny", messages=big, max_tokens=max_tokens,
                                                   stream=mode == "stream")
                if mode == "stream":
                    list(r)
                out[mode] = "answered"
            except openai.APIStatusError as e:
                out[mode] = e.status_code
            except Exception as e:  # noqa: BLE001 -- reported
                out[mode] = f"{type(e).__name__}: {e}"
    return out


BACKENDS = {"default": [], "engine": ["--engine", "--engine-slots", "16", "--engine-max-len", "512",
                                      "--engine-warmup"]}


def backend_flags(name: str, args) -> list[str]:
    """`serve` flags of backend `name`; the engine's KV page size is --engine-page-size (it sets how many
    page-table widths the engine's warm-up compiles: up to 512 tokens, 3 at 16-token pages, 1 at 64)."""
    flags = ["--max-tokens", str(args.max_tokens), "--tokenizer", args.tokenizer] + BACKENDS[name]
    return flags + (["--engine-page-size", str(args.engine_page_size)] if name == "engine" else [])


def bench_backend(name: str, checkpoint: str, args) -> dict:
    server = Server(checkpoint, backend_flags(name, args))
    try:
        # warm-up (untimed): one request, then every mode once as it will be timed, so that the timed pass
        # measures serving, not the compilation of the batch / length shapes each mode brings
        t0 = time.perf_counter()
        timed_plain(server.url, args.max_tokens, 10**6)
        # bursts of 1, 2, 4, .. --concurrency full requests at both lengths: the default backend compiles one
        # sampler program per (batch, length) bucket, and dropped streams land in batches of any size; on the
        # engine a full-length request compiles the wider page tables
        size = 1
        while True:
            for mt in sorted({args.max_tokens, args.drop_max_tokens}):
                run_mode(server.url, "plain", size, size, args.duration, mt, 10**6)
            if size >= args.concurrency:
                break
            size = min(2 * size, args.concurrency)
        for mode in MODES:
            mt = args.drop_max_tokens if mode == "drop" else args.max_tokens
            run_mode(server.url, mode, args.n, args.concurrency, args.duration, mt, 10**6)
        timed_plain(server.url, args.max_tokens, 10**6 + 1)
        warmup_s = time.perf_counter() - t0
        rss_before = rss_mb(server.pid)
        baseline = statistics.median(timed_plain(server.url, args.max_tokens, 7 + k) for k in range(3))
        modes = {}
        for i, mode in enumerate(MODES):
            mt = args.drop_max_tokens if mode == "drop" else args.max_tokens
            modes[mode] = run_mode(server.url, mode, args.n, args.concurrency, args.duration, mt, (i + 1) * 10**4)
        after_drop = timed_plain(server.url, args.max_tokens, 99)
        settled = statistics.median(timed_plain(server.url, args.max_tokens, 100 + k) for k in range(3))
        held = held_after_load(server.url)
        big = oversized(server.url, args.max_tokens)
        rss_after = rss_mb(server.pid)
    finally:
        server.stop()
    return {"backend": name, "modes": modes, "warmup_s": warmup_s, "baseline_s": baseline, "after_drop_s": after_drop,
            "settled_s": settled, "after_drop_ratio": after_drop / max(baseline, settled), "rss_before_mb": rss_before,
            "rss_after_mb": rss_after,
            "held_after": held, "oversized": big}


def report(results: list[dict]) -> str:
    rows = [f"{'backend':8s} {'mode':6s} {'sent':>5s} {'full':>5s} {'err':>4s} {'capped':>6s} {'req/s':>7s} "
            f"{'p50 ms':>8s} {'p95 ms':>8s} {'p99 ms':>8s}"]
    for b in results:
        for m in b["modes"].values():
            rows.append(f"{b['backend']:8s} {m['mode']:6s} {m['sent']:5d} {m['full']:5d} {m['errors']:4d} "
                        f"{m['capped']:6d} {m['req_per_s']:7.2f} {1e3 * m['p50_s']:8.1f} {1e3 * m['p95_s']:8.1f} "
                        f"{1e3 * m['p99_s']:8.1f}")
    for b in results:
        rows.append(f"{b['backend']}: warm-up {b['warmup_s']:.1f} s; server RSS {b['rss_before_mb']:.0f} MiB before the "
                    "timed load, "
                    f"{b['rss_after_mb']:.0f} MiB after; a plain request {1e3 * b['baseline_s']:.1f} ms before, "
                    f"{1e3 * b['after_drop_s']:.1f} ms right after the dropped streams, "
                    f"{1e3 * b['settled_s']:.1f} ms after that (ratio {b['after_drop_ratio']:.2f})")
        h = b["held_after"]
        rows.append(f"{b['backend']}: after the load it holds {h.get('active_choices')} choices"
                    + (f", {h['pages_in_use']} KV pages" if "pages_in_use" in h else "")
                    + f" ({h['idle_after_s']:.2f} s after the last request); an oversized prompt gets "
                    f"{b['oversized']['plain']} (plain), {b['oversized']['stream']} (stream)")
        for m in b["modes"].values():
            for e in m["error_samples"]:
                rows.append(f"{b['backend']} {m['mode']} error: {e}")
    return "\n".join(rows)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=64, help="requests per mode")
    p.add_argument("--concurrency", type=int, default=16, help="requests in flight at once")
    p.add_argument("--duration", type=float, default=60.0, help="seconds after which a mode starts no request")
    p.add_argument("--max-tokens", type=int, default=16, help="max_tokens of the plain and streamed requests")
    p.add_argument("--drop-max-tokens", type=int, default=256,
                   help="max_tokens of the dropped streams (large: work the server must cancel)")
    p.add_argument("--backends", default="default,engine", help="comma-separated: default, engine")
    p.add_argument("--engine-page-size", type=int, default=16, help="tokens per KV page of the engine backend "
                   "(serve's default 16)")
    p.add_argument("--checkpoint", default=None, help="HF model directory (default: a tiny random Qwen3)")
    p.add_argument("--tokenizer", default="tiny", help="tokenizer spec of the served model (default tiny)")
    p.add_argument("--json", default=None, help="write the results here as JSON")
    args = p.parse_args(argv)
    for flag, v in (("--n", args.n), ("--concurrency", args.concurrency), ("--max-tokens", args.max_tokens),
                    ("--drop-max-tokens", args.drop_max_tokens), ("--engine-page-size", args.engine_page_size)):
        if v < 1:
            p.error(f"{flag} {v}: must be >= 1")
    if args.duration <= 0:
        p.error(f"--duration {args.duration}: must be > 0")
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    bad = [b for b in names if b not in BACKENDS]
    if bad or not names:
        p.error(f"--backends {args.backends}: each must be one of {', '.join(BACKENDS)}")
    with tempfile.TemporaryDirectory() as tmp:
        checkpoint = args.checkpoint or tiny_checkpoint(os.path.join(tmp, "tiny"))
        results = [bench_backend(name, checkpoint, args) for name in names]
    print(report(results), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
