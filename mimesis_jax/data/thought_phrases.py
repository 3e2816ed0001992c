"""The fixed sentences of the ThoughtTrace thought and persona templates (data/thoughttrace.py renders them).

They live apart so the tiny tokenizer (data/tokenizer.py) can train on them without importing the SFT data
builder, which itself imports the chat renderer and the tokenizer: every import in data/ runs one way.
"""

REASON_LABELS = {
    "task_motivation": "I'm writing this because of the goal I have in mind.",
    "task_continuation": "I want to keep the task moving.",
    "task_reorientation": "I want to change direction.",
    "context_grounding_and_constraints": "I need to give the assistant some context or constraints.",
    "content_expectation": "I have a clear idea of what the answer should contain.",
    "style_expectation": "I care about how the answer is presented.",
    "social_and_others": "This is more social than about the task.",
}
REACTION_LABELS = {
    "explicit_affirmation": "That reply worked for me.",
    "partial_satisfaction": "That reply only partly worked for me.",
    "content_relevance": "That reply got the content wrong or missed my point.",
    "presentation_style": "I didn't like how that reply was written or laid out.",
    "scope_fit": "That reply's scope didn't fit what I needed.",
}
PERSONA_PREFIXES = ("Your task: ", "What you expect from the assistant: ", "About you: ")


def template_phrases() -> list[str]:
    """Every fixed sentence the thought and persona templates emit (training text for the tiny tokenizer)."""
    return list(REASON_LABELS.values()) + list(REACTION_LABELS.values()) + list(PERSONA_PREFIXES)
