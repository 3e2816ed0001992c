"""MirrorBench: re-enact the user side of a real user-chatbot conversation (judge family, multi-turn).

Protocol (OdysSim ``agents/mirrorbench``, this project's wording): the policy is a user proxy that knows only
the conversation's task description; it writes the user turns. The fixed ``partner`` is the assistant "mirror":
it sees the real conversation in its system message and answers the proxy as the original assistant would. The
real conversation's first 10 turns (trailing assistant turns dropped) set the schedule: the policy writes one turn
per real user turn, in order; each real assistant turn between two user turns becomes one partner reply (an
assistant opening is asked for at reset). The policy sees the partner's replies as ``user`` messages "AI: ..."
followed by a request for the next user message; the partner sees its own replies as ``assistant`` and the
proxy's turns as ``user``. ``max_turns`` caps the policy turns (default: the number of real user turns); a
leading "User:" label is stripped from a policy turn. An empty policy reply ends the conversation (then judged),
no reply at all (utterance None) scores 0.

Reward (Eq 4's r_d): MirrorBench's GTEval metric, the one OdysSim trains on: a judge compares the user turns of
the real conversation (cut at the last re-enacted user turn) with the proxy's for style, tone, realism and
contextual fit -- not content -- and returns ``{"score": s}`` with s in [0, 1]; r = s. An unreadable or
out-of-range score is asked again once, then the episode is INVALID. (OdysSim's lexical MATTR / HD-D / Yule's K
gaps are batch statistics it only logs.)

Record (OdysSim's field names; the row's ``extra_info``): ``turns`` [{``role``: "user" | "assistant",
``content`` str}] (at least one user turn among the first 10), optional ``task_description`` str; other fields
(``conversation_id``, ``few_shot_user_examples``, ...) are not read.
"""

from __future__ import annotations

import re

from mimesis_jax.envs.agent_env import EnvError
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.sim_env import SimTurn
from mimesis_jax.envs.soul.base import JudgeEnv, register

MAX_REAL_TURNS = 10
_USER_LABEL = re.compile(r"^\s*user\s*:\s*", re.IGNORECASE)


def schedule(turns: list[dict]) -> list[dict]:
    """The real turns to re-enact: the first 10, trailing assistant turns dropped."""
    kept = list(turns[:MAX_REAL_TURNS])
    while kept and kept[-1]["role"] == "assistant":
        kept.pop()
    return kept


def format_turns(turns: list[dict]) -> str:
    return "\n".join(f"{t['role'].upper()}: {t['content']}" for t in turns)


@register
class MirrorBench(JudgeEnv):
    name = "mirrorbench"
    multi_turn = True
    score_range = (0.0, 1.0)
    protocol = ("write the user turns of a real conversation from its task description only; a partner model "
                "mirrors the real assistant; one policy turn per real user turn (max 10 real turns)")
    reward_doc = "GTEval judge: similarity of the proxy's user turns to the real ones in style and realism, in [0, 1]"
    record_format = "turns [{role: user|assistant, content}]; optional task_description"
    fields = (("turns", list, False), ("task_description", str, True))

    @classmethod
    def parse_record(cls, record, where):
        record = super().parse_record(record, where)
        for i, t in enumerate(record["turns"]):
            role = field(t, "role", str, f"{where}, turns[{i}]")
            if role not in ("user", "assistant"):
                raise EnvError(f"{where}, turns[{i}]: field 'role' must be 'user' or 'assistant', got {role!r}")
            field(t, "content", str, f"{where}, turns[{i}]")
        if not any(t["role"] == "user" for t in schedule(record["turns"])):
            raise EnvError(f"{where}: field 'turns' has no user turn among its first {MAX_REAL_TURNS}")
        return record

    def __init__(self, record: dict, *, max_turns: int | None = None, **kwargs):
        super().__init__(record, max_turns=max_turns, **kwargs)
        real = schedule(record["turns"])
        n_user = sum(t["role"] == "user" for t in real)
        self.max_policy_turns = min(n_user, max_turns) if max_turns is not None else n_user
        # the real turns re-enacted: through the max_policy_turns-th user turn
        seen, self.real = 0, []
        for t in real:
            seen += t["role"] == "user"
            self.real.append(t)
            if seen == self.max_policy_turns:
                break
        self.sim: list[dict] = []  # the re-enacted conversation, true roles

    # -------------------------------------------------------------- views
    def _assistant_run(self, start: int) -> int:
        """How many real assistant turns follow position `start` before the next user turn."""
        n = 0
        while start + n < len(self.real) and self.real[start + n]["role"] == "assistant":
            n += 1
        return n

    def _partner_replies(self, count: int) -> str:
        """`count` partner replies (added to `sim`), as the policy is shown them, with the next-turn request."""
        shown = []
        for _ in range(count):
            reply = self.ask_partner(self.partner_messages())
            self.sim.append({"role": "assistant", "content": reply})
            shown.append(self.prompt("observation", reply=reply))
        return "\n\n".join(shown + [self.prompt("next_turn")])

    def initial_messages(self):
        self.sim = []
        system = self.prompt("proxy", task=self.record.get("task_description") or "(not given)")
        return [{"role": "system", "content": system},
                {"role": "user", "content": self._partner_replies(self._assistant_run(0))}]

    def partner_messages(self):
        return [{"role": "system", "content": self.prompt("mirror", conversation=format_turns(self.real))}] + \
            [dict(t) for t in self.sim]

    # -------------------------------------------------------------- protocol
    def step(self, thought, utterance):
        self.replies.append(utterance)
        if utterance is None:
            return SimTurn(done=True, reward=0.0, info={"end": "no_utterance", "policy_turns": len(self.replies)})
        text = _USER_LABEL.sub("", utterance).strip()
        if not text:
            return self._finish("empty_reply")
        self.view.append({"role": "assistant", "content": utterance})
        self.sim.append({"role": "user", "content": text})
        if len(self.replies) >= self.max_policy_turns:
            return self._finish("judged")
        after = [i + 1 for i, t in enumerate(self.real) if t["role"] == "user"][len(self.replies) - 1]
        msg = {"role": "user", "content": self._partner_replies(self._assistant_run(after))}
        self.view.append(msg)
        return SimTurn(done=False, messages=[msg])

    # -------------------------------------------------------------- judging
    def judge_messages(self):
        return [{"role": "user", "content": self.prompt("judge", real=format_turns(self.real),
                                                        proxy=format_turns(self.sim) or "(no turns)")}]
