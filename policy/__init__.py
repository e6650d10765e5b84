"""The policy layer: prompts, the vLLM server and client, adapter versions and hot-swap."""

__all__: list[str] = []
