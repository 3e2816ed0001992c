"""A toy free-text gym for CPU runs of the agent RL stage: learnable in minutes by a tiny model.

`KeywordToyEnv` ("ToyKeyword"): the user privately prefers replies whose words start with one letter. Each agent
turn is scored by that preference -- the fraction of the reply's words that start with the letter, clipped to
[0, 1] (0 for an empty reply) -- and the reply is passed to the user simulator (the episode runner's own user turn,
`EpisodeTask.user_messages` = the persona below), whose private thought is what a CSD coach can read in hindsight.
The episode ends after `max_steps` agent turns. The env is free-text (`tool_mode = False`): a tiny random-init agent
writes no valid tool call, but every reply it writes earns a graded reward, so GRPO has signal from step one.

Tasks come from `toy_tasks(n, seed, letter)` (or the `toy:N` mixture source): one opening request each, the same
letter across a run so the preference is learnable without being told.
"""

from __future__ import annotations

import json
import math
import random
import re

from mimesis_jax.envs.agent_env import Env, EnvError, register
from mimesis_jax.envs.userrl.tasks import Task
from mimesis_jax.chat.base import ChatModel, ChatResponse

TOPICS = ("a trip to the sea", "a good book", "a quiet morning", "a new recipe", "a small garden", "a city walk",
          "a rainy weekend", "a music lesson", "a lost key", "a family visit", "a bike ride", "a late train")
_WORD = re.compile(r"[A-Za-z]+")


def keyword_reward(text: str, letter: str) -> float:
    """Fraction of the words of `text` that start with `letter` (case-insensitive); 0.0 with no word."""
    words = _WORD.findall(text)
    if not words:
        return 0.0
    return sum(w[0].lower() == letter for w in words) / len(words)


@register("ToyKeyword")
class KeywordToyEnv(Env):
    name = "ToyKeyword"
    tool_mode = False

    def __init__(self, letter: str = "s", topic: str = "a good book", max_steps: int = 2):
        if not (isinstance(letter, str) and len(letter) == 1 and letter.isalpha()):
            raise EnvError(f"ToyKeyword: 'letter' must be one letter, got {letter!r}")
        if max_steps < 1:
            raise EnvError(f"ToyKeyword: max_steps must be >= 1, got {max_steps}")
        self.letter, self.topic, self.max_steps = letter.lower(), topic, int(max_steps)
        self.steps = 0

    def reset(self, seed=None):
        self.steps = 0
        return {"feedback": f"Talk with the user about {self.topic}."}, {"letter": self.letter}

    def step(self, action_text: str):
        self.steps += 1
        reward = keyword_reward(action_text, self.letter)
        truncated = self.steps >= self.max_steps
        return ({"feedback": ""}, reward, False, truncated,
                {"step": self.steps, "to_user": None if truncated else action_text})

    def user_messages(self) -> list[dict]:
        """The simulator's starting view (the runner's own user turn): system = the persona."""
        return [{"role": "system", "content": self.persona(self.letter)}]

    @staticmethod
    def persona(letter: str) -> str:
        return (f"You are chatting with an assistant. You privately like replies full of words that start with "
                f"the letter '{letter}', and you never say so. Think about how the last reply felt, then answer "
                "briefly.")

    @classmethod
    def from_task(cls, task, *, max_steps=None, **_):
        kw = dict(task.create_kwargs)
        if max_steps is not None:
            kw["max_steps"] = max_steps
        kw.pop("id", None)
        try:
            return cls(**kw)
        except TypeError as e:
            raise EnvError(f"ToyKeyword task {task.id}: bad create arguments {sorted(kw)} ({e})") from None


def toy_tasks(n: int, seed: int = 0, letter: str = "s", max_steps: int = 2):
    """`n` ToyKeyword tasks (userrl Task records): a system prompt, a user opening about a random topic."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        topic = rng.choice(TOPICS)
        out.append(Task(gym="ToyKeyword", id=f"toy-{seed}-{i}",
                        prompt=[{"role": "system", "content": "You are a friendly assistant. Reply in one or two "
                                                              "sentences."},
                                {"role": "user", "content": f"Tell me something about {topic}."}],
                        create_kwargs={"letter": letter, "topic": topic, "max_steps": max_steps},
                        data_source="toy", split="train", index=i))
    return out


# ------------------------------------------------------------------------------------ scripted sides
_LETTER = re.compile(r"start with the letter '([a-z])'")


class ToyUser(ChatModel):
    """A rule-based ToyKeyword user (a `ChatModel` in the simulator's framing: system = the persona, its own turns
    `user`, the agent's `assistant`). Its private thought states how well the last reply matched the secret letter
    -- exactly the hindsight a CSD coach should turn into a note; its utterance never reveals the letter."""

    def chat(self, messages, **_):
        m = _LETTER.search(messages[0].get("content", "")) if messages else None
        letter = m.group(1) if m else "s"
        last = next((x.get("content", "") for x in reversed(messages) if x.get("role") == "assistant"), "")
        words = _WORD.findall(last)
        hits = sum(w[0].lower() == letter for w in words)
        thought = (f"Only {hits} of {len(words)} words in that reply started with '{letter}'. I wanted far more "
                   f"words starting with '{letter}'.")
        return ChatResponse(text=f"<think>\n{thought}\n</think>\n\nHmm. Tell me more.", meta={"model": "toy-user"})


class ToyCoach(ChatModel):
    """A rule-based coach for ToyKeyword: reads the user's thought in the coach prompt (Eq 7 input) and writes the
    note a good coach would -- which letter the words should start with. With `shuffle_seed` set it names a
    random letter of `NULL_LETTERS` instead, whatever the dialogue: the uninformative-notes control. Those letters
    are never a ToyKeyword target in experiments/csd_toy.py (target 's') and the warm start never teaches them,
    so the note is independent of the target. (A random letter of NOTE_LETTERS, as before, was right one time in
    four and still carried signal.)"""

    NOTE_LETTERS = "mpst"  # the letters experiments/csd_toy.py teaches its agent to follow in notes
    NULL_LETTERS = "bdhk"  # the control's letters: never a target, never taught, no example words
    NOTE_WORDS = {  # examples a note gives (a tiny agent copies words from its context far more easily)
        "m": ("moon", "milk", "map", "music", "market", "morning"),
        "p": ("park", "paper", "plan", "piano", "picnic", "path"),
        "s": ("sun", "sea", "sand", "song", "star", "summer"),
        "t": ("tree", "tea", "train", "town", "table", "time"),
    }

    @classmethod
    def note(cls, letter: str) -> str:
        words = cls.NOTE_WORDS.get(letter)
        tail = f", such as {', '.join(words)}" if words else ""
        return f"Use many words that start with '{letter}'{tail}."

    def __init__(self, shuffle_seed: int | None = None):
        self.rng = None if shuffle_seed is None else random.Random(shuffle_seed)

    def chat(self, messages, **_):
        text = "\n".join(x.get("content", "") for x in messages)
        m = re.search(r"words starting with '([a-z])'", text)
        if m is None:
            return ChatResponse(text="NONE")
        letter = m.group(1) if self.rng is None else self.rng.choice(self.NULL_LETTERS)
        return ChatResponse(text=self.note(letter))


# ------------------------------------------------------------------------------------ simulator-stage toy sides
class ToySupportAgent(ChatModel):
    """A rule-based ABCD support agent for CPU runs of Stage I's joint RL (envs/abcd/env.py's fixed side): it
    acknowledges the customer's last message, quoting its first words, and asks for the next detail. The Stage I.3
    rehearsal (plan/rehearse.py) also makes it the `partner` of its multi-turn SOUL domain (MirrorBench's assistant
    "mirror"): there too the simulated user's messages are `user` turns and its replies `assistant` ones."""

    def chat(self, messages, **_):
        last = next((x.get("content", "") for x in reversed(messages) if x.get("role") == "user"), "")
        head = " ".join(_WORD.findall(last)[:6]) or "that"
        return ChatResponse(text=f"Thanks for explaining ({head}). Could you tell me one more detail so I can "
                                 f"finish this for you?", meta={"model": "toy-agent"})


class ToyBehaviourJudge(ChatModel):
    """A rule-based ABCD behaviour judge for CPU runs (the format of envs/abcd/data/prompts.toml's judge): it reads the
    customer lines of the simulated part and scores them on surface features only -- n (naturalness) peaks at
    customer turns of about `target_words` words, e is the fraction of turns that push (a '?' or '!'), p is 1.0
    when the first simulated turn does not push yet, else 0.5, c is 1.0 -- so a tiny simulator has a graded,
    learnable reward. It never flags meta-narration (the environment's pattern check still does).

    It also answers the SOUL Humanual judge (envs/soul/humanual.py, the request of prompts/humanual.toml `judge`),
    as the rehearsal of Stage I.3 asks it (plan/rehearse.py SIM_DOMAINS): every dimension scores
    exp(-((w - w_real) / w_real)^2), w the simulated reply's words and w_real the real reply's (at least 1), so a
    reply about as long as the person's scores best and any reply gets a graded score.

    And the SOUL MirrorBench judge (envs/soul/mirrorbench.py, prompts/mirrorbench.toml `judge`), the multi-turn
    domain of that rehearsal: {"score": min(w, w_real) / max(w, w_real)}, w the mean words of the simulated USER
    turns (0 with none) and w_real the real ones' (at least 1): user turns as long as the real user's score 1, k
    times longer or shorter 1 / k -- never vanishing, so a random policy's long turns still get graded rewards."""

    # the headings around the replies in the Humanual judge's request (envs/soul/prompts/humanual.toml `judge`) and
    # the dimensions it asks for (envs/soul/humanual.py DIMENSIONS; not imported: the SOUL tasks depend on this
    # module's library)
    REAL_REPLY, SIMULATED_REPLY = "## The real reply", "## The simulated reply (score this one)"
    HUMANUAL_DIMENSIONS = ("stance", "emotion", "belief", "value", "goal", "communication")

    # the headings around the two conversations in the MirrorBench judge's request (prompts/mirrorbench.toml `judge`)
    # and the start of the rubric after the second; each turn there is a "ROLE: text" line (mirrorbench.format_turns),
    # a turn's further lines follow it
    MIRROR_REAL, MIRROR_SIMULATED = "## Real conversation", "## Simulated conversation"
    MIRROR_RUBRIC = "\n\nJudge only the USER turns"

    def __init__(self, target_words: int = 12):
        self.target_words = target_words

    @classmethod
    def _section(cls, request: str, heading: str) -> str:
        return request.split(heading, 1)[1].split("\n## ", 1)[0]

    def _humanual(self, request: str) -> ChatResponse:
        real = max(1, len(_WORD.findall(self._section(request, self.REAL_REPLY))))
        words = len(_WORD.findall(self._section(request, self.SIMULATED_REPLY)))
        score = round(math.exp(-((words - real) / real) ** 2), 6)
        return ChatResponse(text=json.dumps({d: score for d in self.HUMANUAL_DIMENSIONS}), meta={"model": "toy-judge"})

    @staticmethod
    def user_turn_words(conversation: str) -> list[int]:
        """The words of each USER turn of a "ROLE: text" conversation (a turn's further lines count to it)."""
        counts, role = [], None
        for line in conversation.splitlines():
            head = re.match(r"(USER|ASSISTANT): ?", line)
            if head:
                role = head.group(1)
                if role == "USER":
                    counts.append(0)
                line = line[head.end():]
            if role == "USER":
                counts[-1] += len(_WORD.findall(line))
        return counts

    def _mirror(self, request: str) -> ChatResponse:
        real = self.user_turn_words(self._section(request, self.MIRROR_REAL))
        sim = self.user_turn_words(self._section(request, self.MIRROR_SIMULATED).split(self.MIRROR_RUBRIC, 1)[0])
        w_real = max(1.0, sum(real) / len(real)) if real else 1.0
        w = sum(sim) / len(sim) if sim else 0.0
        score = round(min(w, w_real) / max(w, w_real), 6)
        return ChatResponse(text=json.dumps({"reasoning": "toy judge", "score": score}), meta={"model": "toy-judge"})

    def chat(self, messages, **_):
        request = messages[-1].get("content", "") if messages else ""
        if self.SIMULATED_REPLY in request and self.REAL_REPLY in request:
            return self._humanual(request)
        if self.MIRROR_SIMULATED in request and self.MIRROR_REAL in request:
            return self._mirror(request)
        simulated = request.split("# Simulated part", 1)[-1]
        turns = [line[len("Customer:"):].strip() for line in simulated.splitlines() if line.startswith("Customer:")]
        if not turns:
            scores = {"e": 0.0, "p": 0.0, "n": 0.0, "c": 1.0}
        else:
            words = [len(_WORD.findall(t)) for t in turns]
            n = sum(math.exp(-((w - self.target_words) / self.target_words) ** 2) for w in words) / len(turns)
            pushes = [("?" in t or "!" in t) for t in turns]
            scores = {"e": sum(pushes) / len(turns), "p": 0.5 if pushes[0] else 1.0, "n": round(n, 6), "c": 1.0}
        return ChatResponse(text=json.dumps({**scores, "meta_narration": False, "rationale": "toy judge"}),
                            meta={"model": "toy-judge"})

