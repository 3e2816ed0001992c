"""Environments the agent is trained and evaluated in (docs/reference/environments.md): protocol, registry, tool schema."""

from mimesis_jax.envs.agent_env import (  # noqa: F401
    CHOICES, INTERACT_TOOL, TOOL_NAME, Env, EnvError, InvalidEpisode, ToolCall, format_action, make,
    parse_action, parse_tool_call, register, registered, tool_call_text, tool_feedback, visible_reply,
)
