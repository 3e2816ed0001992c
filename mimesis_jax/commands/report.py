"""`python -m mimesis_jax report RUN_DIR... [--out DIR]`: one ``report.md`` plus PNG figures for result folders.

    python -m mimesis_jax report runs/demo/simrl runs/demo/agent_csd --out runs/report
    python -m mimesis_jax report runs/eval_agents            # --out defaults to the one folder given

Each RUN_DIR is recognised by what it holds (first match wins):

* ``ablation.json`` -- an ablation grid (`mimesis_jax/commands/ablate.py`): a table of cells x headline final metrics,
  a table of every final metric, and the last stage's reward (or loss) curve of every finished cell;
* ``summary.json`` -- an agent evaluation (`evalagent`): the per-gym table (mean +- SE over users x seeds, n),
  the paper's Table 2 layout (per-gym means, Avg, MR; docs/reference/metrics.md "Agent performance"), the same per evaluation
  user with Avg and MR computed here by `metrics.average` / `metrics.mean_rank` over the gyms where every agent
  has a score (as summary.json's own), the INVALID episode counts in a table of their own (never averaged in as
  zeros), and per-gym bars with SE error bars;
* ``evalsim.json`` -- a simulator evaluation (`evalsim`): the tau-bench User-Sim Index (feature statistics and
  Dice, Eq 15; D1-D4; ECE with a reliability diagram drawn from ``ece_bins``; USI5, Eq 16), the RealUserSim
  fidelity index (Eq 14), the SimulatorArena Turing distance and style similarity, and the SOUL-Index per task
  and axis -- whichever sections are present, with their INVALID counts (``n_invalid``) apart;
* ``metrics.jsonl`` + ``run_config.json`` -- a training run of any stage (midtrain, sft, simrl, agentrl): curves
  of the loss, of reward_mean with the per-domain ``reward/<d>`` (simrl) or per-gym ``reward/<gym>`` (agentrl)
  rewards, and of ``val/*``; the final record as a table; for simrl runs also the behaviour-task rewards
  ``reward/behaviour/<id>`` averaged over the run (bars) and the meta-narration rate (docs/reference/paper.md 3.4).

A folder holding none of these, or a file that is not what its format says, is an `EnvError` naming the folder,
file and key (exit status 2). Numbers are printed with 4 decimals (scientific notation below 1e-3 or from 1e5);
an absent value is shown as an em dash.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from typing import Any

import numpy as np

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.abcd.behaviour import ALL_IDS
from mimesis_jax.eval import metrics

STAGES = ("midtrain", "sft", "simrl", "agentrl")
BEHAVIOUR_PREFIX = "reward/behaviour/"
ABLATION_HEADLINE = ("reward_mean_last3", "reward_mean", "loss", "val/overall")
DASH = "\u2014"
PM = "\u00b1"


# ------------------------------------------------------------------------------------------ formatting
def fmt(v: Any) -> str:
    """A value for a markdown table: 4 decimals, scientific below 1e-3 / from 1e5, a dash for None."""
    if v is None:
        return DASH
    if isinstance(v, bool) or isinstance(v, str):
        return str(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            return str(v)
        if v != 0 and (abs(v) < 1e-3 or abs(v) >= 1e5):
            return f"{v:.3e}"
        return f"{v:.4f}"
    return str(v)


def _pm(mean, se) -> str:
    return DASH if mean is None else f"{fmt(mean)} {PM} {fmt(se)}"


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(c if isinstance(c, str) else fmt(c) for c in r) + " |" for r in rows]
    return out


def as_number(v) -> float | None:
    """A metric value as a float for plotting: numbers, and the 'nan'/'inf' strings MetricsLogger writes."""
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str) and v.lower() in ("nan", "inf", "-inf"):
        return float(v)
    return None


# ------------------------------------------------------------------------------------------ reading
def read_json(path: str) -> dict:
    try:
        with open(path) as f:
            obj = json.load(f)
    except json.JSONDecodeError as e:
        raise EnvError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(obj, dict):
        raise EnvError(f"{path}: expected a JSON object, got {type(obj).__name__}")
    return obj


def read_metrics(path: str) -> list[dict]:
    """The records of a metrics.jsonl file; each must be a JSON object with an integer "step"."""
    if not os.path.isfile(path):
        raise EnvError(f"{path}: no such file")
    out = []
    with open(path) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise EnvError(f"{path}:{i}: not a JSON record ({e})") from None
            if not isinstance(rec, dict):
                raise EnvError(f"{path}:{i}: expected a JSON object, got {type(rec).__name__}")
            if isinstance(rec.get("step"), bool) or not isinstance(rec.get("step"), int):
                raise EnvError(f"{path}:{i}: field 'step' must be an integer, got {rec.get('step')!r}")
            out.append(rec)
    if not out:
        raise EnvError(f"{path}: no metric records")
    return out


def _need(obj: dict, key: str, where: str, kind: type | None = None):
    if not isinstance(obj, dict) or key not in obj:
        raise EnvError(f"{where}: missing key '{key}'")
    v = obj[key]
    if kind is not None and not isinstance(v, kind):
        raise EnvError(f"{where}: key '{key}' must be a {kind.__name__}, got {v!r}")
    return v


def _num(v, where: str, nullable: bool = False) -> float | None:
    if v is None and nullable:
        return None
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise EnvError(f"{where}: must be a number{' or null' if nullable else ''}, got {v!r}")
    return float(v)


def kind_of(run_dir: str) -> str:
    """ablation | evalagent | evalsim | training (module docstring); EnvError naming the folder otherwise."""
    if not os.path.isdir(run_dir):
        raise EnvError(f"{run_dir}: no such directory")
    has = lambda f: os.path.isfile(os.path.join(run_dir, f))  # noqa: E731
    if has("ablation.json"):
        return "ablation"
    if has("summary.json"):
        return "evalagent"
    if has("evalsim.json"):
        return "evalsim"
    if has("metrics.jsonl") or has("run_config.json"):
        for f in ("metrics.jsonl", "run_config.json"):
            if not has(f):
                raise EnvError(f"{run_dir}: a training run folder needs {f} (found only the other of "
                               "metrics.jsonl / run_config.json)")
        return "training"
    raise EnvError(f"{run_dir}: not a result folder: expected ablation.json, summary.json (evalagent), evalsim.json "
                   "(evalsim) or metrics.jsonl + run_config.json (a training run)")


def _series(records: list[dict], key: str) -> tuple[list[int], list[float]]:
    xs, ys = [], []
    for r in records:
        y = as_number(r.get(key))
        if y is not None:
            xs.append(r["step"])
            ys.append(y)
    return xs, ys


# ------------------------------------------------------------------------------------------ figures
class _Figures:
    """Writes PNGs into the output folder with unique names; returns their names for markdown links."""

    def __init__(self, out: str):
        # lazy (b): matplotlib only when plotting
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.ticker import MaxNLocator

        self.plt, self.MaxNLocator, self.out = plt, MaxNLocator, out

    def save(self, fig, name: str) -> str:
        fig.tight_layout()
        fig.savefig(os.path.join(self.out, name), dpi=110)
        self.plt.close(fig)
        return name

    def curves(self, name: str, title: str, ylabel: str, series: dict[str, tuple[list, list]]) -> str:
        fig, ax = self.plt.subplots(figsize=(6.4, 3.6))
        for label, (xs, ys) in series.items():
            ax.plot(xs, ys, marker="o" if len(xs) <= 30 else None, markersize=3, label=label)
        ax.xaxis.set_major_locator(self.MaxNLocator(integer=True))
        ax.set_xlabel("step")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
        if len(series) > 1:
            ax.legend(fontsize=7, ncol=2 if len(series) > 6 else 1)
        return self.save(fig, name)

    def bars(self, name: str, title: str, ylabel: str, labels: list[str], groups: dict[str, list],
             errors: dict[str, list] | None = None) -> str:
        """Grouped bars: `groups` maps a series to one value per label (None: no bar)."""
        fig, ax = self.plt.subplots(figsize=(max(6.4, 0.6 * len(labels) * max(1, len(groups))), 3.8))
        x = np.arange(len(labels))
        width = 0.8 / max(1, len(groups))
        for i, (series, vals) in enumerate(groups.items()):
            ys = [np.nan if v is None else v for v in vals]
            err = None
            if errors is not None:
                err = [0.0 if e is None else e for e in errors[series]]
            ax.bar(x + (i - (len(groups) - 1) / 2) * width, ys, width, yerr=err, capsize=3 if err else 0,
                   label=series)
        ax.set_xticks(x)
        ax.set_xticklabels(labels, rotation=30 if len(labels) > 6 else 0, ha="right" if len(labels) > 6 else "center")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        if len(groups) > 1:
            ax.legend(fontsize=7)
        return self.save(fig, name)


# ------------------------------------------------------------------------------------------ sections
def _training(run_dir: str, figs: _Figures, prefix: str) -> list[str]:
    cfg_path = os.path.join(run_dir, "run_config.json")
    rc = read_json(cfg_path)
    stage = _need(rc, "stage", cfg_path, str)
    if stage not in STAGES:
        raise EnvError(f"{cfg_path}: key 'stage' must be one of {STAGES}, got {stage!r}")
    name = rc.get("name") or os.path.basename(os.path.normpath(run_dir))
    recs = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
    keys = list(dict.fromkeys(k for r in recs for k in r if k != "step"))
    lines = [f"## `{run_dir}`: {stage} run `{name}`", "",
             f"{len(recs)} step records (steps {recs[0]['step']}-{recs[-1]['step']}).", ""]

    def plot(kind: str, title: str, ylabel: str, ks: list[str]):
        series = {k: _series(recs, k) for k in ks}
        series = {k: v for k, v in series.items() if v[0]}
        if series:
            png = figs.curves(f"{prefix}-{kind}.png", f"{name}: {title}", ylabel, series)
            lines.extend([f"![{name} {kind}]({png})", ""])

    plot("loss", "loss", "loss", ["loss"] if "loss" in keys else [])
    per = "domain" if stage == "simrl" else "gym"
    rewards = [k for k in keys if k == "reward_mean" or (k.startswith("reward/") and
                                                         not k.startswith(BEHAVIOUR_PREFIX))]
    plot("reward", f"reward_mean and per-{per} rewards" if len(rewards) > 1 else "reward_mean", "reward", rewards)
    plot("val", "validation", "score", [k for k in keys if k.startswith("val/") and k != "val/invalid"])
    last = recs[-1]
    lines += [f"### Final metrics (step {last['step']})", ""]
    lines += _table(["metric", "value"], [[k, last[k]] for k in last if k != "step"]) + [""]
    if stage == "simrl":
        lines += _behaviour(recs, keys, name, figs, prefix)
    return lines


def _behaviour(recs: list[dict], keys: list[str], name: str, figs: _Figures, prefix: str) -> list[str]:
    lines = ["### Behaviour task (simrl)", ""]
    ids = [k[len(BEHAVIOUR_PREFIX):] for k in keys if k.startswith(BEHAVIOUR_PREFIX)]
    ids.sort(key=lambda b: (ALL_IDS.index(b) if b in ALL_IDS else len(ALL_IDS), b))
    if not ids:
        lines += ["No behaviour-task rewards were logged (no `reward/behaviour/<id>` key in metrics.jsonl).", ""]
    else:
        rows, means = [], []
        for b in ids:
            _, ys = _series(recs, BEHAVIOUR_PREFIX + b)
            means.append(sum(ys) / len(ys))
            rows.append([b, means[-1], len(ys)])
        lines += ["Mean over the run of each step's mean behaviour-task reward, per assigned behaviour:", ""]
        lines += _table(["behaviour", "mean reward", "steps"], rows) + [""]
        png = figs.bars(f"{prefix}-behaviour.png", f"{name}: behaviour-task reward (mean over the run)",
                        "mean reward", ids, {"reward": means})
        lines += [f"![{name} behaviour rewards]({png})", ""]
    xs, ys = _series(recs, "meta_narration_rate")
    if ys:
        lines += [f"Meta-narration rate: mean {fmt(sum(ys) / len(ys))} over {len(ys)} steps; first {fmt(ys[0])} "
                  f"(step {xs[0]}), last {fmt(ys[-1])} (step {xs[-1]}).", ""]
    else:
        lines += ["Meta-narration rate: not logged (no judged behaviour-task rollout).", ""]
    return lines


def _evalagent(run_dir: str, figs: _Figures, prefix: str) -> list[str]:
    path = os.path.join(run_dir, "summary.json")
    s = read_json(path)
    agents = _need(s, "agents", path, list)
    gyms = _need(s, "gyms", path, list)
    users = _need(s, "users", path, list)
    seeds = _need(s, "seeds", path, list)
    per_gym, avg, mr = _need(s, "per_gym", path, dict), _need(s, "avg", path, dict), _need(s, "mr", path, dict)
    invalid, per_user = _need(s, "invalid", path, dict), _need(s, "per_user", path, dict)
    cell = {}
    for a in agents:
        for g in gyms:
            where = f"{path}: per_gym.{a}.{g}"
            c = _need(_need(per_gym, a, f"{path}: per_gym", dict), g, f"{path}: per_gym.{a}", dict)
            cell[a, g] = (_num(_need(c, "mean", where), f"{where}.mean", True),
                          _num(_need(c, "se", where), f"{where}.se", True), _need(c, "n", where, int))
    lines = [f"## `{run_dir}`: agent evaluation", "",
             f"{len(agents)} agents x {len(users)} evaluation users ({', '.join(map(str, users))}) x {len(gyms)} "
             f"gyms, seeds {', '.join(map(str, seeds))}. Scores are over valid episodes only; INVALID episodes "
             "(refusals, endpoint failures) are counted in their own table.", "",
             "### Per gym (mean " + PM + " SE over users x seeds; n cells)", ""]
    lines += _table(["agent"] + gyms, [[a] + [f"{_pm(*cell[a, g][:2])} (n={cell[a, g][2]})" for g in gyms]
                                       for a in agents]) + [""]
    rows = []
    for a in agents:
        ag = _need(avg, a, f"{path}: avg", dict)
        am = _num(_need(ag, "mean", f"{path}: avg.{a}"), f"{path}: avg.{a}.mean", True)
        ase = _num(_need(ag, "se", f"{path}: avg.{a}"), f"{path}: avg.{a}.se", True)
        rows.append([a] + [cell[a, g][0] for g in gyms] + [_pm(am, ase), _num(_need(mr, a, f"{path}: mr"),
                                                                               f"{path}: mr.{a}", True)])
    lines += ["### Table 2 layout: per-gym means, Avg (mean " + PM + " SE) and mean rank MR (lower is better)", ""]
    lines += _table(["agent"] + gyms + ["Avg", "MR"], rows) + [""]
    ranked = s.get("ranked_gyms", gyms)
    if ranked != gyms:
        lines += [f"Avg and MR are over the gyms where every agent has a score: {', '.join(ranked) or 'none'}.", ""]
    for u in users:
        table = _need(per_user, u, f"{path}: per_user", dict)
        scores = {a: {g: _num(_need(_need(table, a, f"{path}: per_user.{u}", dict), g,
                                    f"{path}: per_user.{u}.{a}"), f"{path}: per_user.{u}.{a}.{g}", True)
                      for g in gyms} for a in agents}
        missing = [f"{a}/{g}" for a in agents for g in gyms if scores[a][g] is None]
        usable = [g for g in gyms if all(scores[a][g] is not None for a in agents)]
        lines += [f"### Evaluation user `{u}`", ""]
        av, ranks, note = {}, {}, ""
        if usable:  # as summary.json's Avg and MR: over the gyms where every agent has a score
            table = {a: {g: scores[a][g] for g in usable} for a in agents}
            av, ranks = metrics.average(table), metrics.mean_rank(table)
        if missing:
            note = (f"No valid episode for {', '.join(missing)}: Avg and MR "
                    + (f"over {', '.join(usable)}." if usable else "not computed."))
        lines += _table(["agent"] + gyms + ["Avg", "MR"],
                        [[a] + [scores[a][g] for g in gyms] + [av.get(a), ranks.get(a)] for a in agents]) + [""]
        if note:
            lines += [note, ""]
    inv = [[a] + [_need(_need(invalid, a, f"{path}: invalid", dict), g, f"{path}: invalid.{a}", int) for g in gyms]
           for a in agents]
    lines += ["### INVALID episodes (excluded from every mean)", ""]
    lines += _table(["agent"] + gyms + ["total"], [r + [sum(r[1:])] for r in inv]) + [""]
    png = figs.bars(f"{prefix}-per_gym.png", "per-gym score (mean, SE error bars; valid episodes)", "score", gyms,
                    {a: [cell[a, g][0] for g in gyms] for a in agents},
                    {a: [cell[a, g][1] for g in gyms] for a in agents})
    return lines + [f"![per-gym scores]({png})", ""]


def _invalid_note(section: dict, where: str, what: str) -> list[str]:
    """The INVALID count of an evalsim section ("n_invalid", written by `evalsim`), shown apart when present."""
    if "n_invalid" not in section:
        return []
    n = _need(section, "n_invalid", where, int)
    return [f"INVALID {what} (judge answer unusable, excluded from the numbers above): {n}.", ""]


def _evalsim(run_dir: str, figs: _Figures, prefix: str) -> list[str]:
    path = os.path.join(run_dir, "evalsim.json")
    e = read_json(path)
    sections = [k for k in ("usi", "fidelity", "turing", "style", "soul") if k in e]
    if not sections:
        raise EnvError(f"{path}: none of the sections usi, fidelity, turing, style, soul")
    lines = [f"## `{run_dir}`: simulator evaluation of `{e.get('simulator', '?')}`", ""]
    if "usi" in e:
        lines += _usi(_need(e, "usi", path, dict), f"{path}: usi", figs, prefix)
    if "fidelity" in e:
        f, w = _need(e, "fidelity", path, dict), f"{path}: fidelity"
        dims = _need(f, "dimensions", w, dict)
        cases = f" over {_need(f, 'n_cases', w, int)} valid cases" if "n_cases" in f else ""
        lines += ["### RealUserSim PT3 fidelity index (Eq 14)", ""]
        lines += _table(["dimension", "score"], [[d, _num(v, f"{w}.dimensions.{d}")] for d, v in dims.items()])
        lines += ["", f"FI {fmt(_num(_need(f, 'fi', w), f'{w}.fi', True))}{cases}.", ""]
        lines += _invalid_note(f, w, "cases")
    if "turing" in e:
        t, w = _need(e, "turing", path, dict), f"{path}: turing"
        lines += ["### SimulatorArena Turing test", "",
                  f"Judge accuracy a = {fmt(_num(_need(t, 'a', w), f'{w}.a', True))}% over "
                  f"{_need(t, 'n_pairs', w, int)} pairs; Turing distance |a - 50| = "
                  f"{fmt(_num(_need(t, 'distance', w), f'{w}.distance', True))} (lower is better).", ""]
        lines += _invalid_note(t, w, "pairs")
    if "style" in e:
        st, w = _need(e, "style", path, dict), f"{path}: style"
        lines += ["### SimulatorArena style similarity (1-5, higher is better)", ""]
        lines += _table(["style", "score"], [[k, _num(_need(st, k, w), f"{w}.{k}", True)]
                                             for k in ("writing", "interaction")]) + [""]
        lines += _invalid_note(st, w, "pairs")
    if "soul" in e:
        lines += _soul(_need(e, "soul", path, dict), f"{path}: soul")
    return lines


def _usi(u: dict, w: str, figs: _Figures, prefix: str) -> list[str]:
    rows = []
    for name, f in _need(u, "features", w, dict).items():
        rows.append([name] + [_num(_need(f, k, f"{w}.features.{name}"), f"{w}.features.{name}.{k}")
                              for k in ("sim", "human", "dice")])
    lines = ["### tau-bench User-Sim Index", "", "Per feature: simulator and human statistic, Dice (Eq 15).", ""]
    lines += _table(["feature", "simulator", "human", "Dice"], rows) + [""]
    dims = _need(u, "dimensions", w, dict)
    lines += _table(["dimension", "score"], [[d, _num(_need(dims, d, f"{w}.dimensions"), f"{w}.dimensions.{d}")]
                                             for d in ("D1", "D2", "D3", "D4")]) + [""]
    ece = _num(_need(u, "ece", w), f"{w}.ece", True)
    usi5 = _num(_need(u, "usi5", w), f"{w}.usi5", True)
    lines += [f"ECE {fmt(ece)} (lower is better); USI5 {fmt(usi5)} (Eq 16).", ""]
    brows, pts = [], []
    for i, b in enumerate(_need(u, "ece_bins", w, list)):
        wb = f"{w}.ece_bins[{i}]"
        lo, hi = _num(_need(b, "lo", wb), f"{wb}.lo"), _num(_need(b, "hi", wb), f"{wb}.hi")
        n = _need(b, "n", wb, int)
        sr = _num(_need(b, "sim_rate", wb), f"{wb}.sim_rate", True)
        hr = _num(_need(b, "human_rate", wb), f"{wb}.human_rate", True)
        brows.append([f"[{fmt(lo)}, {fmt(hi)})", n, sr, hr])
        if n and sr is not None and hr is not None:
            pts.append((hr, sr, n, f"[{lo:g}, {hi:g})"))
    lines += ["ECE bins (task difficulty = pooled success rate of reference simulators):", ""]
    lines += _table(["difficulty", "tasks", "simulated success", "human success"], brows) + [""]
    fig, ax = figs.plt.subplots(figsize=(4.6, 4.4))
    ax.plot([0, 1], [0, 1], color="grey", lw=1, ls="--", label="perfect calibration")
    if pts:
        total = sum(p[2] for p in pts)
        ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=[30 + 400 * p[2] / total for p in pts], zorder=3,
                   label="difficulty bin (size ~ tasks)")
        for hr, sr, _, lab in pts:
            ax.annotate(lab, (hr, sr), textcoords="offset points", xytext=(6, -10), fontsize=7)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel("human success rate")
    ax.set_ylabel("simulated success rate")
    ax.set_title(f"Reliability diagram (ECE {fmt(ece)})", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    png = figs.save(fig, f"{prefix}-reliability.png")
    return lines + [f"![reliability diagram]({png})", ""]


def _soul(so: dict, w: str) -> list[str]:
    rows = []
    for task, v in _need(so, "tasks", w, dict).items():
        wt = f"{w}.tasks.{task}"
        seeds = [_num(x, f"{wt}.seeds[{k}]", True) for k, x in enumerate(_need(v, "seeds", wt, list))]
        rows.append([task, _num(_need(v, "mean", wt), f"{wt}.mean", True), _num(_need(v, "se", wt), f"{wt}.se", True),
                     ", ".join(fmt(x) for x in seeds)])
    lines = ["### SOUL-Index (mean " + PM + " SE over evaluation seeds)", ""]
    lines += _table(["task", "mean", "SE", "per seed"], rows) + [""]
    axes = _need(so, "axes", w, dict)
    lines += _table(["axis", "mean", "SE"], [[a, _num(_need(v, "mean", f"{w}.axes.{a}"), f"{w}.axes.{a}.mean"),
                                              _num(_need(v, "se", f"{w}.axes.{a}"), f"{w}.axes.{a}.se")]
                                             for a, v in axes.items()]) + [""]
    idx = _need(so, "index", w)
    if idx is None:
        lines += ["SOUL-Index: not computed (no task has a score for every seed).", ""]
    else:
        wi = f"{w}.index"
        mean, se = _num(_need(idx, "mean", wi), f"{wi}.mean"), _num(_need(idx, "se", wi), f"{wi}.se")
        lines += [f"SOUL-Index {_pm(mean, se)} (mean over tasks).", ""]
    excluded = so.get("excluded_tasks") or []
    if excluded:
        lines += [f"Left out of the axes and the index (a seed without a valid rollout): {', '.join(excluded)}.", ""]
    return lines


def _ablation(run_dir: str, figs: _Figures, prefix: str) -> list[str]:
    path = os.path.join(run_dir, "ablation.json")
    a = read_json(path)
    name = _need(a, "matrix", path, str)
    switches = _need(a, "switches", path, list)
    cells = _need(a, "cells", path, list)
    rows, finals, curves = [], [], {}
    for i, c in enumerate(cells):
        w = f"{path}: cells[{i}]"
        cname = _need(c, "name", w, str)
        settings = _need(c, "settings", w, dict)
        workdirs = _need(c, "workdirs", w, dict)
        final = _need(c, "final", w, dict)
        status = c.get("status", "done" if final else "not run")
        if c.get("error"):
            status = f"failed: {c['error']}"
        finals.append((cname, final))
        rows.append((cname, [str(settings.get(s, DASH)) for s in switches], status, final))
        if final and workdirs:
            last_dir = list(workdirs.values())[-1]
            curves[cname] = read_metrics(os.path.join(last_dir, "metrics.jsonl"))
    headline = [k for k in ABLATION_HEADLINE if any(k in f for _, f in finals)]
    lines = [f"## `{run_dir}`: ablation `{name}`", "",
             f"{len(cells)} cells over switches {', '.join(switches) or '(none)'}; final metrics = the last "
             "metrics.jsonl record of each cell's last stage, plus reward_mean_last3 (mean of the last 3 "
             "reward_mean values).", ""]
    lines += _table(["cell"] + switches + ["status", "step"] + headline,
                    [[n] + s + [st, f.get("step")] + [f.get(k) for k in headline] for n, s, st, f in rows]) + [""]
    keys = list(dict.fromkeys(k for _, f in finals for k in f if k != "step"))
    if keys:
        lines += ["### All final metrics", ""]
        lines += _table(["metric"] + [n for n, _ in finals], [[k] + [f.get(k) for _, f in finals] for k in keys])
        lines += [""]
    metric = "reward_mean" if any("reward_mean" in r for rs in curves.values() for r in rs) else "loss"
    series = {n: _series(rs, metric) for n, rs in curves.items()}
    series = {n: v for n, v in series.items() if v[0]}
    if series:
        png = figs.curves(f"{prefix}-{metric}.png", f"{name}: {metric} of each cell's last stage", metric, series)
        lines += [f"![{name} {metric}]({png})", ""]
    return lines


SECTIONS = {"training": _training, "evalagent": _evalagent, "evalsim": _evalsim, "ablation": _ablation}


def write_report(run_dirs: list[str], out: str) -> str:
    """Writes OUT/report.md and its PNGs for `run_dirs`; returns the report's path. EnvError on bad input."""
    if not run_dirs:
        raise EnvError("report: no result folders given")
    kinds = [kind_of(d) for d in run_dirs]  # every folder is checked before anything is written
    os.makedirs(out, exist_ok=True)
    figs = _Figures(out)
    lines = ["# Report", ""]
    for i, (d, k) in enumerate(zip(run_dirs, kinds), 1):
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", os.path.basename(os.path.normpath(os.path.abspath(d)))) or "run"
        lines += SECTIONS[k](d, figs, f"{i:02d}-{slug}")
    path = os.path.join(out, "report.md")
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip() + "\n")
    return path


# ------------------------------------------------------------------------------------------ command
def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR",
                   help="training workdirs, evalagent / evalsim output folders, ablation folders")
    p.add_argument("--out", default=None, help="where report.md and the PNGs go (default: the RUN_DIR, when one)")
    return p


def run(args) -> int:
    out = args.out
    if out is None:
        if len(args.run_dirs) != 1:
            print("error: --out is required with more than one RUN_DIR", file=sys.stderr)
            return 2
        out = args.run_dirs[0]
    try:
        path = write_report(args.run_dirs, out)
    except EnvError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"report: {path}")
    return 0
