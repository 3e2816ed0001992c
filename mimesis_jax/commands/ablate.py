"""`python -m mimesis_jax ablate --matrix configs/ablations/<name>.py --out DIR [--set ...] [--dry-run]`

Runs a grid of training runs that differ in named switches (docs/reference/paper.md §6, Appendix C: mid-training, ThoughtTrace
SFT and the behaviour task on/off; Stage II: alpha and beta of CSD, Eq 9-11, the coach, the turn-credit method) and
tabulates their final metrics in ``DIR/ablation.json`` and ``DIR/report.md`` (`mimesis_jax.commands.report`).

    python -m mimesis_jax ablate --matrix configs/ablations/tiny_agent_csd.py --out runs/abl --dry-run
    python -m mimesis_jax ablate --matrix configs/ablations/tiny_stage1.py --out runs/abl1 --set simrl:train.steps=2

The matrix file
---------------
A Python file defining ``get_matrix()`` that returns a dict:

    {"name": "tiny_agent_csd",                      # optional; default: the file name
     "stages": [("midtrain", "configs/tiny_midtrain.py"), ("sft", "configs/tiny_sft.py"),
                ("simrl", "configs/tiny_simrl.py")],  # run in this order (a subsequence of STAGE_ORDER)
     "overrides": [("simrl", "train.steps=3")],     # optional: --set items of one stage, in every cell
     "switches": {                                   # switch name -> {value label: [action, ...]}
         "midtrain": {"on": [], "off": [("midtrain", "off")]},
         "behaviour": {"on": [("simrl", "domains.behaviour=true")],
                       "off": [("simrl", "domains.behaviour=false")]}},
     "cells": [{"midtrain": "on", "behaviour": "off"}, ...]}   # optional; default: the product of the values

An action is ``(stage, "key=value")``, a ``--set`` override of that stage's config, or ``(stage, "off")``, which
removes the stage from the cell. Value labels are strings. Config paths are relative to the repository root (or
absolute). A cell is named ``switch=value,...`` in switch order (``base`` when there are no switches).

Each stage's overrides, applied in this order: the matrix's ``overrides``, the switch actions (in switch order),
the command line's ``--set`` items (``key=value`` for every stage, ``stage:key=value`` for one), and last the
chain: a stage after another gets the previous stage's workdir -- ``init.from_workdir=<dir>`` (with
``init.from_hf=`` cleared) for midtrain / sft / simrl, ``users.simulator=<dir>`` for agentrl (the trained simulator
is the user; the coach defaults to it) -- and overrides of those keys from the matrix or ``--set`` are dropped. The
first stage of a cell keeps its config's initialisation as the matrix and ``--set`` leave it (a switch that turns
off the stages before it sets where it starts, e.g. the pretrained checkpoint).

Workdirs: ``DIR/stages/<stage>-<hash>``, the hash covering the stage's config and overrides and those of every
stage before it. Cells that share a prefix of identical stages share their workdirs (the runs are made once), and a
stage whose workdir already holds a checkpoint at its ``train.steps`` is not rerun, so an interrupted grid resumes
where it stopped (an unfinished stage resumes from its last checkpoint). Stages run in this process through the
stage functions (`train.midtrain.run`, `train.sft.run`, `train.rl.simulator.run`, `train.rl.agent.run`).

A cell's final metrics: the last metrics.jsonl record of its last stage plus ``reward_mean_last3``, the mean of the
last 3 ``reward_mean`` values (when the stage logs rewards). ``ablation.json`` (rewritten after every cell):
{"matrix", "matrix_file", "switches", "cells": [{"name", "settings", "workdirs": {stage: dir}, "overrides":
{stage: [...]}, "status": done | failed | pending, "error" (failed only), "final": {metric: value}}]}.

``--dry-run`` prints every cell's stages as the equivalent ``python -m mimesis_jax <stage>`` commands, after loading
each stage config with its overrides (so a bad key fails here), and runs nothing. Exit status: 0 when every cell
finished (or the grid stopped on SIGTERM: rerun the same command to resume), 1 when a stage stopped on a non-finite
loss or ran out of data (its cells are marked failed, the others still run), 2 for a bad matrix, override or config
(the message names the file, switch, stage or key).
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import itertools
import json
import math
import os
import shlex
import sys
from typing import Any

from mimesis_jax.checkpoints import CheckpointError, Checkpointer, checkpoint_dir
from mimesis_jax.config import load_config, split_variant
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.commands.report import as_number, read_metrics, write_report
from mimesis_jax.errors import ConfigError
from mimesis_jax.train import midtrain, sft
from mimesis_jax.train.loop import DataExhaustedError, NonFiniteLossError
from mimesis_jax.train.rl import agent as agent_stage, simulator as simulator_stage

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGE_ORDER = ("midtrain", "sft", "simrl", "agentrl")
OFF = "off"
MATRIX_KEYS = ("name", "stages", "overrides", "switches", "cells")


# ------------------------------------------------------------------------------------------ matrix
@dataclasses.dataclass(frozen=True)
class Matrix:
    name: str
    path: str
    stages: tuple[tuple[str, str], ...]  # (stage, config path as written)
    overrides: tuple[tuple[str, str], ...]
    switches: dict[str, dict[str, tuple[tuple[str, str], ...]]]
    cells: tuple[dict[str, str], ...]  # the settings of each cell, in order


@dataclasses.dataclass(frozen=True)
class StageRun:
    stage: str
    config: str  # as written in the matrix
    overrides: tuple[str, ...]  # everything passed to the stage's config loader, chain included
    workdir: str

    @property
    def config_path(self) -> str:
        return self.config if os.path.isabs(self.config) else os.path.join(REPO_ROOT, self.config)

    def command(self) -> str:
        """The equivalent command line."""
        cmd = ["python", "-m", "mimesis_jax", self.stage, "--config", self.config, "--workdir", self.workdir]
        return shlex.join(cmd + (["--set", *self.overrides] if self.overrides else []))


@dataclasses.dataclass(frozen=True)
class Cell:
    name: str
    settings: dict[str, str]
    stages: tuple[StageRun, ...]


def _pairs(obj, where: str, stages: tuple[str, ...], allow_off: bool) -> tuple[tuple[str, str], ...]:
    if not isinstance(obj, (list, tuple)):
        raise ConfigError(f"{where}: expected a list of (stage, override) pairs, got {obj!r}")
    out = []
    for i, p in enumerate(obj):
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)):
            raise ConfigError(f"{where}[{i}]: expected a (stage, \"key=value\") pair of strings, got {p!r}")
        stage, action = p
        if stage not in stages:
            raise ConfigError(f"{where}[{i}]: unknown stage '{stage}' (the matrix's stages: {', '.join(stages)})")
        if not ("=" in action or (allow_off and action == OFF)):
            raise ConfigError(f"{where}[{i}]: '{action}' is neither a key=value override"
                              + (f" nor '{OFF}'" if allow_off else ""))
        out.append((stage, action))
    return tuple(out)


def load_matrix(path: str) -> Matrix:
    """Imports and checks a matrix file (module docstring); ConfigError naming the file and the bad part."""
    if not os.path.isfile(path):
        raise ConfigError(f"--matrix {path}: no such file")
    spec = importlib.util.spec_from_file_location(f"_mimesis_matrix_{abs(hash(path))}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not callable(getattr(module, "get_matrix", None)):
        raise ConfigError(f"matrix {path}: must define get_matrix() returning the matrix dict")
    m = module.get_matrix()
    where = f"matrix {path}"
    if not isinstance(m, dict):
        raise ConfigError(f"{where}: get_matrix() must return a dict, got {type(m).__name__}")
    unknown = sorted(set(m) - set(MATRIX_KEYS))
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; a matrix has {list(MATRIX_KEYS)}")
    name = m.get("name", os.path.splitext(os.path.basename(path))[0])
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: 'name' must be a non-empty string, got {name!r}")
    raw = m.get("stages")
    if not isinstance(raw, (list, tuple)) or not raw:
        raise ConfigError(f"{where}: 'stages' must be a non-empty list of (stage, config path) pairs")
    stages = []
    for i, p in enumerate(raw):
        if not (isinstance(p, (list, tuple)) and len(p) == 2 and all(isinstance(x, str) for x in p)):
            raise ConfigError(f"{where}: stages[{i}] must be a (stage, config path) pair of strings, got {p!r}")
        if p[0] not in STAGE_ORDER:
            raise ConfigError(f"{where}: stages[{i}]: unknown stage '{p[0]}' (known: {', '.join(STAGE_ORDER)})")
        stages.append((p[0], p[1]))
    names = tuple(s for s, _ in stages)
    if list(names) != sorted(set(names), key=STAGE_ORDER.index):
        raise ConfigError(f"{where}: 'stages' {list(names)} must be distinct and in the order "
                          f"{', '.join(STAGE_ORDER)}")
    overrides = _pairs(m.get("overrides", ()), f"{where}: overrides", names, allow_off=False)
    sw = m.get("switches", {})
    if not isinstance(sw, dict):
        raise ConfigError(f"{where}: 'switches' must be a dict of switch name -> {{value: [actions]}}")
    switches = {}
    for s, values in sw.items():
        if not isinstance(s, str) or not s or any(c in s for c in ",="):
            raise ConfigError(f"{where}: switch name {s!r} must be a non-empty string without ',' or '='")
        if not isinstance(values, dict) or not values:
            raise ConfigError(f"{where}: switch '{s}' must map at least one value label to a list of actions")
        switches[s] = {}
        for v, actions in values.items():
            if not isinstance(v, str) or not v or any(c in v for c in ",="):
                raise ConfigError(f"{where}: switch '{s}': value label {v!r} must be a non-empty string without "
                                  "',' or '='")
            switches[s][v] = _pairs(actions, f"{where}: switch '{s}' value '{v}'", names, allow_off=True)
    raw_cells = m.get("cells")
    if raw_cells is None:
        cells = tuple(dict(zip(switches, combo)) for combo in itertools.product(*(list(v) for v in
                                                                                   switches.values())))
    else:
        if not isinstance(raw_cells, (list, tuple)) or not raw_cells:
            raise ConfigError(f"{where}: 'cells' must be a non-empty list of {{switch: value}} dicts")
        cells = []
        for i, c in enumerate(raw_cells):
            if not isinstance(c, dict):
                raise ConfigError(f"{where}: cells[{i}] must be a {{switch: value}} dict, got {c!r}")
            for s in c:
                if s not in switches:
                    raise ConfigError(f"{where}: cells[{i}]: unknown switch '{s}' (switches: "
                                      f"{', '.join(switches) or 'none'})")
            for s in switches:
                if s not in c:
                    raise ConfigError(f"{where}: cells[{i}]: no value for switch '{s}'")
                if c[s] not in switches[s]:
                    raise ConfigError(f"{where}: cells[{i}]: switch '{s}' has no value {c[s]!r} (values: "
                                      f"{', '.join(switches[s])})")
            cells.append({s: c[s] for s in switches})
    cells = tuple(cells)
    seen = set()
    for c in cells:
        key = tuple(c.items())
        if key in seen:
            raise ConfigError(f"{where}: cell {_cell_name(c)} is listed twice")
        seen.add(key)
    return Matrix(name, path, tuple(stages), overrides, switches, cells)


def _cell_name(settings: dict[str, str]) -> str:
    return ",".join(f"{s}={v}" for s, v in settings.items()) or "base"


def _parse_sets(sets, stages: tuple[str, ...]) -> list[tuple[str | None, str]]:
    """--set items: key=value (every stage) or stage:key=value (one stage)."""
    out = []
    for item in sets:
        if "=" not in item:
            raise ConfigError(f"--set {item!r}: expected key=value or stage:key=value")
        key = item.split("=", 1)[0]
        if ":" in key:
            stage, rest = item.split(":", 1)
            if stage not in stages:
                raise ConfigError(f"--set {item!r}: unknown stage '{stage}' (the matrix's stages: "
                                  f"{', '.join(stages)})")
            out.append((stage, rest))
        else:
            out.append((None, item))
    return out


def chain_overrides(stage: str, previous_workdir: str) -> list[str]:
    """What a stage gets from the stage before it (module docstring)."""
    if stage == "agentrl":
        return [f"users.simulator={previous_workdir}"]
    return ["init.from_hf=", f"init.from_workdir={previous_workdir}"]


def plan(matrix: Matrix, out: str, sets=()) -> list[Cell]:
    """The cells of `matrix` with each stage's exact overrides and workdir under `out` (nothing is run)."""
    names = tuple(s for s, _ in matrix.stages)
    cli = _parse_sets(sets, names)
    root = os.path.join(os.path.abspath(out), "stages")
    cells = []
    for settings in matrix.cells:
        actions = [a for s, v in settings.items() for a in matrix.switches[s][v]]
        off = {stage for stage, a in actions if a == OFF}
        active = [(s, c) for s, c in matrix.stages if s not in off]
        name = _cell_name(settings)
        if not active:
            raise ConfigError(f"matrix {matrix.path}: cell {name} turns off every stage")
        runs, identity, prev = [], [], None
        for stage, config in active:
            own = ([a for s, a in matrix.overrides if s == stage] + [a for s, a in actions if s == stage and a != OFF]
                   + [a for s, a in cli if s in (None, stage)])
            chain = chain_overrides(stage, prev) if prev else []
            chained = {c.split("=", 1)[0] for c in chain}
            own = [a for a in own if a.split("=", 1)[0].strip() not in chained]  # the chain replaces these
            identity.append([stage, config, own])
            digest = hashlib.sha1(json.dumps(identity).encode()).hexdigest()[:10]
            workdir = os.path.join(root, f"{stage}-{digest}")
            runs.append(StageRun(stage, config, tuple(own + chain), workdir))
            prev = workdir
        cells.append(Cell(name, dict(settings), tuple(runs)))
    return cells


# ------------------------------------------------------------------------------------------ running
def load_stage_config(run: StageRun):
    """The stage's config, loaded with its overrides by the stage's own loader (ConfigError names the key)."""
    if not os.path.isfile(split_variant(run.config_path)[0]):
        raise ConfigError(f"stage {run.stage}: config {run.config_path} does not exist")
    if run.stage in ("midtrain", "sft"):
        cfg = load_config(run.config_path, run.overrides)
        if cfg.stage != run.stage:
            raise ConfigError(f"stage {run.stage}: {run.config} is a '{cfg.stage}' config")
        return cfg
    if run.stage == "simrl":
        return simulator_stage.load(run.config_path, run.overrides)
    return agent_stage.load(run.config_path, run.overrides)


def finished(workdir: str, steps: int) -> bool:
    """Whether `workdir` holds a checkpoint at (or past) `steps`."""
    if not os.path.isdir(checkpoint_dir(workdir)):
        return False
    ckpt = Checkpointer(workdir, read_only=True)
    try:
        latest = ckpt.latest_step()
    finally:
        ckpt.close()
    return latest is not None and latest >= steps


def run_stage(run: StageRun, log=print) -> str | None:
    """Runs (or resumes) one stage in its workdir; a finished one is not rerun. Returns "preempted" when a SIGTERM
    stopped it, else None. NonFiniteLossError / DataExhaustedError propagate."""
    cfg = load_stage_config(run)
    if finished(run.workdir, cfg.train.steps):
        log(f"{run.stage}: {run.workdir} already has its checkpoint at train.steps={cfg.train.steps}; not rerun")
        return None
    if run.stage in ("midtrain", "sft"):
        res = {"midtrain": midtrain, "sft": sft}[run.stage].run(cfg, run.workdir)
    else:
        module = simulator_stage if run.stage == "simrl" else agent_stage
        res = module.run(cfg, run.workdir)
    return "preempted" if res.preempted else None


def final_metrics(workdir: str) -> dict[str, Any]:
    """The last metrics.jsonl record of a workdir, plus reward_mean_last3 (mean of the last 3 reward_mean values)."""
    recs = read_metrics(os.path.join(workdir, "metrics.jsonl"))
    final = dict(recs[-1])
    rewards = [as_number(r["reward_mean"]) for r in recs if "reward_mean" in r]
    rewards = [r for r in rewards if r is not None]
    if rewards:
        v = sum(rewards[-3:]) / len(rewards[-3:])
        final["reward_mean_last3"] = v if math.isfinite(v) else str(v)
    return final


def _entry(cell: Cell, status: str, final: dict, error: str | None = None) -> dict:
    e = {"name": cell.name, "settings": cell.settings, "workdirs": {r.stage: r.workdir for r in cell.stages},
         "overrides": {r.stage: list(r.overrides) for r in cell.stages}, "status": status, "final": final}
    if error is not None:
        e["error"] = error
    return e


def _write_json(path: str, obj: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
    os.replace(tmp, path)


def run_grid(matrix: Matrix, cells: list[Cell], out: str, log=print) -> tuple[dict, bool]:
    """Runs every cell (stages shared between cells run once), rewriting OUT/ablation.json after each cell.
    Returns (the ablation dict, whether a SIGTERM stopped the grid)."""
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "ablation.json")
    entries = [_entry(c, "pending", {}) for c in cells]
    doc = {"matrix": matrix.name, "matrix_file": os.path.abspath(matrix.path), "switches": list(matrix.switches),
           "cells": entries}
    failures: dict[str, str] = {}  # workdir -> why its stage failed (cells sharing it fail without rerunning it)
    for i, cell in enumerate(cells):
        error = None
        for r in cell.stages:
            if r.workdir not in failures:
                log(f"=== cell {i + 1}/{len(cells)} {cell.name}: {r.stage} -> {r.workdir}")
                try:
                    if run_stage(r, log) == "preempted":
                        _write_json(path, doc)
                        return doc, True
                except (NonFiniteLossError, DataExhaustedError) as e:
                    failures[r.workdir] = f"{r.stage}: {e}"
            if r.workdir in failures:
                error = failures[r.workdir]
                break
        if error is None:
            entries[i] = _entry(cell, "done", final_metrics(cell.stages[-1].workdir))
        else:
            entries[i] = _entry(cell, "failed", {}, error)
        _write_json(path, doc)
    return doc, False


# ------------------------------------------------------------------------------------------ command
def add_args(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--matrix", required=True, help="configs/ablations/<name>.py defining get_matrix()")
    p.add_argument("--out", required=True, help="stage workdirs (OUT/stages/), ablation.json and report.md")
    p.add_argument("--set", dest="overrides", action="extend", nargs="+", default=[],
                   metavar="[STAGE:]KEY=VALUE", help="override a config value in every stage, or in one stage")
    p.add_argument("--dry-run", action="store_true", help="print the cells and their stage commands; run nothing")
    return p


def run(args, log=print) -> int:
    try:
        matrix = load_matrix(args.matrix)
        cells = plan(matrix, args.out, args.overrides)
        loaded = set()
        for c in cells:
            for r in c.stages:
                if r.workdir not in loaded:
                    load_stage_config(r)
                    loaded.add(r.workdir)
        if args.dry_run:
            log(f"matrix {matrix.name} ({matrix.path}): {len(cells)} cells over switches "
                f"{', '.join(matrix.switches) or '(none)'}; {len(loaded)} distinct stage runs")
            for i, c in enumerate(cells, 1):
                log(f"[{i}/{len(cells)}] {c.name}")
                for r in c.stages:
                    log(f"  {r.command()}")
            return 0
        doc, preempted = run_grid(matrix, cells, args.out, log)
        report = write_report([args.out], args.out)
    except (ConfigError, CheckpointError, EnvError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if preempted:
        log(f"ablate: stopped by a signal; rerun the same command to resume ({report})")
        return 0
    failed = [c["name"] for c in doc["cells"] if c["status"] == "failed"]
    log(f"ablate: {len(cells) - len(failed)}/{len(cells)} cells done: {os.path.join(args.out, 'ablation.json')}, "
        f"{report}")
    if failed:
        log(f"ablate: failed cells: {', '.join(failed)}")
        return 1
    return 0
