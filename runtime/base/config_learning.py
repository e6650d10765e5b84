"""The sections of the configuration that train: `[learner]` (M-GRPO or WebRL on a LoRA
adapter), `[webrl]` (WebRL's phases) and `[bc]` (the behaviour-cloning warm-up).
`runtime.base.config` gathers them into `Config` with the others and is the one module
to import them from.
"""

from __future__ import annotations

from typing import Literal

from runtime.base.config_fields import (
    Fraction,
    NonNegative,
    NonNegativeFloat,
    Positive,
    PositiveFloat,
    Section,
)

__all__ = ["BCConfig", "LearnerConfig", "WebRLConfig"]


class LearnerConfig(Section, frozen=True):
    """The learner: M-GRPO (or WebRL, `[webrl]`) on a LoRA adapter."""

    enabled: bool = True
    # "mgrpo": WebAgent-R1's on-policy groups and clipped loss (learner.engine). "webrl":
    # WebRL's phases (learner.webrl_engine): each update is a phase of `batch_groups`
    # groups, trained with a critic, the KL-constrained loss and a replay buffer, and its
    # failed tasks seed new ones (runtime.evolution). Same runtime, store and hot-swap.
    algorithm: Literal["mgrpo", "webrl"] = "mgrpo"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Data-parallel ranks on this host (learner.ranks): rank 0 is this process, ranks
    # 1..N-1 processes of their own; gloo on the CPU, NCCL on GPUs (rank k on GPU k).
    data_parallel: Positive = 1
    # A collective that waits longer than this fails the update (a rank that died).
    data_parallel_timeout_s: PositiveFloat = 600.0
    # 0 freezes the adapter (a control run: updates, publishing and checkpoints still run).
    # SmolLM2's top-10 LoRA from BC, 2 optimizer steps an update: at 1e-3 an update moved
    # the policy by approx KL 1.4-1.8e-3 with 0.4-0.6% of tokens clipped (4 updates,
    # bench.learning --rl-lr 1e-3); 1e-4 barely moves it in the few updates a CPU hour gives.
    learning_rate: NonNegativeFloat = 1e-3
    weight_decay: NonNegativeFloat = 0.0
    warmup_steps: NonNegative = 0
    schedule: Literal["constant", "cosine"] = "constant"
    total_steps: NonNegative = 0
    # Groups with mixed rewards an update trains on (the others are set aside).
    batch_groups: Positive = 2
    # Passes over each batch (PPO's epochs); each pass is `minibatches` optimizer steps.
    # From the second step on, the PPO ratio and clip act.
    optimizer_steps: Positive = 2
    # Each pass over the batch split into this many optimizer steps, each on its own share
    # of the turns (PPO's minibatches; a share's loss is scaled by their number, so a step
    # has the full batch's scale). An update costs `optimizer_steps` forward+backward
    # passes over the batch's tokens, whatever this is.
    minibatches: Positive = 1
    # Padded tokens a forward+backward holds at once (gradients accumulate over them). On
    # SmolLM2-135M (top-10 LoRA, 16 turns of ~790 tokens, bfloat16 on an AMX Xeon, 1 thread,
    # `python -m bench.learner_memory`): 4,096 peaked at 3.54 GiB (glibc malloc) in 36.7 s
    # an update, 1,024 at 2.28 GiB in 34.2 s.
    micro_batch_tokens: Positive = 1024
    grad_clip: PositiveFloat = 1.0
    max_staleness: NonNegative = 1
    clip_eps_low: NonNegativeFloat = 0.2
    clip_eps_high: NonNegativeFloat = 0.2
    # A KL term to the base model (the adapter disabled), k3 per token (M-GRPO's loss).
    # On with the BC term below, as measured: both belong to the one configuration whose
    # gain repeated over 3 seeds (docs/model.md, "Three seeds of RL with the BC term").
    # From the prefix BC, 75 minutes, one seed each: 0.2 gave +6.4 test / -5.8 ood points
    # against 0.05's +7.3 / -7.5 (the KL is taken on the states RL visits; the ood loss is
    # elsewhere).
    kl_beta: NonNegativeFloat = 0.05
    # A behaviour-cloning term in every M-GRPO optimizer step (InstructGPT's PPO-ptx mixes
    # a supervised term into RL the same way): plus `bc_coef` times the mean negative
    # log-likelihood of `bc_turns` demonstrated turns of `bc_demos`, drawn anew each
    # update. It keeps what BC taught while RL moves other templates (seeds without it
    # lost templates BC solved). Each step forwards and backwards the drawn turns too.
    # SmolLM2, 2-core AMX Xeon, from the first run's model, curriculum "signal" (ceiling
    # 0.5), kl_beta 0.05, 40 minutes, 3 seeds: 1.0 with 32 turns took the whole test split
    # from 19.2% to 32.4% (+13.2 points, +14.2/+15.1/+10.5), without it +9.1 and +0.9 (2
    # seeds); an update a median 128-182 s against 72-78 s; BC continued as long did
    # better on test (39.7%) and worse on ood (docs/model.md). 0: off.
    bc_coef: NonNegativeFloat = 1.0
    bc_turns: Positive = 32
    # The demonstrations (a trajectory store, as `webagent demos` writes). "auto": the
    # embedded default's own, `<daemon.data_dir>/demos/train.jsonl` (its first run writes
    # them), when the daemon trains that model with "mgrpo" on one rank; anywhere else
    # (`policy.model` set, WebRL, data_parallel > 1) "auto" leaves the term off
    # (`runtime.bootstrap.bc_term_of`). A path: that file, which must exist.
    bc_demos: str = "auto"
    adv_eps: PositiveFloat = 1e-4
    # Old log-probs for the importance ratio: the server's sampled ones (False, the
    # default: they are the behaviour policy's, and the update costs one forward+backward;
    # tests/policy/test_pretrained.py checks they equal the learner's own), or recomputed
    # by the learner before the update (True: one more forward over every token).
    recompute_logprobs: bool = False
    mask_think: bool = False
    lora_rank: Positive = 8
    lora_alpha: Positive = 16
    lora_dropout: Fraction = 0.0
    lora_targets: tuple[str, ...] = (
        "q_proj",
        "k_proj",
        "v_proj",
        "o_proj",
        "gate_proj",
        "up_proj",
        "down_proj",
    )
    # LoRA on the top N transformer layers only (0, or N >= the model's layers: every
    # layer). Below the lowest adapted layer nothing needs a gradient, so the backward pass
    # and its saved activations stop there. SmolLM2-135M (30 layers), 1,024 tokens, one
    # thread: forward+backward 5.0 CPU-s with the top 10 against 8.3 with all 30; BC with
    # all 30 at 4,096-token micro-batches was killed for memory at 13.5 GB RSS.
    lora_layers: NonNegative = 10
    # Run the layers below the lowest adapted one once per micro-batch of an update and
    # keep their output for its reference and each optimizer pass (`learner.frozen`):
    # they are the base model's in every one of those forwards. SmolLM2, top-10 LoRA, 16
    # turns + the BC term's 16, 2 threads: an update 48.5 s against 61.3 s (bench.learner).
    reuse_frozen: bool = True
    # Precision of the learner's and BC's matrix products (weights and optimizer stay
    # float32): "auto" is bfloat16 autocast on a CUDA GPU with bf16, and on a CPU where a
    # short timing says it is faster (`learner.precision.cpu_bfloat16_faster`), else float32.
    # SmolLM2-135M, top-10 LoRA, 8 x 520 tokens, 2 threads: on a Zen 4 660 trained tokens/s
    # against 380 in float32; on a Xeon with AVX512-BF16 and no AMX 271 against 437.
    # Log-probs in bfloat16 differ from float32 by 4e-4 (median), 0.10 (max).
    compute_dtype: Literal["auto", "float32", "bfloat16"] = "auto"
    # Keep only each transformer layer's input through the forward pass and recompute the
    # rest during the backward (torch's non-reentrant checkpointing). Same run as above, at
    # 4,096 tokens: peak 2.95 against 3.54 GiB (glibc), 1.79 against 2.73 (TCMalloc), but
    # 2.0-2.6x the time an update: off unless memory is what runs out.
    gradient_checkpointing: bool = False
    seed: int = 0
    # torch intra-op threads of the learner (0: torch's default, one per core). The learner
    # shares the CPU with vLLM and Chromium: 1 thread (see bc.torch_threads).
    torch_threads: NonNegative = 1
    # torch threads while no episode runs (the rollouts wait for the learner, or none is
    # left to run): 0, one per core. Set to torch_threads to keep one count. WebRL's phase
    # on a 2-core Xeon with AMX, with scheduler.only_fresh_groups: a median 158 s with 0
    # against 221 s with 1 (docs/model.md).
    idle_threads: NonNegative = 0
    # Complete checkpoints kept on disk (the newest ones).
    keep_checkpoints: Positive = 2
    # Published adapter folders kept on disk (the newest; 0 keeps all). Never fewer than
    # max_staleness + 2, so that every adapter the server may still hold (and reload after
    # a restart) is on disk. A rank-8 LoRA of an 8B model is ~80 MB a version.
    keep_adapters: NonNegative = 16

    def __post_init__(self) -> None:
        if self.algorithm == "webrl" and self.data_parallel > 1:
            raise ValueError('algorithm "webrl" trains on one rank: set data_parallel = 1')
        if self.bc_coef > 0 and self.bc_demos != "auto":
            if not self.bc_demos:
                raise ValueError(
                    'bc_coef > 0 needs bc_demos, "auto" or a file of demonstrations '
                    "(the first run's: .webagent/demos/train.jsonl)"
                )
            if self.algorithm != "mgrpo" or self.data_parallel > 1:
                raise ValueError('bc_coef > 0 is a term of "mgrpo" on one rank')


class WebRLConfig(Section, frozen=True):
    """WebRL (arXiv 2411.02337), when `learner.algorithm = "webrl"`. The phase is one
    learner update (`learner.batch_groups` groups); `learner.optimizer_steps` actor steps
    a phase, at `learner.learning_rate`."""

    # A_t = lam (r_t + gamma V(s_t+1) - V(s_t)) + (1 - lam) (gamma^(T-t) r_T - V(s_t)),
    # the paper's settings (learner.webrl.step_advantages).
    lam: Fraction = 0.5
    gamma: Fraction = 0.9
    # The actor's loss (beta log(pi/pi_ref) - A)^2 moves an action's log-ratio (summed over
    # its tokens) toward A / beta: 1.0 lets one phase move it by at most about one nat.
    beta: PositiveFloat = 1.0
    # Critic: V(s, I) = a LoRA of its own on the base model and a linear head, trained on
    # every state of the phase's evaluated episodes: this many optimizer steps of
    # `critic_batch` states each (drawn in shuffled passes), at this learning rate.
    # Measured (SmolLM2 after 15 minutes of BC, 2 groups of 4 a phase, 53-55 actions, 2
    # actor steps, on the 2-core Xeon while tests ran beside it): 566 and 608 s a phase,
    # peak RSS of the daemon (policy, critic, sites) 3.35 GB. A phase trains every action
    # of its episodes (M-GRPO only those of mixed groups), and the critic's 64 states add
    # about a third.
    critic_steps: NonNegative = 8
    critic_batch: Positive = 8
    critic_learning_rate: PositiveFloat = 1e-3
    # Replay: successful episodes of earlier phases (the newest `replay_size`); each
    # phase draws at most `replay_ratio` x its new actions from them, then keeps those
    # whose perplexity under the actor lies in [perplexity_low, perplexity_high].
    replay_size: NonNegative = 256
    replay_ratio: NonNegativeFloat = 2.0
    perplexity_low: PositiveFloat = 1 / 0.95
    perplexity_high: PositiveFloat = 1 / 0.5
    # Curriculum: each failed task of a phase (no episode succeeded) gets up to this many
    # new tasks (0: none), from the built-in suite's templates, or on WebArena from the
    # generator below; one is run when the critic's value of its first state lies strictly
    # between task_value_low and task_value_high.
    evolve_per_parent: NonNegative = 2
    task_value_low: Fraction = 0.05
    task_value_high: Fraction = 0.75
    # Self-hosted WebArena: the chat model (OpenAI-compatible: base URL, model) that writes
    # new intents from failed tasks and judges their feasibility (sites.generate); its
    # tasks have no evaluator, so sites.orm_judge scores them. Empty URL: no new tasks.
    generator_url: str = ""
    generator_model: str = ""
    # Environment variable the CLI reads the generator's API key from (empty: no key).
    generator_api_key_env: str = "OPENAI_API_KEY"
    generator_timeout_s: PositiveFloat = 120.0

    def __post_init__(self) -> None:
        if self.perplexity_low > self.perplexity_high:
            raise ValueError("perplexity_low must not exceed perplexity_high")
        if self.task_value_low >= self.task_value_high:
            raise ValueError("task_value_low must be below task_value_high")
        if self.generator_url and not self.generator_model:
            raise ValueError("generator_model is required when generator_url is set")


class BCConfig(Section, frozen=True):
    """Behaviour-cloning warm-up on the oracle's demonstrations."""

    # Defaults for the embedded default's SmolLM2-135M with LoRA (a turn is ~520 tokens;
    # at 5e-4, 20 steps of 8 left the loss at 1.98 and no turn right). Steps count more than
    # turns a step: on an Ice Lake Xeon, 400 turns as 100 steps of 4 got 82% of held-out
    # actions right (teacher-forced; whole replies 16%), as 51 steps of 8 62% (6%), in 857
    # and ~800 s of training (one run each); greedy on 40 test tasks both solved none.
    # 15 minutes there, the first run's demonstrations, one run each: at 2e-3 (127 steps)
    # the same 120 held-out turns had a reply NLL of 0.194 against 0.256 at 1e-3 (108
    # steps), whole replies right 25% against 18%; free-running on 248 test turns 23%
    # against 18% (bench.freerun); greedy on 40 test tasks 1 against 0 solved, 3 episodes
    # ended repeating an action against 19. 3e-3 and 4e-3 were no better on an idle machine
    # (NLL 0.154, 0.163 against 0.152 at 2e-3; docs/model.md).
    learning_rate: PositiveFloat = 2e-3
    batch_size: Positive = 4
    warmup_steps: NonNegative = 5
    # After warm-up: "constant", or "cosine" from learning_rate down to 0 at the end of the
    # run's bound (max_steps, or max_minutes less the final evaluation; learner.bc.
    # budget_progress). Cosine from 1e-3 measured worse than constant 1e-3 in the 15
    # minutes above: reply NLL 0.323, whole replies 5%, free-running 6.5% (greedy 2 of 40).
    schedule: Literal["constant", "cosine"] = "constant"
    max_steps: NonNegative = 0
    # Wall minutes of BC, its final evaluation included (the bootstrap's largest stage;
    # make run's first update comes after it). The first run on an Ice Lake Xeon ended
    # 2.1 minutes past 15 without that: an evaluation at step 50, one step, another at 51.
    max_minutes: NonNegativeFloat = 15.0
    # Also write the model as it was at these wall minutes (each evaluated, beside the
    # output folder as `<out>-<M>m`): the closed-loop curve of BC minutes from one run.
    snapshot_minutes: tuple[PositiveFloat, ...] = ()
    # Train tasks the bootstrap records demonstrations of (the first N of the shuffled
    # split that `demo_max_steps` allows; 0: all).
    demo_tasks: NonNegative = 500
    # Only tasks whose scripted solution takes at most this many steps, its exit included
    # (0: any length; a task of unknown length is kept): the first run teaches the short
    # tasks its RL starts on (scheduler.curriculum "short_first"). On a 2-core AMD EPYC
    # (Zen 2), 15 minutes of BC: on 500 tasks of any length (2,100 turns; 37% of them end
    # with an empty exit message, the commands) 83 steps, held-out actions right 77%, and
    # the model ended most answers with `exit(message="")`: 1 of 44 training episodes
    # solved in 8 minutes of rollouts, no update. On 500 tasks of at most 3 steps (1,231
    # turns, 1.5 minutes to record) 103-112 steps, 92-96% right; in four runs 5 of 76, 9 of
    # 44, 19 of 48 and 28 of 76 episodes solved, the first update 1.8-6.6 minutes after
    # rollouts began (20.9, 21.7 and 26.2 minutes after a clean clone's `make run` began;
    # docs/model.md). On a 2-core Xeon with AMX (bench.recipe, 15 minutes, greedy): 500
    # tasks of at most 3 steps, 309 steps, 36.1% of test and 11.7% of ood; 500 of at most
    # 6 (1,768 turns), 278 steps, 71% of its train turns right, 7 of the first 104 test
    # tasks against 42 (it repeated actions where the other answered).
    demo_max_steps: NonNegative = 3
    # Stop early once held-out episode success reaches this (0 disables).
    target_success: Fraction = 0.0
    # Each evaluation scores 2 x eval_examples turns (~40 s on a Zen 4, ~100 s on an Ice
    # Lake Xeon): every 100 steps of 4 turns is about a tenth of BC's minutes there. Under
    # max_minutes one is skipped unless a whole period and the final evaluation fit after
    # it (learner.bc.periodic_eval_fits).
    eval_every_steps: Positive = 100
    # Weight of a language-model loss on the prompt tokens (system prompt, task, pages,
    # earlier actions): their mean negative log-likelihood over the minibatch, added to
    # the completion loss. "auto": 1.0 for a tiny model made here (`tiny_model.json`), 0
    # for any other model. Tiny recipe, 30 minutes (bench/recipe.py, side by side runs):
    # test action accuracy 0.555 against 0.507, whole turn 0.260 against 0.255, closed loop
    # 4/219 against 2/219, at 1.44x the time a step.
    prompt_loss: NonNegativeFloat | Literal["auto"] = "auto"
    # Full fine-tuning for tiny models, LoRA for large ones; "auto" decides by size.
    mode: Literal["auto", "full", "lora"] = "auto"
    seed: int = 0
    # Stop early once held-out per-step action accuracy reaches this (0 disables).
    target_accuracy: Fraction = 0.0
    # Share of the demonstrations' tasks held out for accuracy when no held-out file is given.
    heldout_fraction: Fraction = 0.1
    # Held-out (and train) turns scored at each evaluation (a fixed, seeded subset).
    eval_examples: Positive = 48
    # Padded tokens a forward+backward holds at once; a micro-batch's rows are left-padded
    # to its longest. SmolLM2, 4 turns a step (~590 tokens each), Ice Lake, 2 threads: 4,096
    # put a step's turns in one micro-batch, a third of it padding, 10.2 s a step; 1,024
    # (about one turn each) 7.3 s, 1.40x the steps in the same minutes (`python -m
    # bench.bc_step`, docs/results.md).
    micro_batch_tokens: Positive = 1024
    weight_decay: NonNegativeFloat = 0.0
    grad_clip: PositiveFloat = 1.0
    device: Literal["auto", "cpu", "cuda"] = "auto"
    # Models up to this many parameters are fully fine-tuned in mode "auto"; larger: LoRA.
    full_max_params: Positive = 100_000_000
    # torch intra-op threads (0: torch's default, one per core). BC runs alone (before the
    # server and the browsers start): on an idle 2-core machine 40 steps of the tiny recipe
    # took 82 s with 2 threads and 147 s with 1 (1.8x, twice each, side by side). Where BC
    # shares the CPU set 1: under load 1 thread ran a BC step 25x faster than 2 (OpenMP
    # threads spinning).
    torch_threads: NonNegative = 0
