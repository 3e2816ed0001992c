"""Chat models: the `ChatModel` interface (base.py), local models over this project's generators (endpoints.py,
engine_chat.py), OpenAI-compatible remotes, model specs named on the command line (specs.py), concurrent calls
batched in process (batching.py), refusal detection (refusal.py)."""
