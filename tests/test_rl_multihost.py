"""Multi-host RL stages: each process packs its own share of a PPO mini-batch and the global batch is assembled
from process-local rows (train/rl/learner.py, algorithms/rl_batch.py `conform`, RLStep.place(process_local=True)).

* fast: the shares of 2 (or 3) emulated processes, conformed to their common layout and concatenated per
  micro-batch the way jax.make_array_from_process_local_data lays them out, give the loss, gradients and metric
  sums of packing every trajectory together (the one-process path) -- for the fused and naive CSD teachers and
  plain GRPO, token- and sequence-mean, with a process that holds no coached turn or no trajectory at all;
* slow: `agentrl` (GRPO + CSD, tiny config) as two jax.distributed processes of 4 CPU devices each, killed
  abruptly after step 1 and resumed, logs the per-step rewards of a one-process 8-device run and ends with its
  parameters (up to fp32 summation order).
"""

import os
import socket
import subprocess
import sys

import jax
import numpy as np
import pytest

from helpers import subprocess_env
from rl_helpers import random_batch, scaled_params, tiny_config, tree_rel_err
from mimesis_jax.algorithms import grpo, rl_batch
from mimesis_jax.train.rl.step import RLConfig, make_rl_step

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = tiny_config()
TURNS = (2, 5, 1, 3, 4, 2, 3, 1)


def _global_from_shares(shares, rl, loss_agg, rows_multiple):
    """What RLStep.place(process_local=True) builds on P processes: per micro-batch, process 0's rows, then 1's."""
    teacher = rl.teacher if rl.alpha > 0 else "none"
    packs = []
    for trajs in shares:
        if not trajs:
            packs.append(None)
            continue
        adv = grpo.trajectory_turn_advantages(trajs)
        packs.append(rl_batch.pack_trajectories(trajs, adv, teacher=teacher, loss_agg=loss_agg,
                                                rows_multiple=rows_multiple, pad_multiple=16))
    layout = rl_batch.common_layout([rl_batch.layout_info(p) for p in packs], rows_multiple)
    local = [rl_batch.split_microbatches(rl_batch.conform(p, layout, loss_agg), rl.num_microbatches) for p in packs]
    out = {k: np.concatenate([x[k] for x in local], axis=1) for k in local[0]}
    # each process lists its LM-head positions per head group of its own device's rows; the step here runs on one
    # device, whose head group is a whole micro-batch (every process's rows): relist them for it
    M, B = out["tokens"].shape[:2]
    flat = rl_batch.regroup_heads({k: v.reshape((M * B,) + v.shape[2:]) for k, v in out.items()}, B)
    return {k: v.reshape((M, B) + v.shape[1:]) for k, v in flat.items()}


@pytest.mark.parametrize("teacher,loss_agg,split", [
    ("fused", "seq-mean", "three_one_empty"), ("fused", "token-mean", "uncoached_share"),
    pytest.param("naive", "token-mean", "two", marks=pytest.mark.slow),
    pytest.param("none", "seq-mean", "two", marks=pytest.mark.slow),
])
def test_process_shares_assemble_the_one_process_batch(teacher, loss_agg, split):
    trajs = random_batch(5, CFG.vocab_size, TURNS)
    for i, t in enumerate(trajs):
        t.group_id = i // 2  # groups of two, whole on one process
    if split == "uncoached_share":  # process 1's dialogues have no coach note: it packs no teacher layout
        for t in trajs[4:]:
            t.segments = [s for s in t.segments if s.kind != "coach"]
    groups = [trajs[i:i + 2] for i in range(0, len(trajs), 2)]
    if split == "three_one_empty":  # groups 0, 2 on process 0; 1, 3 on process 2; process 1 has none
        shares = [groups[0] + groups[2], [], groups[1] + groups[3]]
    else:
        shares = [groups[0] + groups[1], groups[2] + groups[3]]
    rl = RLConfig(alpha=0.0 if teacher == "none" else 0.5, teacher="fused" if teacher == "none" else teacher,
                  loss_agg=loss_agg, num_microbatches=2)
    step = make_rl_step(CFG, None, None, rl)
    multi = _global_from_shares(shares, rl, loss_agg, rows_multiple=2)

    adv = grpo.trajectory_turn_advantages(trajs)  # the one-process path: every trajectory packed together
    whole = rl_batch.pack_trajectories(trajs, adv, teacher=teacher if teacher != "none" else "none",
                                       loss_agg=loss_agg, rows_multiple=2, pad_multiple=16)
    assert whole.num_rows < multi["tokens"].shape[0] * multi["tokens"].shape[1]  # the layouts really differ
    params = scaled_params(CFG)
    loss_m, grads_m, sums_m = step.loss_and_grads(params, step.place(multi))
    loss_w, grads_w, sums_w = step.loss_and_grads(params, step.place(whole))
    assert abs(float(loss_m) - float(loss_w)) <= 1e-5 * max(1.0, abs(float(loss_w)))
    assert tree_rel_err(grads_m, grads_w) < 1e-4
    for k in ("agent", "coached", "clipped"):
        assert float(sums_m[k]) == float(sums_w[k]), k
    if teacher != "none":
        assert float(sums_w["coached"]) > 0 and abs(float(sums_m["csd_loss"]) - float(sums_w["csd_loss"])) <= 1e-5
    # the normalisers are global: the token weights of all processes sum to one (Eq 6 / Eq 10's means)
    assert abs(float(multi["grpo_weight"].sum()) - 1.0) < 1e-5
    if teacher != "none":
        assert abs(float(multi["csd_weight"].sum()) - 1.0) < 1e-5


def test_common_layout_refuses_mixed_teachers_and_empty_minibatches():
    trajs = random_batch(1, CFG.vocab_size, (2, 3))
    fused = rl_batch.layout_info(rl_batch.pack_trajectories(trajs, teacher="fused", pad_multiple=16))
    naive = rl_batch.layout_info(rl_batch.pack_trajectories(trajs, teacher="naive", pad_multiple=16))
    with pytest.raises(ValueError, match="different teacher layouts"):
        rl_batch.common_layout([fused, naive])
    with pytest.raises(ValueError, match="no process has trajectories"):
        rl_batch.common_layout([rl_batch.layout_info(None)] * 2)


def test_common_layout_takes_a_program_the_ladder_lists():
    """Two processes packed to two programs of one ladder (head 64 with the 1/4 branch head, head 32 with the
    whole one): the field-wise largest shapes (head 64, branch head 32) are no program of it, so the common layout
    is the cheapest listed one holding both; without the ladder, the largest shapes."""
    ladder = rl_batch.ShapeLadder(64, (4,), (64,), (32, 64), (0.25, 1.0), pad_multiple=8)
    listed = ladder.programs()
    a, b = ladder.key(4, 64, 64, 0.25), ladder.key(4, 64, 32, 1.0)
    assert a in listed and b in listed and (a[2], a[4], b[2], b[4]) == (64, 16, 32, 32)
    infos = [dict(rows=k[0], mode=1, n_agent=1, n_coached=1, n_seq=1, T=k[1], Ka=k[2], Tb=k[3], Kc=k[4])
             for k in (a, b)]

    def key(layout):
        return tuple(layout[f] for f in ("rows", "T", "Ka", "Tb", "Kc"))
    largest = tuple(max(x) for x in zip(a, b))
    assert key(rl_batch.common_layout(infos, 4)) == largest and largest not in listed
    got = key(rl_batch.common_layout(infos, 4, ladder))
    assert got == min((k for k in listed if all(x >= y for x, y in zip(k, largest))), key=listed.index)
    assert got == ladder.key(4, 64, 64, 1.0)


# ------------------------------------------------------------------------------------------ 2 processes
OVERRIDES = ["train.steps=2", "checkpoint.every=1", "checkpoint.keep=4", "rollout.prompts_per_step=4",
             "rollout.group_size=2", "rollout.mini_batch_prompts=2", "rollout.max_turns=1",
             "rollout.agent_max_tokens=12", "rollout.row_len=128", "train.progress_bar=False",
             "train.tensorboard=False",
             # Adam's update is m / (sqrt(v) + eps): with the default eps it divides each entry by its own gradient's
             # RMS, so entries whose gradient is ~0 turn fp32 summation noise into updates of ~lr and final weights
             # cannot be compared at summation tolerance. With eps far above every |g| the update is ~lr * m, linear
             # in the gradient, so two runs that differ only in summation order differ in their updates only by that
             # order's noise. The comparison checks the multi-process machinery, not Adam, so this is the setting.
             "optimizer.eps=10.0"]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_processes(workdir, abort_after=None, timeout=900):
    port = str(_free_port())
    env = subprocess_env(devices=4, PYTHONUNBUFFERED="1")
    env.pop("MIMESIS_ABORT_AFTER_STEP", None)
    if abort_after is not None:
        env["MIMESIS_ABORT_AFTER_STEP"] = str(abort_after)
    def cmd(i):
        return [sys.executable, "-m", "mimesis_jax", "agentrl", "--config",
                os.path.join(ROOT, "configs", "tiny_agentrl.py:csd"), "--workdir", str(workdir), "--distributed",
                "--coordinator", f"127.0.0.1:{port}", "--num-processes", "2", "--process-id", str(i),
                "--set", *OVERRIDES]
    procs = [subprocess.Popen(cmd(i), cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(2)]
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=timeout)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail("multi-process agent RL timed out")
    return [p.returncode for p in procs], outs


def _params_at(workdir, step):
    from mimesis_jax import config as config_lib, models
    from mimesis_jax.checkpoints import Checkpointer

    ck = Checkpointer(str(workdir), read_only=True)
    mc = config_lib.model_from_dict(ck.run_config()["model"])
    dev = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=dev), models.abstract_params(mc))
    params, got = ck.restore_params(step, target)
    ck.close()
    assert got == step
    return jax.tree.map(lambda x: np.asarray(x, np.float64), jax.device_get(params))


@pytest.mark.slow
def test_two_process_agent_rl_equals_one_process_and_resumes_after_a_kill(tmp_path):
    from mimesis_jax.train.rl import agent as agent_rl_loop
    from mimesis_jax.train.metrics import read_metrics

    multi = tmp_path / "multi"
    rcs, outs = _two_processes(multi, abort_after=1)  # killed (os._exit) right after step 1's checkpoint
    assert 75 in rcs and 0 not in rcs, (rcs, outs[0][-3000:] + outs[1][-3000:])
    rcs, outs = _two_processes(multi)  # the same command resumes from step 1
    assert rcs == [0, 0], outs[0][-3000:] + outs[1][-3000:]
    assert "resume:" in outs[0] and "from step 1" in outs[0], outs[0][-2000:]

    cfg = agent_rl_loop.load(os.path.join(ROOT, "configs", "tiny_agentrl.py:csd"), OVERRIDES)
    ref = agent_rl_loop.run(cfg, str(tmp_path / "single"), handle_signals=False, log=lambda *a, **k: None)
    assert ref.final_step == 2 and jax.device_count() == 8
    got = {r["step"]: r for r in read_metrics(str(multi))}
    assert sorted(got) == [1, 2]
    for s in (1, 2):
        want, rec = ref.metrics[s], got[s]
        for k in ("episodes", "invalid", "trained_groups", "updates", "coach_notes", "reward_mean",
                  "train_reward_mean", "turns_mean"):
            assert rec[k] == want[k], (s, k, rec[k], want[k])
        assert want["updates"] == 2 and want["coach_notes"] > 0
        for k in ("loss", "grpo_loss", "csd_loss", "entropy", "grad_norm"):
            assert abs(rec[k] - want[k]) <= 1e-4 * max(1.0, abs(want[k])), (s, k, rec[k], want[k])
    # Each run's step-1 weights and step-2 update (params at 2 minus params at 1), compared at fp32 summation
    # tolerance: 1e-4 of the leaf's largest update, plus the fp32 rounding of the weights the updates are added to
    # (a few ulps of the leaf's largest weight), so a real mismatch in any leaf's gradient shows.
    p1_m, p2_m = _params_at(multi, 1), _params_at(multi, 2)
    p1_r, p2_r = _params_at(tmp_path / "single", 1), _params_at(tmp_path / "single", 2)
    ulp = float(np.finfo(np.float32).eps)
    worst = 0.0
    for path, a1, a2, b1, b2 in zip([jax.tree_util.keystr(k) for k, _ in jax.tree_util.tree_leaves_with_path(p1_r)],
                                    jax.tree.leaves(p1_m), jax.tree.leaves(p2_m),
                                    jax.tree.leaves(p1_r), jax.tree.leaves(p2_r)):
        d_m, d_r = a2 - a1, b2 - b1
        tol = 1e-4 * np.abs(d_r).max() + 4 * ulp * np.abs(b2).max()
        gap = max(np.abs(d_m - d_r).max(), np.abs(a1 - b1).max())
        worst = max(worst, gap / tol)
        assert np.abs(d_r).max() > 0, path
        assert gap <= tol, (path, gap, tol)
    print(f"2 processes vs 1: largest gap {worst:.2f} of its tolerance; step losses "
          f"{[(got[s]['loss'], ref.metrics[s]['loss']) for s in (1, 2)]}")


@pytest.mark.parametrize("processes,m", [(2, 1), (3, 2)])
def test_a_step_cut_into_parts_is_shared_as_one_batch(monkeypatch, processes, m):
    """rl.async_early_updates rolls a step's 5 tasks in parts of m (learner.step_rollouts), each part's share taken
    from its first task's place in the step: task i still runs on process i % P, so every process rolls its own
    tasks of every part (before, each part was shared from 0 and process 0 rolled every part's first task)."""
    from mimesis_jax.train.rl import distributed

    n = 5
    monkeypatch.setattr(jax, "process_count", lambda: processes)
    for p in range(processes):
        monkeypatch.setattr(jax, "process_index", lambda p=p: p)
        in_parts = [i + k for i in range(0, n, m) for k in distributed.process_share(len(range(i, min(n, i + m))), i)]
        assert in_parts == [i for i in range(n) if i % processes == p] == distributed.process_share(n)
