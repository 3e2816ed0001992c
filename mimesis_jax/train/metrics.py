"""Training metrics: WORKDIR/metrics.jsonl (every step), stdout lines and TensorBoard (every `log_every`
steps), and a tqdm progress bar with the token rates a stage measures (`BAR_RATES`). TensorBoard gets each number
as a scalar, but the counts `<name>_hist/<k>` (how many values equal k, e.g. `staleness_hist/0`, `/1`, ...) of a
step, which it gets as one histogram `<name>_hist` (`histogram_raw`).

Only process 0 writes. On resume, records of steps after the restored checkpoint (written by the interrupted
run before it died) are dropped from metrics.jsonl, so the file always describes one consistent run.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time

import jax
from tqdm import tqdm


def read_metrics(workdir: str) -> list[dict]:
    """The records of WORKDIR/metrics.jsonl (a clear error naming the line if one is not JSON)."""
    path = os.path.join(workdir, "metrics.jsonl")
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{i}: not a JSON record ({e})") from None
    return out


def _truncate_after(path: str, step: int) -> int:
    """Drops records with step > `step`; returns how many were dropped."""
    if not os.path.exists(path):
        return 0
    keep, dropped = [], 0
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a crash mid-write
                dropped += 1
                continue
            if rec.get("step", 0) > step:
                dropped += 1
            else:
                keep.append(line if line.endswith("\n") else line + "\n")
    if dropped:
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            f.writelines(keep)
        os.replace(tmp, path)
    return dropped


def _fmt(v) -> str:
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


# (record key, progress-bar name): tokens trained per second of step time (LM stages), tokens the policy sampled per
# second of rollout time and tokens trained per second of update time (RL stages)
BAR_RATES = (("tokens_per_s", "tok_s"), ("rollout_tokens_per_s", "rollout_tok_s"),
             ("train_tokens_per_s", "train_tok_s"))


def histogram_raw(counts) -> dict:
    """TensorBoard's raw histogram of integer values given as `counts` (counts[k]: how many values equal k), one
    bucket per value: bucket k holds the values in (k - 1/2, k + 1/2]."""
    counts = [int(c) for c in counts]
    ks = [k for k, c in enumerate(counts) if c]
    return {"min": float(min(ks)), "max": float(max(ks)), "num": sum(counts),
            "sum": float(sum(k * c for k, c in enumerate(counts))),
            "sum_squares": float(sum(k * k * c for k, c in enumerate(counts))),
            "bucket_limits": [k + 0.5 for k in range(len(counts))], "bucket_counts": counts}


class MetricsLogger:
    STDOUT_KEYS = ("loss", "lr", "grad_norm", "tokens_per_s", "step_time_s")

    def __init__(self, workdir: str, *, total_steps: int, start_step: int, log_every: int = 1,
                 tensorboard: bool = True, progress_bar: bool = True, stage: str = "",
                 stdout_keys: tuple[str, ...] | None = None):
        self.primary = jax.process_index() == 0
        self.stdout_keys = self.STDOUT_KEYS if stdout_keys is None else tuple(stdout_keys)
        self.log_every = log_every
        self.total = total_steps
        self.stage = stage
        self.jsonl = None
        self.tb = None
        self.bar = None
        if not self.primary:
            return
        os.makedirs(workdir, exist_ok=True)
        path = os.path.join(workdir, "metrics.jsonl")
        dropped = _truncate_after(path, start_step)
        if dropped:
            self.write(f"metrics.jsonl: dropped {dropped} record(s) after step {start_step} (not in the checkpoint)")
        self.jsonl = open(path, "a")
        if tensorboard:
            # lazy (b): tensorboardX (protobuf) only when TB logging is on
            from tensorboardX import SummaryWriter

            # A resumed run restarts after `start_step`: purge_step tells TensorBoard's reader to drop the events
            # of steps > start_step that the interrupted run wrote before it died (metrics.jsonl is truncated above
            # for the same reason), so each step shows once.
            self.tb = SummaryWriter(os.path.join(workdir, "tensorboard"),
                                    purge_step=start_step + 1 if start_step > 0 else None)
        if progress_bar:
            tty = sys.stderr.isatty()
            self.bar = tqdm(total=total_steps, initial=start_step, desc=stage or "train", unit="step",
                            dynamic_ncols=True, mininterval=0.5 if tty else 30.0, file=sys.stderr)
        self._t_tokens = 0.0
        self._t0 = time.perf_counter()

    def write(self, msg: str) -> None:
        if not self.primary:
            return
        if self.bar is not None:
            self.bar.write(msg, file=sys.stdout)
        else:
            print(msg, flush=True)

    def log(self, step: int, record: dict) -> None:
        """`record`: host scalars for `step` (the step just completed, 1-based)."""
        if not self.primary:
            return
        rec = {"step": int(step)}
        for k, v in record.items():
            if isinstance(v, float) and not math.isfinite(v):
                rec[k] = str(v)  # JSON has no NaN/inf; keep them readable
            else:
                rec[k] = v
        self.jsonl.write(json.dumps(rec) + "\n")
        self.jsonl.flush()
        if self.bar is not None:
            self.bar.update(1)
            post = {"loss": _fmt(record.get("loss", float("nan")))}
            # each rate a stage measures, under its own name; a stage that measures none shows none (never a fake 0)
            for key, short in BAR_RATES:
                if key in record:
                    post[short] = f"{record[key]:.0f}"
            self.bar.set_postfix(post, refresh=False)
        if step % self.log_every == 0 or step == self.total:
            parts = [f"{self.stage} step {step}/{self.total}"] + [
                f"{k} {_fmt(record[k])}" for k in self.stdout_keys if k in record]
            self.write(" | ".join(parts))
            if self.tb is not None:
                hists: dict[str, dict[int, int]] = {}
                for k, v in record.items():
                    name, _, value = k.rpartition("/")
                    if name.endswith("_hist") and value.isdigit():  # one bucket of a histogram
                        hists.setdefault(name, {})[int(value)] = int(v)
                    elif isinstance(v, (int, float)) and not isinstance(v, bool):
                        self.tb.add_scalar(f"train/{k}", v, step)
                for name, counts in hists.items():
                    if sum(counts.values()):
                        self.tb.add_histogram_raw(f"train/{name}", global_step=step, **histogram_raw(
                            [counts.get(i, 0) for i in range(max(counts) + 1)]))
                self.tb.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.jsonl is not None:
            self.jsonl.close()
            self.jsonl = None
        if self.tb is not None:
            self.tb.close()
            self.tb = None
