"""The domain registry of Eq 4: the 24 domains with protocol, reward and sides; every domain's shipped records
build an environment; p(d) sampling frequencies and exact resume; a full behaviour episode and a multi-turn SOUL
episode with the tiny simulator whose segments feed FoldGRPO once per rollout."""

import json

import numpy as np
import pytest

from mimesis_jax.algorithms import grpo
from mimesis_jax.envs import domains as D
from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.sim_env import SimEnv
from mimesis_jax.envs.toy import ToyBehaviourJudge, ToySupportAgent
from mimesis_jax.chat.base import ScriptedChatModel
from mimesis_jax.episodes.simulator import SimEpisodeConfig, SimEpisodeTask, fold_inputs, run_sim_episodes

SOUL = {"sotopia", "coser", "lifechoices", "userllm", "mirrorbench", "fantom", "hitom", "paratomi", "mistakes",
        "twinvoice", "social_r1", "behaviorchain", "sim_math", "sim_doc", "humanual_book", "humanual_chat",
        "humanual_email", "humanual_news", "humanual_opinion", "humanual_politics", "alignx", "socsci210",
        "humanllm"}


def test_the_24_domains():
    ds = D.domains()
    assert set(ds) == SOUL | {"abcd_behaviour"} and len(ds) == 24
    for name, d in ds.items():
        assert d.family in ("behaviour", "choice", "judge") and d.protocol and d.reward and d.record_format
        if d.family == "judge":
            assert "judge" in d.sides
        if d.family == "choice":
            assert "judge" not in d.sides
        assert ("partner" in d.sides) == (d.multi_turn and d.family != "behaviour")
    b = ds["abcd_behaviour"]
    assert (b.family, b.multi_turn, b.sides) == ("behaviour", True, ("support_agent", "judge"))
    assert D.default_weights() == {k: 1.0 for k in ds}


def test_every_domain_builds_envs_from_its_samples():
    sides = D.SideModels(judge=ScriptedChatModel(["{}"]), partner=ScriptedChatModel(["ok"]),
                         support_agent=ToySupportAgent())
    for name, d in D.domains().items():
        recs = d.samples()
        assert 3 <= len(recs) <= 10 or name == "abcd_behaviour", name
        for i, rec in enumerate(recs):
            env = D.make_domain_env(name, rec, sides, seed=i)
            assert isinstance(env, SimEnv) and env.multi_turn == d.multi_turn, name
            view = env.reset()
            assert view and all(m["role"] in ("system", "user", "assistant") for m in view), name
            assert view[-1]["role"] != env.policy_role, name  # the policy speaks next
            if i == 0:  # a turn with no public reply (thought never closed) is the policy's failure: 0, no judge
                t = env.step("an unfinished thought", None)
                assert t.done and t.reward == 0.0, name
    with pytest.raises(EnvError, match=r"needs the fixed side\(s\) \['support_agent', 'judge'\]"):
        D.make_domain_env("abcd_behaviour", D.domain("abcd_behaviour").samples()[0], D.SideModels())
    with pytest.raises(EnvError, match="unknown domain 'nope'"):
        D.domain("nope")


def test_sampler_frequencies_zero_weight_and_resume():
    weights = {"hitom": 3.0, "fantom": 1.0, "abcd_behaviour": 0.0, "coser": 0.0}
    s = D.DomainSampler(weights, {"hitom": 3, "fantom": 6}, seed=7)
    assert s.probabilities() == {"hitom": 0.75, "fantom": 0.25}
    draws = s.draw(8000)
    freq = {k: sum(d == k for d, _ in draws) / len(draws) for k in weights}
    assert abs(freq["hitom"] - 0.75) < 0.02 and abs(freq["fantom"] - 0.25) < 0.02
    assert freq["abcd_behaviour"] == 0.0 and freq["coser"] == 0.0
    idx = [i for d, i in draws if d == "fantom"]
    assert set(idx) == set(range(6))  # records uniform within the domain
    a = D.DomainSampler(weights, {"hitom": 3, "fantom": 6}, seed=7)
    a.draw(5)
    b = D.DomainSampler(weights, {"hitom": 3, "fantom": 6}, seed=7)
    b.restore(json.loads(json.dumps(a.state())))
    assert a.draw(20) == b.draw(20) == draws[5:25]


@pytest.mark.parametrize("weights,records,match", [
    ({"nope": 1.0}, {}, "unknown domain 'nope'"),
    ({"hitom": -1.0}, {"hitom": 1}, "must be a finite number >= 0"),
    ({"hitom": 0.0}, {"hitom": 1}, "every weight is 0"),
    ({"hitom": 1.0}, {}, "'hitom' has weight 1.0 but no records"),
])
def test_sampler_errors(weights, records, match):
    with pytest.raises(EnvError, match=match):
        D.DomainSampler(weights, records)


def test_sampler_restore_checks_the_seed():
    s = D.DomainSampler({"hitom": 1.0}, {"hitom": 1}, seed=1)
    with pytest.raises(EnvError, match="seed 2 does not match"):
        s.restore({"seed": 2, "drawn": 0})


def test_behaviour_and_multi_turn_soul_episodes_with_the_tiny_simulator():
    """The tiny Qwen3.5 simulator as the sampled policy: one ABCD behaviour episode (customer, vs the toy support
    agent, toy judge) and one multi-turn SOUL episode (sotopia vs a scripted partner and judge), two rollouts each;
    their segments feed grpo.group_advantages(fold=True) with each rollout counted once."""
    from mimesis_jax.chat.local import LocalChatModel
    from mimesis_jax.chat.specs import tiny_model

    config, params, tok = tiny_model("qwen3_5", 0)
    policy = LocalChatModel(config, params, tok)

    def judge_reply(messages):  # the toy judge for ABCD requests; every Sotopia dimension mid-range otherwise
        text = "\n".join(m["content"] for m in messages)
        if "# Simulated part" in text:
            return ToyBehaviourJudge().chat(messages).text
        from mimesis_jax.envs.soul.sotopia import RANGES
        return json.dumps({**{d: lo + 0.5 * (hi - lo) for d, (lo, hi) in RANGES.items()}, "naturalness_risk": "low"})
    sides = D.SideModels(judge=ScriptedChatModel(judge_reply), partner=ScriptedChatModel(["I see. Go on."]),
                         support_agent=ToySupportAgent())
    abcd_rec = D.domain("abcd_behaviour").samples()[0]
    soul_rec = D.domain("sotopia").samples()[0]
    tasks = []
    for k in range(2):
        env = D.make_domain_env("abcd_behaviour", abcd_rec, sides, seed=3, config=None)
        env.thinking = False  # a random tiny model never closes a thought; the turns must reach the other side
        tasks.append(SimEpisodeTask(env, group_id=0, rollout_id=10 + k))
    for k in range(2):
        env = D.make_domain_env("sotopia", soul_rec, sides, seed=4, max_turns=2)
        env.thinking = False
        tasks.append(SimEpisodeTask(env, group_id=1, rollout_id=20 + k))
    outs = run_sim_episodes(policy, tasks, SimEpisodeConfig(max_tokens=8, seed=0, env_workers=1))
    assert [o.status for o in outs] == ["ok"] * 4, [o.invalid_reason for o in outs]
    assert [o.domain for o in outs] == ["abcd_behaviour"] * 2 + ["sotopia"] * 2
    for o in outs:
        assert 0.0 <= o.reward <= 1.0 and len(o.segments) >= 2  # multi-turn: one segment per policy turn
        for s in o.segments:
            prompt, sample = s.segments
            assert sample.logprobs is not None and len(sample.logprobs) == len(sample.tokens) > 0
            assert s.rollout_id == o.rollout_id and s.turn_rewards == [o.reward]
    for o in outs[2:]:  # each Sotopia dimension at the middle of its range: the weighted mean is 0.5
        assert o.reward == pytest.approx(0.5)
    b = outs[0]
    assert b.info["behaviour"] in ("N",) + tuple(f"B{i}" for i in range(1, 14)) and b.info["scores"] is not None
    segs, scores, gids, rids = fold_inputs(outs)
    adv = grpo.group_advantages(scores, gids, rids, fold=True)
    for g, (x, y) in ((0, (outs[0], outs[1])), (1, (outs[2], outs[3]))):
        m, sd = np.mean([x.reward, y.reward]), np.std([x.reward, y.reward], ddof=1)
        for s, a in zip(segs, adv):
            if s.group_id == g:
                r = x.reward if s.rollout_id == x.rollout_id else y.reward
                assert a == pytest.approx((r - m) / (sd + 1e-6))


# ------------------------------------------------------------------ issue 22: routing by data_source, OdysSim keys
# OdysSim's route keys (agents/base_agent.py `_ROUTES`) that name one of this project's SOUL tasks, and that task.
ODYSSIM_KEYS = {
    "fantom": "fantom", "hitom": "hitom", "lifechoices": "lifechoices", "mirrorbench": "mirrorbench",
    "mistakes": "mistakes", "paratomi": "paratomi", "userllm": "userllm", "coser": "coser", "twinvoice": "twinvoice",
    "sotopia": "sotopia", "sotopia_hint": "sotopia", "social_r1": "social_r1", "sim_arena_math": "sim_math",
    "sim_arena_doc": "sim_doc", "behavior_chain": "behaviorchain", "alignx": "alignx", "alignx_demo": "alignx",
    "alignx_pair": "alignx", "alignx_ugc": "alignx", "alignx_arbitrary": "alignx", "alignx_history16": "alignx",
    "humanllm": "humanllm", "socsci210": "socsci210", "humanual-book": "humanual_book",
    "humanual-chat": "humanual_chat", "humanual-email": "humanual_email", "humanual-news": "humanual_news",
    "humanual-opinion": "humanual_opinion", "humanual-politics": "humanual_politics",
}


def _sample_rows(task):
    from mimesis_jax.envs.soul import base
    return base.read_rows(base.sample_path(task))


@pytest.mark.parametrize("key,task", sorted(ODYSSIM_KEYS.items()))
def test_odyssim_task_keys_name_our_domains(key, task):
    assert D.domain(key).name == task


def test_load_records_rejects_a_row_of_another_task(tmp_path):
    from mimesis_jax.envs import soul
    rows = [{"data_source": "paratomi", "extra_info": _sample_rows("paratomi")[0]},
            {"data_source": "hitom", "extra_info": _sample_rows("hitom")[0]}]
    path = tmp_path / "mixed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(EnvError, match=r"record 1 \(task paratomi\): field 'data_source' is 'hitom', not task "
                                       r"'paratomi'"):
        soul.load_records("paratomi", path)
    # a file of one task written with OdysSim's key loads under our name and under the key itself
    path2 = tmp_path / "bc.jsonl"
    path2.write_text("".join(json.dumps({"data_source": "behavior_chain", "extra_info": r}) + "\n"
                             for r in _sample_rows("behaviorchain")))
    want = soul.sample_records("behaviorchain")
    assert soul.load_records("behaviorchain", path2) == want
    assert soul.load_records("behavior_chain", path2) == want
    assert D.domain("behavior_chain").load(path2) == want


def test_load_mixed_routes_each_row_to_its_task(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    from mimesis_jax.envs import soul
    plan = [("hitom", "hitom"), ("behavior_chain", "behaviorchain"), ("humanual-book", "humanual_book"),
            ("sim_arena_math", "sim_math"), ("paratomi", "paratomi")]
    rows, want = [], {}
    for key, task in plan:
        for r in _sample_rows(task):
            rows.append({"data_source": key, "extra_info": json.dumps(r)})
        want[task] = soul.sample_records(task)
    rows = rows[::2] + rows[1::2]  # interleave tasks
    path = tmp_path / "odyssim.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    got = D.load_mixed(path)
    assert set(got) == set(want)
    for task in want:
        assert sorted(got[task], key=json.dumps) == sorted(want[task], key=json.dumps), task


@pytest.mark.parametrize("row,match", [
    ({"extra_info": {"x": 1}}, r"record 0: missing field 'data_source'"),
    ({"data_source": "mmtom", "extra_info": {"x": 1}}, r"record 0: field 'data_source' 'mmtom' is not a SOUL task"),
])
def test_load_mixed_errors_name_the_row(tmp_path, row, match):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps(row) + "\n")
    with pytest.raises(EnvError, match=match):
        D.load_mixed(path)
