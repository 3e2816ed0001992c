"""FunctionGym (docs/reference/environments.md, "The gyms"): find a hidden arithmetic rule over four numbers, then answer it on
the test case. No LLM takes part: the environment computes everything itself.

Data: `functions.json` (UserRL's file name and format): a list of records
``{"id": "func-1", "rule": "a * b + c - d", "test_case": [4, 7, 2, 9], "expected_result": 21.0}``.
A task's create arguments name the record (`id`) and may set `max_turns` (default 15 steps: UserRL's
`InteractTool.create(max_turns=15)`; FunctionEnv's own config default is 20).

Rules, as UserRL's FunctionGym has them (every step's reward is 0.0 unless stated):

* ``[action] ...`` -- every number in the content (pattern ``-?\\d+(\\.\\d*)?``, read as floats; "1, 2, 3, 4" and
  "1 2 3 4" both work) is an input. Empty content -> FB_NO_NUMBERS; not exactly four numbers -> FB_NOT_FOUR; the
  four numbers equal to the test case (same order, compared as numbers, so "4.0 7 2 9" is the test case
  [4, 7, 2, 9] too) -> FB_TEST_CASE, no value; otherwise the rule is evaluated on the floats, the result rounded
  with Python's ``round(x, 4)`` and reported with FB_RESULT (the inputs shown as a list of floats, e.g.
  [1.0, 2.0, 3.0, 4.0]). Any arithmetic failure (division by zero, overflow of a power, a complex power of a
  negative number) -> FB_CALC_ERROR; the episode goes on.
* ``[search] test`` (case-insensitive) -> FB_TEST_CASE_IS with the test case, e.g. [4, 7, 2, 9]; any other
  content -> FB_SEARCH_ONLY_TEST.
* ``[answer] x`` -- x is read with Python's ``float`` (empty -> FB_ANSWER_EMPTY; unreadable ->
  FB_ANSWER_NOT_NUMBER); correct when ``abs(x - expected_result) <= 1e-6`` (UserRL's `compare_answers`): reward
  1.0 (`correct_answer_reward`) and the episode ends; a wrong answer gets 0.0 (`incorrect_answer_reward`), and the
  episode goes on (the agent may answer again).
* ``[finish]`` -- ends the episode, reward 0 (UserRL accepts it; the `interact_with_env` tool of this project offers
  only action/answer/search, so only a direct `step("[finish]")` reaches it).
* any other text -> FB_INVALID, reward 0.
* the episode is truncated after `max_steps` steps (default 15, UserRL's InteractTool); UserRL's `step_penalty` (x step number,
  subtracted from every step's reward) and `normalize_rewards` (clip to [0, 1]) are options, off by default as in
  UserRL.

The feedback texts (the FB_* constants) are this project's own wording; what each one tells the agent, and when,
follows UserRL's rules.

Rules are never run with `eval`: each rule string is parsed with `ast` at load time and accepted only when it is
built from numbers, the variables a b c d, the operators + - * / ** (binary), unary minus and parentheses;
anything else is an EnvError naming the file, the record and its id. Evaluation uses Python's own float
arithmetic on those nodes, so results (and failures) are those of UserRL's evaluation of the same string.

Choices where UserRL is ambiguous or unsafe (written down here):
* `int ** int` with an exponent above 1,000 (possible only between two literal constants, never with a, b, c, d,
  which are floats) is computed in floats (an overflow error, like float powers) instead of as a huge integer.
* step info carries `function_id` (and the parsed numbers / submitted answer), not the hidden rule or the expected
  result, since trajectories record step info; `FunctionGym.record` holds them for callers that need them.
* UserRL marks a step both terminated and truncated when a correct answer arrives on the last step; here (as for
  every gym of this project) such a step is terminated only.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import math
import operator
import os
import pathlib
import re
from typing import Callable, Sequence

from mimesis_jax.envs.agent_env import EnvError, StepResult
from mimesis_jax.envs.model_io import field
from mimesis_jax.envs.userrl.common import USERRL_TOOL_MAX_TURNS, UserRLEnv, data_file, index_records, read_json
from mimesis_jax.envs.userrl.tasks import register_gym

DATA_FILE = "functions.json"  # UserRL's file name
VARIABLES = ("a", "b", "c", "d")
ANSWER_TOLERANCE = 1e-6  # UserRL's compare_answers
RESULT_DIGITS = 4  # UserRL rounds each [action] result with round(x, 4)

# ----------------------------------------------------------------------------------- feedback (this project's wording)
FB_RESET = ("A hidden function of four numbers is ready. Send [action] with four numbers to see what it returns, "
            "[search] test to see the test case, and [answer] with the value you think it gives on the test case.")
FB_INVALID = "Unrecognised step: start it with [action], [search], [answer] or [finish]."
FB_NO_NUMBERS = "[action] needs four numbers after it."
FB_NOT_FOUR = "An [action] takes four numbers, no more and no fewer."
FB_TEST_CASE = "Those four numbers are the test case; finding its value is your task, so it is not revealed."
FB_CALC_ERROR = ("The function has no value on these inputs (a division by zero, for instance). Choose another set "
                 "of four numbers.")
FB_RESULT = "The function maps {numbers} to {result}."
FB_TEST_CASE_IS = "The test case is {test_case}."
FB_SEARCH_ONLY_TEST = "The only search available is 'test' (it reveals the test case)."
FB_ANSWER_EMPTY = "Nothing follows [answer]: give a number."
FB_ANSWER_NOT_NUMBER = "That answer is not a number. Give a single numeric value."
FB_CORRECT = "Right: that is the function's value on the test case!"
FB_WRONG = ("That is not the function's value on the test case. Keep probing the hidden function and answer again "
            "once you have a better guess.")
FB_FINISH_CORRECT = "The episode is over, and you found the right value."
FB_FINISH_WRONG = "The episode is over without a right answer. The function's value on the test case was {expected}."

_NUMBER_RE = re.compile(r"-?\d+(?:\.\d*)?")


# ----------------------------------------------------------------------------------- the rule evaluator
class RuleEvaluationError(ArithmeticError):
    """A rule could not be evaluated on some inputs (e.g. a complex power of a negative number)."""


def _power(x, y):
    if type(x) is int and type(y) is int and abs(y) > 1000:  # two literals: no giant integers
        x = float(x)
    value = x ** y
    if isinstance(value, complex):
        raise RuleEvaluationError(f"{x!r} ** {y!r} is complex")
    return value


_BINARY: dict[type, Callable] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                 ast.Div: operator.truediv, ast.Pow: _power}
_ALLOWED = "numbers, the variables a b c d, + - * / **, unary minus and parentheses"


def _node_text(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # pragma: no cover - unparse handles every node ast.parse makes
        return type(node).__name__


def _build(node: ast.AST, fail: Callable[[str], EnvError]) -> Callable[[Sequence[float]], float]:
    """A closure computing `node` from (a, b, c, d); only the nodes the gym allows."""
    if isinstance(node, ast.Constant):
        value = node.value
        if type(value) not in (int, float):
            raise fail(f"the constant {value!r} is not a number")
        return lambda xs: value
    if isinstance(node, ast.Name):
        if node.id not in VARIABLES:
            raise fail(f"unknown name {node.id!r} (only a, b, c, d)")
        i = VARIABLES.index(node.id)
        return lambda xs: xs[i]
    if isinstance(node, ast.BinOp):
        op = _BINARY.get(type(node.op))
        if op is None:
            raise fail(f"operator {type(node.op).__name__} in {_node_text(node)!r} is not allowed")
        left, right = _build(node.left, fail), _build(node.right, fail)
        return lambda xs: op(left(xs), right(xs))
    if isinstance(node, ast.UnaryOp):
        if not isinstance(node.op, ast.USub):
            raise fail(f"unary {type(node.op).__name__} in {_node_text(node)!r} is not allowed")
        inner = _build(node.operand, fail)
        return lambda xs: -inner(xs)
    raise fail(f"{type(node).__name__} {_node_text(node)!r} is not allowed")


def compile_rule(rule: str, where: str) -> Callable[[Sequence[float]], float]:
    """The hidden rule as a function of (a, b, c, d). `where` names the file/record for errors: anything but
    numbers, a b c d, + - * / **, unary minus and parentheses is an EnvError."""
    def fail(why: str) -> EnvError:
        return EnvError(f"{where}: field 'rule' {rule!r} is not a FunctionGym rule ({why}; allowed: {_ALLOWED})")

    if not isinstance(rule, str) or not rule.strip():
        raise fail("empty")
    try:
        tree = ast.parse(rule.strip(), mode="eval")
    except SyntaxError as e:
        raise fail(f"syntax error: {e.msg}") from None
    except (ValueError, RecursionError, MemoryError) as e:
        raise fail(f"unparseable: {type(e).__name__}") from None
    try:
        return _build(tree.body, fail)
    except RecursionError:
        raise fail("nested too deeply") from None


@dataclasses.dataclass(frozen=True)
class FunctionRecord:
    """One record of functions.json."""

    id: str
    rule: str
    test_case: tuple  # as stored (ints in UserRL's file)
    expected_result: float
    fn: Callable[[Sequence[float]], float] = dataclasses.field(repr=False, compare=False)

    def evaluate(self, numbers: Sequence[float]):
        """The rule on `numbers` rounded as UserRL reports it; raises ArithmeticError (incl. ZeroDivisionError,
        OverflowError, RuleEvaluationError) when the rule cannot be computed there."""
        try:
            value = self.fn([float(x) for x in numbers])
        except RecursionError:
            raise RuleEvaluationError("the rule is nested too deeply") from None
        return round(value, RESULT_DIGITS)


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_records(records, where: str) -> dict[str, FunctionRecord]:
    """Validated records by id; errors name `where` (the file), the record (index and id) and the field."""
    index_records(records, "id", where)  # list, ids present and unique
    out: dict[str, FunctionRecord] = {}
    for i, r in enumerate(records):
        rid = str(r["id"])
        at = f"{where}, record {i} (id {rid!r})"
        rule = field(r, "rule", str, at)
        test_case = field(r, "test_case", list, at)
        if len(test_case) != 4 or not all(_is_number(x) for x in test_case):
            raise EnvError(f"{at}: field 'test_case' must be a list of four numbers, got {test_case!r}")
        expected = field(r, "expected_result", (int, float), at)
        if not math.isfinite(expected):
            raise EnvError(f"{at}: field 'expected_result' must be a finite number, got {expected!r}")
        out[rid] = FunctionRecord(rid, rule, tuple(test_case), float(expected), compile_rule(rule, at))
    return out


@functools.lru_cache(maxsize=16)
def _load(path: str, mtime: float) -> dict[str, FunctionRecord]:
    return parse_records(read_json(path), path)


def load_functions(path: str | os.PathLike | None = None) -> dict[str, FunctionRecord]:
    """Every record of a functions.json (default: the shipped one), validated, by id (cached per file version)."""
    p = data_file(DATA_FILE) if path is None else pathlib.Path(path)
    if not p.is_file():
        raise EnvError(f"FunctionGym data file {p} does not exist")
    return _load(str(p), p.stat().st_mtime)


def parse_numbers(text: str) -> list[float]:
    """Every number in an [action]'s content, as floats (UserRL's reading: "1, 2, 3, 4" -> four numbers)."""
    return [float(m) for m in _NUMBER_RE.findall(text)]


# ----------------------------------------------------------------------------------- the gym
@register_gym("FunctionGym")
class FunctionGym(UserRLEnv):
    """FunctionGym: `[action] a b c d` -> f(a, b, c, d); `[search] test` -> the test case; `[answer] x` -> 1.0 when
    x is f(test case) within 1e-6 (ends the episode). See the module docstring for every rule."""

    prompt_file = "function"
    default_max_steps = USERRL_TOOL_MAX_TURNS  # what UserRL's InteractTool passes, not the gym config's own default
    invalid_action_feedback = FB_INVALID

    def __init__(self, function_id: str, *, data_dir: str | os.PathLike | None = None, max_steps: int | None = None,
                 seed=None, correct_answer_reward: float = 1.0, incorrect_answer_reward: float = 0.0,
                 step_penalty: float = 0.0, normalize_rewards: bool = False):
        super().__init__(max_steps=max_steps, seed=seed)
        path = data_file(DATA_FILE, data_dir)
        records = load_functions(path)
        if str(function_id) not in records:
            raise EnvError(f"{path}: no FunctionGym record with id {function_id!r}")
        if correct_answer_reward < 0:
            raise EnvError(f"{self.name}: correct_answer_reward must be >= 0, got {correct_answer_reward}")
        self.record = records[str(function_id)]
        self.correct_answer_reward, self.incorrect_answer_reward = float(correct_answer_reward), float(
            incorrect_answer_reward)
        self.step_penalty, self.normalize_rewards = float(step_penalty), bool(normalize_rewards)
        self.answered_correctly = False

    @classmethod
    def from_task(cls, task, *, data_dir=None, user=None, judge=None, retriever=None, seed=None, max_steps=None,
                  **options) -> "FunctionGym":
        """The env of a FunctionGym task: create_kwargs {id, max_turns?}; `user`/`judge`/`retriever` are not used
        (no LLM in this gym); options: correct_answer_reward, incorrect_answer_reward, step_penalty,
        normalize_rewards."""
        allowed = {"correct_answer_reward", "incorrect_answer_reward", "step_penalty", "normalize_rewards"}
        unknown = sorted(set(options) - allowed)
        if unknown:
            raise EnvError(f"FunctionGym: unknown options {unknown}; known: {sorted(allowed)}")
        kwargs = dict(task.create_kwargs)
        function_id = kwargs.get("id", task.id)
        if max_steps is None and kwargs.get("max_turns") is not None:
            turns = kwargs["max_turns"]
            if isinstance(turns, bool) or not isinstance(turns, int):
                raise EnvError(f"{task.source or 'task'}: field 'create_kwargs.max_turns' must be an integer, "
                               f"got {turns!r}")
            max_steps = turns
        return cls(str(function_id), data_dir=data_dir, max_steps=max_steps, seed=seed, **options)

    # ------------------------------------------------------------------------------- protocol
    def _reset(self):
        self.answered_correctly = False
        return FB_RESET, {"function_id": self.record.id, "test_case": list(self.record.test_case)}

    def step(self, action_text: str) -> StepResult:
        # UserRL also accepts "[finish]" (ends the episode); everything else goes through the shared dispatch.
        if isinstance(action_text, str) and action_text.strip().startswith("[finish]"):
            if self.done:
                raise EnvError(f"{self.name}: the episode has ended; call reset() first")
            self.step_count += 1
            self.clear_user_turn()
            feedback = (FB_FINISH_CORRECT if self.answered_correctly
                        else FB_FINISH_WRONG.format(expected=self.record.expected_result))
            return self._finish(feedback, 0.0, True, {"finished": True})
        return super().step(action_text)

    def _finish(self, feedback, reward, terminated, info):
        reward = float(reward) - self.step_penalty * self.step_count
        if self.normalize_rewards:
            reward = max(0.0, min(1.0, reward))
        return super()._finish(feedback, reward, terminated, {"function_id": self.record.id, **info})

    # ------------------------------------------------------------------------------- choices
    def _action(self, content: str):
        if not content:
            return FB_NO_NUMBERS, 0.0, False, {"invalid_action": "no numbers"}
        numbers = parse_numbers(content)
        if len(numbers) != 4:
            return FB_NOT_FOUR, 0.0, False, {"invalid_action": f"{len(numbers)} numbers"}
        if numbers == [float(x) for x in self.record.test_case]:
            return FB_TEST_CASE, 0.0, False, {"numbers": numbers, "test_case_refused": True}
        try:
            result = self.record.evaluate(numbers)
        except ArithmeticError as e:
            return FB_CALC_ERROR, 0.0, False, {"numbers": numbers, "error": f"{type(e).__name__}: {e}"}
        return FB_RESULT.format(numbers=numbers, result=result), 0.0, False, {"numbers": numbers, "result": result}

    def _search(self, content: str):
        if content.lower() != "test":
            return FB_SEARCH_ONLY_TEST, 0.0, False, {"invalid_action": "search content is not 'test'"}
        return FB_TEST_CASE_IS.format(test_case=list(self.record.test_case)), 0.0, False, {}

    def _answer(self, content: str):
        if not content:
            return FB_ANSWER_EMPTY, 0.0, False, {"invalid_action": "empty answer"}
        try:
            answer = float(content)
        except ValueError:
            return FB_ANSWER_NOT_NUMBER, 0.0, False, {"invalid_action": "answer is not a number"}
        correct = abs(answer - self.record.expected_result) <= ANSWER_TOLERANCE
        info = {"submitted_answer": answer, "correct": correct}
        if correct:
            self.answered_correctly = True
            return FB_CORRECT, self.correct_answer_reward, True, info
        return FB_WRONG, self.incorrect_answer_reward, False, info
