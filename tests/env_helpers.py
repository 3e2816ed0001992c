"""Environments for tests: `SecretWordEnv`, a scripted agent-world game (registered as "secret_word")."""

from __future__ import annotations

from mimesis_jax.envs.agent_env import Env, EnvError, parse_action, register


@register("secret_word")
class SecretWordEnv(Env):
    """A tiny scripted game: find the secret word the user knows.

    `[action] text` talks to the user (the user simulator answers); `[search] hint` returns the hint;
    `[answer] word` scores 1.0 and ends the episode when right (case-insensitive), 0.0 otherwise. The episode is
    truncated after `max_steps` steps. A user utterance containing `stop_marker` ends the episode.
    """

    name = "secret_word"
    invalid_action_feedback = "That step was not understood: start it with [action], [search] or [answer]."

    def __init__(self, secret: str, hint: str = "", max_steps: int = 20, stop_marker: str = "###STOP###"):
        if not secret or not isinstance(secret, str):
            raise EnvError("secret_word: 'secret' must be a non-empty string")
        self.secret, self.hint, self.max_steps, self.stop_marker = secret, hint, int(max_steps), stop_marker
        self.steps = 0

    def reset(self, seed=None):
        self.steps = 0
        return {"feedback": "A secret word is hidden. Ask the user with [action], get a hint with [search] hint, "
                            "or answer with [answer] <word>."}, {"secret_len": len(self.secret)}

    def step(self, action_text):
        self.steps += 1
        parsed = parse_action(action_text)
        reward, terminated, info = 0.0, False, {"step": self.steps}
        if parsed is None:
            feedback = self.invalid_action_feedback
            info["invalid_action"] = "no [action]/[answer]/[search] prefix"
        elif parsed[0] == "action":
            feedback = "Your message was delivered to the user."
            info["to_user"] = parsed[1]
        elif parsed[0] == "search":
            feedback = f"Hint: {self.hint}" if parsed[1].lower() == "hint" else "Only 'hint' can be searched."
        elif parsed[1].strip().lower() == self.secret.lower():
            feedback, reward, terminated = "Correct!", 1.0, True
        else:
            feedback = "Wrong answer."
        truncated = not terminated and self.steps >= self.max_steps
        return {"feedback": feedback}, reward, terminated, truncated, info

    def invalid_action(self, reason):
        self.steps += 1
        obs, reward, terminated, truncated, info = super().invalid_action(reason)
        return obs, reward, terminated, self.steps >= self.max_steps, {**info, "step": self.steps}

    def observe_user(self, utterance):
        ended = self.stop_marker in utterance
        return 0.0, ended, ({"user_stopped": True} if ended else {})
