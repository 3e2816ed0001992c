"""The API-latency benchmark of issue #44 item 7 (first bullet): synchronous vs asynchronous Stage II RL when the
user is an API that takes its time.

    python benchmarks/bench_async_latency.py                       # 6 steps per arm, a 1 s user, max_staleness 2
    python benchmarks/bench_async_latency.py --rollout-devices 0   # without the rollout-pool arm
    python benchmarks/bench_async_latency.py --steps 4 --delay 0.5 --json out.json

The tiny Stage II GRPO run (`configs/tiny_agentrl.py:grpo`: 8 tasks x 4 dialogues per step, 2 agent turns) talks to
a loopback OpenAI-compatible *user* endpoint started in this process (`DelayUser`: a threaded HTTP server on
127.0.0.1 speaking the `/v1/chat/completions` subset that `OpenAIChatModel` (chat/remote.py) sends; every answer
comes after a fixed delay, like an API-served LLM user, and is the same short thought and reply). The config's users section
points the run at it (`users.simulator=http://127.0.0.1:PORT/v1`, `users.simulator_model`, no key): the run goes
through the same remote client, retries and concurrency as a real API user. The toy gym's reward is rule-based
(envs/toy.py), so the user's words do not change what is learned, only when it arrives.

The arms run in this one process, one after the other, each in a fresh workdir on the same 8 (fake) devices:

* sync  -- `rl.max_staleness=0`: each step's rollouts, then its update;
* async -- `rl.max_staleness=N` (default 2): the next steps' rollouts (and their user waits) run while the current
  step's update does (train/rl/async_rollouts.py), on the same devices: the update and the sampler take turns on
  them, so what overlaps the update is what is not a device program (user waits, environment steps, packing);
* pool  -- `rl.max_staleness=N rollout.devices=D` (default 4; `--rollout-devices 0` leaves the arm out): the
  rollouts sample on the last D devices and the update trains on the others, at the same time (no turns).

Per arm it prints each step's `step_s` (the loop's wall seconds per step, in every RL record), their median over the
steps after the first (the first compiles), `rollout_s` and `train_s` medians (async: also `rollout_wait_s`, the
loop's wait for the producer), the user requests served and the most in flight at once, and then the ratio of each
asynchronous arm to sync of the median step_s (the issue's goal: <= 0.6x) next to what to expect: the producer
keeps up to max_staleness + 1 steps' rollouts in flight, so a steady asynchronous step takes about its rollouts over
that many, and no less than its update (the sync arm's medians; every arm is noisy). With several steps in
flight the loop's steps come in bursts: one long wait, then steps whose rollouts are done already; the mean step_s over the same steps (wall
seconds per step: the throughput) is printed beside the median. The server stops (shutdown, then close)
whatever happens; each run stops its producer thread itself.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
USER_MODEL = "delay-user"
# the tiny config's simulator thinks first (users.simulator_thinking): its turn is a closed thought, then the utterance
USER_REPLY = "<think>\nThe reply is on topic; I want more.\n</think>\n\nHmm. Tell me more."


class DelayUser:
    """A loopback OpenAI-compatible chat endpoint that answers every `POST {base}/chat/completions` with USER_REPLY
    after `delay_s` seconds (requests are served concurrently, one thread each). `requests` counts the answered
    ones, `peak_in_flight` the most it held at once (`reset_peak()` starts a new count); other paths get 404. Use as a
    context manager, or call `close()`."""

    def __init__(self, delay_s: float):
        self.delay_s, self._lock = float(delay_s), threading.Lock()
        self.requests = self.in_flight = self.peak_in_flight = 0
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                req = json.loads(body or b"{}")
                with owner._lock:
                    owner.in_flight += 1
                    owner.peak_in_flight = max(owner.peak_in_flight, owner.in_flight)
                time.sleep(owner.delay_s)
                with owner._lock:
                    owner.in_flight -= 1
                    owner.requests += 1
                self._send(200, owner.completion(req))

            def _send(self, status, payload):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="delay-user", daemon=True)
        self._thread.start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @staticmethod
    def completion(req: dict) -> dict:
        words = len(USER_REPLY.split())
        return {"id": "delay-user", "object": "chat.completion", "created": int(time.time()),
                "model": req.get("model", USER_MODEL),
                "choices": [{"index": 0, "message": {"role": "assistant", "content": USER_REPLY},
                             "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 0, "completion_tokens": words, "total_tokens": words}}

    def reset_peak(self):
        with self._lock:
            self.peak_in_flight = self.in_flight

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def arm_overrides(url: str, steps: int, max_staleness: int, rollout_devices: int = 0) -> list[str]:
    """The `--set` overrides of one arm: the tiny GRPO run against the endpoint at `url`, no checkpoints mid-run."""
    return [f"users.simulator={url}", f"users.simulator_model={USER_MODEL}", "users.key_env=",
            "users.judge=", "users.coach=", f"train.steps={steps}", "train.progress_bar=false",
            "train.tensorboard=false", f"checkpoint.every={steps + 1}", "checkpoint.async_save=false",
            f"rl.max_staleness={max_staleness}", f"rollout.devices={rollout_devices}"]


def run_arm(name: str, url: str, steps: int, max_staleness: int, workdir: str, rollout_devices: int = 0) -> dict:
    from mimesis_jax.train.rl import agent

    cfg = agent.load(os.path.join(ROOT, "configs", "tiny_agentrl.py") + ":grpo",
                     arm_overrides(url, steps, max_staleness, rollout_devices))
    t0 = time.perf_counter()
    res = agent.run(cfg, workdir, handle_signals=False, log=lambda *a: None)
    wall = time.perf_counter() - t0
    recs = [res.metrics[s] for s in sorted(res.metrics)]
    warm = recs[1:] or recs
    med = lambda key: statistics.median(r[key] for r in warm)  # noqa: E731
    return {"arm": name, "max_staleness": max_staleness, "rollout_devices": rollout_devices, "steps": len(recs),
            "wall_s": wall,
            "step_s": [r["step_s"] for r in recs], "median_step_s": med("step_s"),
            "mean_step_s": statistics.mean(r["step_s"] for r in warm),
            "median_rollout_s": med("rollout_s"), "median_train_s": med("train_s"),
            "median_rollout_wait_s": med("rollout_wait_s") if max_staleness else None,
            "reward": [r.get("reward_mean") for r in recs]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=6, help="RL steps per arm (the median skips the first)")
    ap.add_argument("--delay", type=float, default=1.0, help="seconds the user endpoint waits before each answer")
    ap.add_argument("--max-staleness", type=int, default=2, help="rl.max_staleness of the asynchronous arms")
    ap.add_argument("--rollout-devices", type=int, default=4, help="rollout.devices of the pool arm (0: no pool arm)")
    ap.add_argument("--json", default="", help="also write the figures here")
    a = ap.parse_args(argv)
    if a.steps < 2 or a.delay < 0 or a.max_staleness < 1 or a.rollout_devices < 0:
        ap.error("--steps must be >= 2, --delay >= 0, --max-staleness >= 1 and --rollout-devices >= 0")
    import jax

    print(f"devices: {jax.device_count()} x {jax.devices()[0].platform}; user delay {a.delay:g} s; {a.steps} steps "
          "per arm")
    plan = [("sync", 0, 0), ("async", a.max_staleness, 0)]
    if a.rollout_devices:
        plan.append(("pool", a.max_staleness, a.rollout_devices))
    arms = []
    with DelayUser(a.delay) as user, tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        for name, n, d in plan:
            before = user.requests
            user.reset_peak()
            r = run_arm(name, user.url, a.steps, n, os.path.join(tmp, name), d)
            r["user_requests"], r["user_peak_in_flight"] = user.requests - before, user.peak_in_flight
            arms.append(r)
            print(f"{name:5s} rl.max_staleness={n} rollout.devices={d}: step_s "
                  + " ".join(f"{s:.2f}" for s in r["step_s"])
                  + f" | median (steps 2-{r['steps']}) step_s {r['median_step_s']:.2f} (mean "
                  f"{r['mean_step_s']:.2f}), rollout_s "
                  f"{r['median_rollout_s']:.2f}, train_s {r['median_train_s']:.2f} | {r['user_requests']} user "
                  f"requests, at most {r['user_peak_in_flight']} at once | arm wall {r['wall_s']:.1f} s", flush=True)
    sync = arms[0]
    # with max_staleness N up to N + 1 steps' rollouts are in flight and their user waits overlap: a steady
    # asynchronous step takes about its rollouts / (N + 1), and no less than its update
    n = a.max_staleness
    bound = max(sync["median_rollout_s"] / (n + 1), sync["median_train_s"]) / sync["median_step_s"]
    ratios = {}
    for r in arms[1:]:
        ratios[r["arm"]] = r["median_step_s"] / sync["median_step_s"]
        mean_ratio = r["mean_step_s"] / sync["mean_step_s"]
        print(f"{r['arm']} arm: the loop waited {r['median_rollout_wait_s']:.2f} s (median) per step for its "
              f"rollouts; {r['arm']} / sync median step_s: {ratios[r['arm']]:.2f}x (goal <= 0.6x), mean step_s "
              f"(throughput): {mean_ratio:.2f}x")
    print(f"expected with {n + 1} steps' rollouts in flight (max(sync median rollout_s / {n + 1}, train_s) / "
          f"step_s): {bound:.2f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"delay_s": a.delay, "arms": arms, "ratio": ratios["async"], "ratios": ratios,
                       "rollout_bound": bound}, f, indent=1)
    return 0


if __name__ == "__main__":
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
                                   " --xla_cpu_collective_call_terminate_timeout_seconds=15").strip()
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    sys.path.insert(0, ROOT)
    sys.exit(main())
