"""The floor every package stands on: what `policy`, `learner` and `sites` may take from
`runtime`, and nothing else.

- `messages`: the msgspec messages every package exchanges (tasks, turns, trajectories,
  groups, events, adapter manifests).
- `config`: the configuration, one frozen struct per section.
- `http`: free ports, listening sockets and the one embedded uvicorn server.
- `files`: files and folders written whole or not at all (temp, fsync, rename).

Modules here import nothing of the project outside this folder (a test keeps it so).
"""
