"""Web environments: WebArena's task format, evaluators, the built-in sites, WebArena."""

__all__: list[str] = []
