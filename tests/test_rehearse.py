"""`rehearse` (issue #25 item 6): a paper RL config at tiny width with the paper's structure (plan/rehearse.py), and
the command that runs it for a step (commands/rehearse.py).

The narrowing tests are cheap (configs and shapes, nothing compiled), as are those of `off_programs` on a plan
made off on purpose and of the Stage I.3 rehearsal's toy judge; the two slow ones run the command in a subprocess
with no device count in its environment (rehearse gives the CPU the mesh's 16 devices) and check the structure,
every program within the planner's tolerance, the per-step figures and that the update moved the weights (the
simrl one for two steps with the static sampler and then the engine: issue #43 item 4's check for Stage I.3). Both
rehearse in float32 (`--set train.dtype=float32`): on a CPU the bf16 programs compile larger than the planner (sized
for accelerators) counts (the Stage II update: plan/compiled 0.69 in bf16, 0.89 in fp32), so fp32 is the honest
compare of plan against compiled on a CPU, and it runs faster there (agent csd 72 -> 56 CPU s)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import jax
import pytest

from mimesis_jax import cli
from mimesis_jax.data.chat import render_messages
from mimesis_jax.data.tokenizer import load_tokenizer
from mimesis_jax.envs import soul
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.soul import humanual
from mimesis_jax.envs.toy import ToyBehaviourJudge, ToySupportAgent
from mimesis_jax.envs.userrl import mixture
from mimesis_jax.models.qwen3_5 import layer_block
from mimesis_jax.commands import rehearse as rehearse_cli
from mimesis_jax.plan.compiled import TOLERANCE
from mimesis_jax.plan.rehearse import SIM_DOMAINS, narrow_config
from mimesis_jax.plan.workload import load_run_config, runtime_model, workload_from_config
from mimesis_jax.train.metrics import read_metrics

from helpers import subprocess_env

AGENT, SIM = "configs/qwen3_8b_agentrl.py:csd", "configs/mimesis_simrl.py:9b"
FP32 = ("--set", "train.dtype=float32")
# the paper configs sample through the rollout engine (issue #43 item 5); their static sampler is this (`rehearse
# --engine on` turns the engine back on with rollout.max_batch 0)
STATIC = ("--set", "rollout.engine=false", "rollout.max_batch=256")


def _pair(path):
    paper = load_run_config(path, list(STATIC[1:]))  # the static sampler's per-call cap narrows with the batch
    # --set applies before the narrowing, so `rehearse --set train.dtype=float32` rehearses (and plans) in fp32
    assert narrow_config(load_run_config(path, ["train.dtype=float32"])).train.dtype == "float32"
    return paper, narrow_config(paper)


def _structure_kept(paper, tiny):
    """The invariants both stages keep (module docstring of plan/rehearse.py)."""
    pm, tm = paper.model, tiny.model
    assert tiny.mesh == paper.mesh
    period = layer_block(pm)[0]  # the pattern's period, in the fewest whole repeats making >= 2 layers
    assert layer_block(tm) == (period, -(-2 // len(period))) and tm.num_hidden_layers >= 2
    assert tm.num_attention_heads // tm.num_key_value_heads == pm.num_attention_heads // pm.num_key_value_heads
    assert tm.intermediate_size / tm.hidden_size == pm.intermediate_size / pm.hidden_size == 3.0
    t = paper.mesh.tensor
    vocab = runtime_model(tiny).vocab_size
    assert vocab == 1024 and tiny.tokenizer.name == "tiny"
    for n in (tm.num_attention_heads, tm.num_key_value_heads, tm.intermediate_size, vocab):
        assert n % t == 0
    for key in ("model_type", "tie_word_embeddings", "attention_impl", "partial_rotary_factor", "attn_output_gate"):
        assert getattr(tm, key) == getattr(pm, key), key
    assert (tiny.train.dtype, tiny.train.remat) == (paper.train.dtype, paper.train.remat) == ("bfloat16", "full")
    assert tiny.rl == paper.rl
    r, pr = tiny.rollout, paper.rollout
    assert r.group_size == pr.group_size == 8
    assert pr.prompts_per_step // pr.mini_batch_prompts == r.prompts_per_step // r.mini_batch_prompts
    assert r.prompts_per_step == pr.prompts_per_step // 16
    assert r.max_batch * pr.prompts_per_step == pr.max_batch * r.prompts_per_step  # sampler calls per step kept
    assert r.row_len == pr.row_len // 16 and r.max_context_tokens == pr.max_context_tokens // 16
    assert (tiny.train.steps, tiny.validation.every) == (1, 0)


def test_agent_csd_keeps_the_paper_structure():
    paper, tiny = _pair(AGENT)
    _structure_kept(paper, tiny)
    shipped = narrow_config(load_run_config(AGENT)).rollout  # the config as shipped: the engine, no per-call cap
    assert (shipped.engine, shipped.max_batch) == (True, 0)
    tm = tiny.model
    assert (tm.num_hidden_layers, tm.num_attention_heads, tm.num_key_value_heads, tm.hidden_size) == (2, 8, 2, 64)
    assert tiny.mesh.axes() == {"data": 1, "fsdp": 8, "tensor": 2}
    r, g, u = tiny.rollout, tiny.gyms, tiny.users
    assert (r.prompts_per_step, r.mini_batch_prompts, r.max_batch) == (8, 1, 16)
    assert r.max_turns == g.max_turns == 16 and tiny.rl.alpha == 0.01 and tiny.rl.teacher == "fused"
    # 9,344 = 1,152 + 8,192 tokens, each / 16: the row is the context, the context the prompt + the response
    assert r.row_len == r.max_context_tokens == 584 == g.max_prompt_tokens + 512 and g.max_prompt_tokens == 72
    assert (r.agent_max_tokens, u.coach_max_tokens, u.simulator_max_tokens) == (128, 16, 64)
    # --tokens 32: the prompt budget stays at the toy prompts' 72 (1,152 / 32 = 36 would drop
    # them all), the context and the row grow by the 36 tokens: 72 + 8,192 / 32 = 328, still equal
    t32 = narrow_config(paper, tokens=32)
    r32, u32 = t32.rollout, t32.users
    assert r32.row_len == r32.max_context_tokens == 328 == t32.gyms.max_prompt_tokens + 8192 // 32
    assert (r32.agent_max_tokens, u32.coach_max_tokens, u32.simulator_max_tokens) == (64, 8, 32)
    assert t32.gyms.max_prompt_tokens == 72 and r32.max_turns == 16
    assert len(mixture.build_tasks(t32.gyms, load_tokenizer("tiny"))[0]) == 64
    # heads at the paper's rollout.head_rungs (0.55 of 328 -> 192, and 328); branch heads at its
    # rollout.branch_head_rungs (0.5, 0.7, 1 of each head, rounded up to 64): 128, 192, 192 and 192, 256, 328
    heads = ((192, (128, 192)), (328, (192, 256, 328)))
    assert workload_from_config(t32, t32.mesh.axes(), runtime_model(t32)).programs == tuple(
        (32, 328, k, b, kc) for b in (448, 896) for k, kcs in heads for kc in kcs)
    assert (u.simulator, u.coach, g.sources) == ("toy-user", "toy-coach", ("toy:64:s:16",))
    # every toy task survives the scaled prompt filter and plays the paper's 16 turns
    tasks, dropped = mixture.build_tasks(g, load_tokenizer("tiny"))
    assert len(tasks) == 64 and dropped == {} and {t.create_kwargs["max_steps"] for t in tasks} == {16}
    # the shape ladder keeps its two CSD branch rungs; its row rungs do not: the paper's 128 dialogues per
    # mini-batch span 64 / 96 / 128 rows (multiples of 4 micro-batches x 8 batch shards), the rehearsal's 8 fit 32
    w_paper = workload_from_config(paper, paper.mesh.axes(), runtime_model(paper))
    w = workload_from_config(tiny, tiny.mesh.axes(), runtime_model(tiny))
    assert sorted({p[0] for p in w_paper.programs}) == [64, 96, 128] and len(w_paper.programs) == 33
    heads = ((384, (192, 320, 384)), (584, (320, 448, 584)))
    assert w.programs == tuple((32, 584, k, b, kc) for b in (640, 1280) for k, kcs in heads for kc in kcs)
    assert (w.rows, w.microbatches) == (32, 4) and len({p[3] for p in w_paper.programs}) == 2


def test_simrl_9b_keeps_the_paper_structure():
    paper, tiny = _pair(SIM)
    _structure_kept(paper, tiny)
    tm = tiny.model
    lin, full = "linear_attention", "full_attention"
    assert tm.layer_types == (lin, lin, lin, full) and tm.num_hidden_layers == 4  # one period of the paper's 32
    assert narrow_config(paper, repeats=2).model.layer_types == (lin, lin, lin, full) * 2
    assert (tm.linear_num_key_heads, tm.linear_num_value_heads) == (2, 4)  # 16 : 32 -> 2 : 4, split by tensor 2
    assert tiny.mesh.axes() == {"data": 2, "fsdp": 4, "tensor": 2}
    r = tiny.rollout
    assert (r.prompts_per_step, r.mini_batch_prompts, r.max_batch) == (4, 1, 16)
    assert r.row_len == r.max_context_tokens == 1024 and r.max_tokens == 128
    # sampled without thinking: a random policy never closes its thought, so it would never reply (module docstring
    # of plan/rehearse.py)
    assert paper.rollout.thinking and not r.thinking
    assert tiny.domains.max_user_turns == 8 and tiny.domains.weights == SIM_DOMAINS
    assert {soul.task_info(d).family for d, _ in SIM_DOMAINS} == {"judge"}
    assert (tiny.sides.judge, tiny.sides.support_agent, tiny.sides.partner, tiny.sides.max_tokens) == (
        "toy-judge", "toy-agent", "toy-agent", 64)
    # the multi-turn domain: every record opens within the context with room for a turn, and takes >= 2 turns
    tok = load_tokenizer("tiny")
    (multi,) = [d for d, _ in SIM_DOMAINS if soul.task_info(d).multi_turn]
    for record in soul.sample_records(multi):
        env = soul.make_env(multi, record, judge=ToyBehaviourJudge(), partner=ToySupportAgent())
        env.thinking = False
        opening = render_messages(tok, env.reset(seed=0), add_generation_prompt=True, generation_role=env.policy_role)
        assert len(opening.ids) + r.max_tokens <= r.max_context_tokens and env.max_policy_turns >= 2


def test_the_simulator_rehearsal_judge_grades_any_reply():
    """The toy judge scores the rehearsal's Humanual domains for any reply, by its words against the real reply's,
    so a random policy's group of replies gets rewards that differ (its update has advantages to follow)."""
    assert ToyBehaviourJudge.HUMANUAL_DIMENSIONS == humanual.DIMENSIONS
    single = [name for name, _ in SIM_DOMAINS if not soul.task_info(name).multi_turn]
    assert single == ["humanual_chat", "humanual_opinion"]
    for name in single:
        record = soul.sample_records(name)[0]
        real = len(re.findall(r"[A-Za-z]+", record["completion"]))

        def reward(words):
            env = soul.make_env(name, record, judge=ToyBehaviourJudge())
            env.reset(seed=0)
            return env.step(None, " ".join(["word"] * words)).reward

        # every dimension at exp(-((w - real) / real)^2), times Humanual's length factor
        for w in (1, real // 2, real, 3 * real):
            factor = humanual.length_factor(" ".join(["word"] * w), record["completion"])
            want = round(math.exp(-((w - real) / real) ** 2), 6) * factor
            assert math.isclose(reward(w), want, rel_tol=1e-9, abs_tol=1e-12), (name, w)
        assert reward(real) == 1.0 > reward(real // 2) > reward(3 * real)


def test_the_simulator_rehearsal_judge_grades_any_mirrorbench_reenactment():
    """The toy judge scores the rehearsal's MirrorBench dialogues (the toy support agent as the partner) by the mean
    words of the simulated user turns against the real user turns': min / max of the two, so long random turns
    still get graded rewards; a turn's further lines count to it."""
    record = soul.sample_records("mirrorbench")[1]
    real = [t for t in record["turns"] if t["role"] == "user"]
    assert len(real) >= 2
    w_real = sum(len(re.findall(r"[A-Za-z]+", t["content"])) for t in real) / len(real)

    def reward(turns):
        env = soul.make_env("mirrorbench", record, judge=ToyBehaviourJudge(), partner=ToySupportAgent())
        env.reset(seed=0)
        for i, text in enumerate(turns):
            t = env.step(None, text)
            assert t.done == (i == len(real) - 1)
        return t.reward

    for words in ((1, 1), (3, 5), (40, 60), (int(w_real), int(w_real))):
        turns = [" ".join(["word"] * w) for w in words] + ["a b"] * (len(real) - 2)
        w = (sum(words) + 2 * (len(real) - 2)) / len(real)
        assert reward(turns) == round(min(w, w_real) / max(w, w_real), 6), words
    # a turn over two lines counts as one turn of all its words
    split = ["one two\nthree four", "five"] + ["a b"] * (len(real) - 2)
    w = (5 + 2 * (len(real) - 2)) / len(real)
    assert reward(split) == round(min(w, w_real) / max(w, w_real), 6)


def test_toy_source_with_turns_and_its_errors():
    tasks = mixture.resolve_sources(["toy:3:t:5"])
    assert [(t.create_kwargs["letter"], t.create_kwargs["max_steps"]) for t in tasks] == [("t", 5)] * 3
    assert {t.create_kwargs["max_steps"] for t in mixture.resolve_sources(["toy:2"])} == {2}
    for bad in ("toy:3:t:0", "toy:3:t:x", "toy:3:t:2:9"):
        with pytest.raises(EnvError, match="toy:N:letter:turns"):
            mixture.resolve_sources([bad])
    # a free-text ToyKeyword prompt is counted as the episode runner renders it: without the tool schema
    tok = load_tokenizer("tiny")
    toy = tasks[0]
    n = mixture.prompt_tokens(toy, tok)
    assert n == len(render_messages(tok, toy.prompt, add_generation_prompt=True).ids) < 72


def test_too_few_devices_is_one_line_naming_the_flag(capsys):
    # rehearse gives the CPU the mesh's devices only before JAX's backend starts (the slow tests' subprocesses run
    # without a device count); this process's backend started with 8 (here, if no test before started it), so it
    # cannot, and says how to
    assert len(jax.devices()) == 8 and not rehearse_cli.provide_cpu_devices(16)
    assert not rehearse_cli.provide_cpu_devices(16, distributed=True)
    assert cli.main(["rehearse", "--config", AGENT]) == 2  # the test process sees 8 devices, the mesh needs 16
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "needs 16 devices, this process sees 8" in err
    assert "XLA_FLAGS=--xla_force_host_platform_device_count=16" in err
    assert cli.main(["rehearse", "--config", "configs/mimesis_sft.py:9b"]) == 2
    assert "rehearse runs RL configs" in capsys.readouterr().err


def _rehearse(tmp_path, config, *extra):
    out, wd = tmp_path / "rehearse.json", tmp_path / "run"
    # no device count in the environment: rehearse gives the CPU the mesh's 16 devices itself
    env = subprocess_env(JAX_DISABLE_MOST_OPTIMIZATIONS="0")
    env["XLA_FLAGS"] += " --xla_cpu_collective_call_terminate_timeout_seconds=60"
    proc = subprocess.run([sys.executable, "-m", "mimesis_jax", "rehearse", "--config", config, "--json", str(out),
                           "--workdir", str(wd), *extra], capture_output=True, text=True, timeout=900,
                          # XLA's full optimization: the run's cost is executing its programs, not compiling them
                          # (agent csd 197 -> 124 CPU s)
                          env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not list(wd.glob("engine_off/checkpoints/*"))  # the rehearsal keeps nothing: no checkpoint written
    return json.loads(out.read_text())["reports"], proc.stdout


def _check_programs(rep, stdout):
    assert rep["programs"], rep
    # the memory is read from the executables the run compiled: no update or sampler program is compiled again
    assert not [n for n in rep["measure_compilations"] if "_rl_update" in n or "generate_bucket" in n]
    # the static sampler's programs, or with the engine on none (its programs are counted, not measured here) but
    # the weight sync into the engine's replica layout (distributed.layout_of)
    assert {p["program"] for p in rep["programs"]} == ({"rl_update", "weight_sync"} if rep["engine"]
                                                       else {"rl_update", "sampler"})
    if rep["engine"]:
        (sync,) = [p for p in rep["programs"] if p["program"] == "weight_sync"]
        assert sync["shape"] == {"layout": f"tensor={rep['mesh']['tensor']}"} and sync["mesh"]["fsdp"] == 1
    assert all(p["compiled_bytes"] > 0 and p["plan_bytes"] > 0 for p in rep["programs"])
    # every program, update and sampler, within the planner's tolerance (fp32: the honest compare on a CPU)
    off = rehearse_cli.off_programs(rep)
    assert not off, [(p["program"], p["shape"], p["plan_bytes"] / p["compiled_bytes"]) for p in off]
    assert all(p["ok"] for p in rep["programs"]) and "OFF" not in stdout


def _check_steps(rep, stdout):
    """The per-step figures taken from the learner's step records (engine off: no engine counters)."""
    c = rep["compilations"]
    if rep["engine"]:  # the engine's prefill and decode programs, no sampler's
        assert c["sampler"] == 0 and c["engine"] >= 2
    else:
        assert c["engine"] == 0 and c["sampler"] >= 1
    parts = {"update": "rl_update", "old_logprobs": "old_logprobs", "sampler": "sampler", "engine": "engine"}
    for i, s in enumerate(rep["steps"]):
        # the learner's count of the programs compiled so far: the run's, part by part, after its last step; with
        # the engine after every step (it compiles every program on its first call, EngineConfig.precompile, so a
        # later step compiles nothing new), without it at most the run's (a later turn may meet a new batch bucket)
        run = {k: rep["compilations"][v] for k, v in parts.items()}
        counts = {k: s[f"compilations/{k}"] for k in parts}
        if rep["engine"] or i == len(rep["steps"]) - 1:
            assert counts == run
        else:
            assert all(counts[k] <= run[k] for k in parts), (counts, run)
        assert s["num_compilations"] == sum(counts.values())
        assert f"step {i + 1}: " in stdout
        if rep["engine"]:  # an uncapped pool (rehearse: engine_memory_gib = 0) evicts nothing
            assert s["engine/evictions"] == 0 and s["engine/reused_tokens"] >= 0
            assert f"engine reused tokens {s['engine/reused_tokens']}, evictions 0" in stdout
        else:
            assert s["engine/reused_tokens"] == s["engine/evictions"] == 0
        assert 0.0 <= s["reward_mean"] <= 1.0 and s["loss"] is not None and math.isfinite(s["loss"])
        assert f"reward_mean {s['reward_mean']:.4f}" in stdout and f"programs compiled so far " \
            f"{s['num_compilations']} (update {s['compilations/update']}," in stdout


def _check_learns(rep):
    """The rehearsal's world rewards the random policy unevenly within its groups, so every step has advantages, a
    loss and an update that moves the weights."""
    for step in rep["steps"]:
        assert step["reward_mean"] > 0 and step["loss"] != 0, step
    assert rep["param_change"] > 0


def check_engine_steps(rep, stdout, mesh):
    """`rehearse --engine on --steps 2` (issue #43 item 4) at a paper mesh of 16 fake devices: every dialogue of a
    step stays in its replica's pool (the rehearsal's pool is uncapped: engine_memory_gib = 0, sized per replica),
    so nothing is evicted; the engine compiles every program on its first call (EngineConfig.precompile), so step 2
    compiles nothing new. Returns the two steps."""
    assert rep["engine"] and rep["num_devices"] == 16 and rep["mesh"] == mesh
    first, second = rep["steps"]
    assert first["engine/evictions"] == second["engine/evictions"] == 0
    # step 2 compiles no new program: the run's count (every part) is step 1's
    assert second["num_compilations"] == first["num_compilations"] == sum(
        rep["compilations"][k] for k in ("rl_update", "old_logprobs", "sampler", "engine"))
    assert rep["compilations"]["sampler"] == 0 and rep["compilations"]["engine"] >= 2
    for i, s in enumerate((first, second), 1):
        assert (f"step {i}: " in stdout and f"engine reused tokens {s['engine/reused_tokens']}, evictions 0"
                in stdout)
    return first, second


def _report(plan_bytes, compiled_bytes, ok=True):
    return {"tolerance": TOLERANCE, "programs": [{"program": "sampler", "plan_bytes": plan_bytes,
                                                  "compiled_bytes": compiled_bytes, "ok": ok}]}


def test_off_programs_flags_a_plan_off_its_compiled_bytes():
    compiled = 10 * 2 ** 20
    assert rehearse_cli.off_programs(_report(compiled, compiled)) == []
    edge = round(compiled * (1 - TOLERANCE)) + 1  # just inside the tolerance, either side
    assert rehearse_cli.off_programs(_report(edge, compiled)) == []
    assert rehearse_cli.off_programs(_report(2 * compiled - edge, compiled)) == []
    # a plan at 0.8x (or 1.2x) of the compiled bytes is flagged, whatever the report's own `ok` says
    for factor in (0.8, 1.2):
        rep = _report(round(factor * compiled), compiled, ok=True)
        assert [p["program"] for p in rehearse_cli.off_programs(rep)] == ["sampler"]


@pytest.mark.slow
def test_rehearse_agent_csd(tmp_path):
    # --tokens 64, as tests/test_rehearse_engine.py's engine run: the row and the context are 72 + 8,192 / 64 = 200
    # tokens (32-token agent turns), the 16 turns kept; the update ladder is the engine run's, so in one test run
    # (one persistent XLA cache, tests/conftest.py) whichever rehearsal comes second loads its update programs
    (rep,), stdout = _rehearse(tmp_path, AGENT, "--tokens", "64", *FP32, *STATIC)
    assert rep["num_devices"] == 16 and rep["mesh"] == {"data": 1, "fsdp": 8, "tensor": 2}
    assert (rep["group_size"], rep["max_turns"], rep["updates_per_step"], rep["csd"]) == (8, 16, 8, True)
    assert rep["row_len"] == rep["max_context_tokens"] == 200 and rep["dtype"] == "float32"
    assert rep["model"]["layer_types"] == ["full_attention"] * 2
    # the update compiled once per ladder program it met, and each of those is one the plan lists
    updates = [p for p in rep["programs"] if p["program"] == "rl_update"]
    plan = [list(p.values()) for p in rep["plan_programs"]]
    assert len(plan) == 10 and 1 <= len(updates) == rep["compilations"]["rl_update"] <= len(plan)
    assert all(list(p["shape"].values()) in plan for p in updates)
    sampler = [p for p in rep["programs"] if p["program"] == "sampler"]
    assert len(sampler) == rep["compilations"]["sampler"] >= 1
    assert max(p["shape"]["batch"] for p in sampler) == 16 and {p["shape"]["new_tokens"] for p in sampler} == {32}
    _check_programs(rep, stdout)
    _check_steps(rep, stdout)
    (step,) = rep["steps"]
    assert step["updates"] == 8 and step["trained_tokens"] == step["generated_tokens"] > 0
    assert f"plan lists {len(rep['plan_programs'])} update program(s)" in stdout
    _check_learns(rep)


@pytest.mark.slow
def test_rehearse_simrl_9b(tmp_path):
    # one period of the layer pattern, fp32, the CPU init's cheap compile; the static sampler, then the rollout
    # engine, two steps each: also issue #43 item 4's engine check at the Stage I.3 paper mesh (one rehearsal for
    # both instead of a second engine-only run in tests/test_rehearse_engine.py)
    # 64-token KV pages: the engine precompiles its prefill and decode programs for every page-table width up to a
    # dialogue's 1,024 tokens (EngineConfig.precompile), 2 widths (8, 16 pages: 9 engine programs) instead of
    # 32-token pages' 3 (8, 16, 32: 13 programs) or 16-token pages' 5 (8, 16, 32, 48, 64) on the 16 devices -- still
    # more than one width, so "step 2 compiles nothing" still needs the precompile of a width step 1 may not have
    # met; prefix reuse is per token, not per page (inference/page_pool.py), so the checks below are unchanged.
    # The mesh, the batch and group, the row == context budget are the config's
    (off, on), stdout = _rehearse(tmp_path, SIM, "--engine", "both", "--steps", "2", *FP32, *STATIC,
                                  "--set", "rollout.engine_page_size=64")
    assert (off["engine"], on["engine"]) == (False, True)
    paper = load_run_config(SIM).rollout
    for rep in (off, on):
        assert rep["num_devices"] == 16 and rep["mesh"] == {"data": 2, "fsdp": 4, "tensor": 2}
        assert (rep["group_size"], rep["updates_per_step"], rep["csd"]) == (8, 4, False)
        assert rep["row_len"] == rep["max_context_tokens"] == 1024 and rep["dtype"] == "float32"
        assert rep["model"]["layer_types"] == ["linear_attention"] * 3 + ["full_attention"]  # one period
        # Stage I.3 packs on its ladder too (train/rl/ladder.py ladder_for_config): every update is one the plan
        # lists
        plan = [list(p.values()) for p in rep["plan_programs"]]
        updates = [p for p in rep["programs"] if p["program"] == "rl_update"]
        assert 1 <= len(updates) == rep["compilations"]["rl_update"] <= len(plan) <= 9  # 3 rows x 3 heads at most
        assert all(list(p["shape"].values()) in plan and p["shape"]["row_len"] == 1024 for p in updates)
        _check_programs(rep, stdout)
        _check_steps(rep, stdout)
        for step in rep["steps"]:
            assert step["updates"] == 4
            assert math.isclose(step["coach_s"], 0.0)
            # MirrorBench's dialogues take more than one policy turn: more tokens than one full turn per rollout
            assert step["generated_tokens"] > rep["prompts_per_step"] * rep["group_size"] * paper.max_tokens // 16, step
        _check_learns(rep)
    first, second = check_engine_steps(on, stdout, {"data": 2, "fsdp": 4, "tensor": 2})
    # MirrorBench's turns 2+ return to their dialogue: the simulator runner renders each turn's prompt afresh from
    # the dialogue (episodes/simulator.py), and the chat template drops the empty think block that ended the
    # previous prompt (data/chat.py: Qwen3 shows it only after the last user query), so the new prompt extends the
    # cached prompt only through its last <|im_end|>; the engine resumes the dialogue from the Qwen3.5 state
    # snapshot it took there (EngineConfig.checkpoint "turn", inference/page_pool.py) and prefills only the rest
    assert first["engine/reused_tokens"] > 0 and second["engine/reused_tokens"] > 0
    # ... and recomputes none (the step records the run logged)
    logged = [r for r in read_metrics(str(tmp_path / "run" / "engine_on")) if "engine/recomputed" in r]
    assert len(logged) == 2 and all(r["engine/recomputed"] == 0 for r in logged), logged
    # the engine draws the static sampler's tokens from the same per-request keys: the same dialogues, rewards,
    # tokens and update (float32)
    for s_off, s_on in zip(off["steps"], on["steps"]):
        for key in ("reward_mean", "generated_tokens", "trained_tokens"):
            assert s_on[key] == s_off[key], key
        assert s_on["loss"] == pytest.approx(s_off["loss"], rel=1e-4)
    assert on["param_change"] == pytest.approx(off["param_change"], rel=1e-4)


def test_a_rehearsal_that_trains_nothing_fails_naming_the_flag(tmp_path):
    # at --tokens 64 the simulator's 16,384-token context becomes 256: no rehearsal domain's prompt leaves room for
    # a turn, so the step rolls out and trains nothing -- an error naming the flag, not a report of nothing
    proc = subprocess.run([sys.executable, "-m", "mimesis_jax", "rehearse", "--config", SIM, "--tokens", "64", *FP32,
                           *STATIC],
                          capture_output=True, text=True, timeout=600, env=subprocess_env())
    assert proc.returncode == 2, proc.stderr[-3000:]
    err = proc.stderr.strip().splitlines()[-1]
    context = load_run_config(SIM).rollout.max_context_tokens // 64
    assert err == (f"error: --config {SIM}: the rehearsal (rollout.engine off) trained nothing: no rollout fit "
                   f"max_context_tokens {context} (--tokens 64); use a smaller --tokens")
