"""One ABCD realistic-behaviour episode (docs/reference/paper.md 3.4) through the role-flipped runner, printed as a transcript with
the judge's scores and the Eq 12-13 reward. A script for looking at the environment and smoke-testing a judge or
support-agent endpoint; not a test.

    python experiments/behaviour_episode.py                   # scripted B4 customer and agent, toy judge
    python experiments/behaviour_episode.py --simulator runs/simrl --behaviour B9 --turns 4
    python experiments/behaviour_episode.py --judge http://localhost:8001/v1 --judge-model judge \
        --agent http://localhost:8001/v1 --agent-model agent

--simulator: ``scripted`` (built-in customer lines performing B4, "infeasibility persistence", for the shipped
sample's first scenario), ``tiny`` (random tiny Qwen3.5), an HF directory or a training workdir (the policy then
samples, thinking on). --agent: ``scripted`` (the matching agent lines of that scenario), ``toy-agent``, or any
model spec of chat/specs.py (remote endpoints are asked as assistants); --judge: ``toy-judge`` (envs/toy.py's
rule-based surface-feature judge) or a model spec.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from mimesis_jax.envs.abcd import dataset as abcd  # noqa: E402
from mimesis_jax.envs.abcd import env as abcd_env  # noqa: E402
from mimesis_jax.envs.abcd.behaviour import BEHAVIOURS  # noqa: E402
from mimesis_jax.episodes.simulator import SimEpisodeConfig, SimEpisodeTask, run_sim_episodes  # noqa: E402

SCRIPTED_B4 = (  # a customer who keeps asking for what the agent has said policy does not allow
    "<think>\nI want a full cash refund, not store credit. Push for it.\n</think>\n\nThe jacket is the wrong colour. "
    "I want my money back on my card, today.",
    "<think>\nThey said refunds go back to the original payment only. I still want cash.\n</think>\n\nI heard you, "
    "but I still want it as cash. Can't you just make an exception this once?",
    "<think>\nStill no. Ask again, a different way.\n</think>\n\nOkay, then put it on a different card. My old one "
    "is cancelled anyway, so just send it to the new one.",
    "<think>\nFine, I'll take what they offer.\n</think>\n\nAlright, do the return then. [END]",
)
SCRIPTED_AGENT = (  # the support agent's side of that scenario, following the return policy
    "I can set up a return for the jacket. The refund goes back to the original payment method, which is PayPal "
    "for this order.",
    "I'm sorry, I can't pay it out as cash: refunds can only go to the original payment method.",
    "I can't send it to another card either. Once the jacket is back, the refund goes to your PayPal account. "
    "Shall I start the return?",
)


def _side(spec: str, model_name: str, role: str):
    from mimesis_jax.envs.toy import ToyBehaviourJudge, ToySupportAgent
    from mimesis_jax.chat.specs import ModelSpec, chat_model_from_spec

    if spec == "scripted":
        from mimesis_jax.chat.base import ScriptedChatModel
        return ScriptedChatModel(list(SCRIPTED_AGENT))
    if spec == "toy-agent":
        return ToySupportAgent()
    if spec == "toy-judge":
        return ToyBehaviourJudge()
    return chat_model_from_spec(ModelSpec(spec, model_name=model_name or None, max_tokens=1024), style="assistant")


def _policy(spec: str, max_tokens: int):
    from mimesis_jax.data.tokenizer import load_tokenizer
    from mimesis_jax.chat.local import LocalChatModel
    from mimesis_jax.episodes.agent import ScriptedAgent

    if spec == "scripted":
        return ScriptedAgent(load_tokenizer("tiny"), list(SCRIPTED_B4))
    if spec == "tiny":
        from mimesis_jax.chat.specs import tiny_model

        config, params, tok = tiny_model("qwen3_5", 0)
        return LocalChatModel(config, params, tok, max_tokens=max_tokens)
    from mimesis_jax.chat.loading import load_chat_model
    return load_chat_model(spec, max_tokens=max_tokens)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--simulator", default="scripted")
    ap.add_argument("--agent", default="scripted")
    ap.add_argument("--agent-model", default="")
    ap.add_argument("--judge", default="toy-judge")
    ap.add_argument("--judge-model", default="")
    ap.add_argument("--conversations", default=abcd.SAMPLE_PATH, help="ABCD file (.json / .json.gz)")
    ap.add_argument("--record", type=int, default=0)
    ap.add_argument("--behaviour", default="B4", help="B1..B13 or N")
    ap.add_argument("--turns", type=int, default=len(SCRIPTED_B4), help="customer turns at most")
    ap.add_argument("--max-tokens", type=int, default=256)
    args = ap.parse_args(argv)
    if args.behaviour not in BEHAVIOURS:
        ap.error(f"--behaviour must be one of {list(BEHAVIOURS)}")
    record = abcd.load_conversations(args.conversations)[args.record]
    env = abcd_env.make_behaviour_env(record, agent=_side(args.agent, args.agent_model, "agent"),
                                      judge=_side(args.judge, args.judge_model, "judge"), seed=0,
                                      behaviour=args.behaviour,
                                      config=abcd_env.BehaviourEnvConfig(max_user_turns=args.turns))
    [out] = run_sim_episodes(_policy(args.simulator, args.max_tokens), [SimEpisodeTask(env, rollout_id=0)],
                             SimEpisodeConfig(max_tokens=args.max_tokens, env_workers=1))
    card = BEHAVIOURS[args.behaviour]
    print(f"# ABCD behaviour episode: conversation {record.convo_id} ({record.scenario['flow']} / "
          f"{record.scenario['subflow']}), behaviour {card.id} {card.name}\n")
    for m in out.transcript:
        who = "CUSTOMER" if m["role"] == "user" else "AGENT"
        print(f"{who}: {m['content']}\n")
    for i, t in enumerate(out.thoughts):
        print(f"(simulator thought, turn {i + 1}, never shown to the agent: {t})")
    if out.status != "ok":
        print(f"\nINVALID: {out.invalid_reason}")
        return 1
    info = out.info
    print(f"\njudge scores: {json.dumps(info['scores'])}  meta-narration: {info['meta_narration']} "
          f"({info['meta_source']})\nreward (Eq 12-13): {out.reward:.4f}  end: {info['end']}, customer turns: "
          f"{info['user_turns']}, training segments: {len(out.segments)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
