"""The OpenAI-compatible server: the FastAPI app (openai_api.py), its request checks (openai_requests.py), the
uvicorn server, its backends and checkpoint loading (server.py)."""
