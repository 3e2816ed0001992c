"""Asynchronous Stage II on two jax.distributed processes of 4 fake CPU devices each (issue #44 items 3 and 8):
the tiny GRPO loop with rl.max_staleness=1 under the fixed lag (rl.async_deterministic=true), with a rollout pool
of each process's last 2 devices (rollout.devices=2) and on shared devices (rollout.devices=0).

With the pool every update reads and writes parameters on the first 2 devices of each process only (the training
mesh spans those 4 of the 8) and takes no device lock, and every sampler call of a process runs on its own last 2
devices with parameters there: the weight copy at the start and after each update (train/rl/distributed.py
`_to_pool`) goes from the process's training devices to its pool, each of its training shards equal to that part
of the pool's copy. The staleness histogram counts the trained tokens of both processes (a count of the tokens'
versions in each process's rollouts), and both processes compute the same records; a checkpoint after every step
runs beside the rollouts. Both runs log staleness 0 at step 1 and exactly 1 after it, and the same records:
the pool changes where programs run, not what they compute (fp32-summation tolerance: the update's batch is split
4 ways instead of 8), except the padding and the timings. One process pair runs both, one after the other.

Both run with early updates (rl.async_early_updates, the default): each process rolls its own share of every part
(task i on process i % 2, one group each per step here) and each mini-batch's update runs once both have their
share: one update per mini-batch on each process.
"""

import json
import os

import pytest

from helpers import run_two_processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 3
POOL = 2  # rollout.devices: each process's last 2 of its 4 devices sample
UPDATES = 2  # updates per step: 2 prompts, one per mini-batch (tests/helpers.py tiny_grpo_config)

# a process of the pair: the tiny GRPO loop (tests/helpers.py run_tiny_grpo) with argv[3] = [workdir, steps, sets],
# spies on the update's parameters, the sampler's parameters and mesh and the weight copies into the pool (device
# ids: this process's); its records, what the spies saw and its tokens per version written to argv[4] as JSON
WORKER = r"""
import json, sys
import jax
jax.distributed.initialize(sys.argv[1], num_processes=2, process_id=int(sys.argv[2]))
sys.path.insert(0, "tests")
from helpers import run_tiny_grpo
from mimesis_jax.inference import sampler as sampler_lib
from mimesis_jax.train.rl import distributed, learner as L
import numpy as np

seen = {"update": [], "sample": [], "copies": []}
real_updates, real_generate = L.ppo_updates, sampler_lib.generate
ids = lambda tree: sorted({d.id for x in jax.tree.leaves(tree) for d in x.devices()
                           if d.process_index == jax.process_index()})

def updates(run, chunks, **kw):
    before = ids(run.state["params"])
    state, ms = real_updates(run, chunks, **kw)
    seen["update"].append([before, ids(state["params"]), kw["lock"] is not None])
    return state, ms

def generate(config, params, prompts, **kw):
    seen["sample"].append([ids(params), sorted(d.id for d in kw["mesh"].devices.flat)])
    return real_generate(config, params, prompts, **kw)

def to_pool(config, params, mesh, rollout, engine=False):
    # the copy against the training arrays: each of this process's training shards equals that part of every
    # pool device's copy (tensor 1: each pool device holds the whole array)
    out = real_to_pool(config, params, mesh, rollout, engine)
    equal = all(np.array_equal(np.asarray(s.data), np.asarray(c.data)[s.index])
                for x, y in zip(jax.tree.leaves(params), jax.tree.leaves(out))
                for s in x.addressable_shards for c in y.addressable_shards)
    seen["copies"].append([equal, ids(out), ids(params)])
    return out

real_to_pool = distributed._to_pool
L.ppo_updates, sampler_lib.generate, distributed._to_pool = updates, generate, to_pool
steps, runs = json.loads(sys.argv[3])
out = []
for workdir, sets in runs:  # one run after the other in this process pair
    for v in seen.values():
        v.clear()
    res, trained = run_tiny_grpo(workdir, steps, *sets)
    # this process's agent tokens per version, per step (every dialogue is kept in these runs: invalid 0, skipped 0)
    tokens = {str(step): {} for step in trained}
    groups = {str(step): sorted({t.group_id for t in trajs}) for step, trajs in trained.items()}
    for step, trajs in trained.items():
        for t in trajs:
            for s in t.segments:
                if s.kind == "agent" and s.tokens:
                    tokens[str(step)][str(s.version)] = tokens[str(step)].get(str(s.version), 0) + len(s.tokens)
    out.append({"metrics": {str(k): v for k, v in res.metrics.items()}, "seen": json.loads(json.dumps(seen)),
                "tokens": tokens, "groups": groups, "local": [d.id for d in jax.local_devices()]})
with open(sys.argv[4], "w") as f:
    json.dump(out, f)
"""

TIMING = ("rollout_s", "coach_s", "train_s", "rollout_tokens_per_s", "train_tokens_per_s", "step_s",
          "rollout_wait_s", "groups_in_flight", "pool_busy/train", "pool_busy/rollout")


def _untimed(rec: dict) -> dict:
    return {k: v for k, v in rec.items() if k not in TIMING and not k.startswith("compilations")
            and k != "num_compilations"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{rollout.devices: [process 0's result, process 1's]} of one process pair running the pool run, then the
    shared-devices run."""
    tmp = tmp_path_factory.mktemp("async2")
    base = ["rl.max_staleness=1", "rl.async_deterministic=true", "checkpoint.every=1"]
    plan = [[str(tmp / f"devices{d}"), base + [f"rollout.devices={d}"]] for d in (POOL, 0)]
    outs = run_two_processes(WORKER, json.dumps([STEPS, plan]), tmp, ROOT, timeout=900)
    got = []
    for path in outs:
        with open(path) as f:
            got.append(json.load(f))
    return {d: [got[0][i], got[1][i]] for i, d in enumerate((POOL, 0))}


def test_two_processes_train_on_their_first_devices_and_sample_on_their_pool(runs):
    pooled = runs[POOL]
    for p, got in enumerate(pooled):
        local = got["local"]
        train, pool = sorted(local[:-POOL]), sorted(local[-POOL:])
        # early updates (rl.async_early_updates, on by default): one update per mini-batch, each as soon as every
        # process has its share of the mini-batch's groups; each process samples its own share of every step (task
        # i on process i % 2: here one group each) on its own pool, whatever part the task is rolled in
        assert len(got["seen"]["update"]) == STEPS * UPDATES and len(got["seen"]["sample"]) >= STEPS
        assert all(before == after == train and not locked for before, after, locked in got["seen"]["update"])
        assert all(params == mesh == pool for params, mesh in got["seen"]["sample"])
        for step in range(1, STEPS + 1):
            assert got["groups"][str(step)] == [(step - 1) * 2 + p]
            assert sum(got["tokens"][str(step)].values()) > 0
        # the first weights and each step's but the last: copied from this process's training devices into its
        # pool, equal (under the fixed lag early updates defer each version until the steps it waits for have all
        # their parts, learner.publish_due; the last step's version is not published, no step samples it)
        assert len(got["seen"]["copies"]) == STEPS
        assert all(equal and to == pool and src == train for equal, to, src in got["seen"]["copies"])
        for step in range(1, STEPS + 1):
            rec = got["metrics"][str(step)]
            assert rec["staleness_max"] == min(1, step - 1) == rec["staleness_mean"]
            assert rec["invalid"] == 0 == rec["skipped_groups"]
    for step in range(1, STEPS + 1):  # the histogram counts the tokens of both processes, at version step - 2
        want = sum(c for got in pooled for v, c in got["tokens"][str(step)].items() if int(v) == max(0, step - 2))
        assert want == sum(c for got in pooled for c in got["tokens"][str(step)].values())
        assert pooled[0]["metrics"][str(step)][f"staleness_hist/{min(1, step - 1)}"] == want > 0
    same = [{s: _untimed(r) for s, r in got["metrics"].items()} for got in pooled]
    assert same[0] == same[1]  # every process computes the same records (process 0 logs them)


def test_a_pool_on_two_processes_changes_where_programs_run_not_what_they_compute(runs):
    pooled, shared = runs[POOL], runs[0]
    for step in range(1, STEPS + 1):
        a, b = pooled[0]["metrics"][str(step)], shared[0]["metrics"][str(step)]
        assert set(a) == set(b)
        for k in _untimed(a):  # compilations: the second run finds some programs compiled in the same process
            if not k.startswith("pad/"):
                assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (step, k)
    for p, got in enumerate(shared):  # shared devices: the updates hold the device lock, the samples run on every
        # local device; early updates there too: each process samples its own group of every step
        assert len(got["seen"]["update"]) == STEPS * UPDATES and len(got["seen"]["sample"]) >= STEPS
        assert all(got["groups"][str(step)] == [(step - 1) * 2 + p] for step in range(1, STEPS + 1))
        assert all(locked for _, _, locked in got["seen"]["update"])
        assert all(mesh == sorted(got["local"]) for _, mesh in got["seen"]["sample"])
