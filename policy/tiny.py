"""A tiny causal LM made locally: a Qwen2 model and a byte-level BPE tokenizer with ChatML.

Nothing is downloaded: the tokenizer is trained with `tokenizers` on texts the caller
passes in (the system prompt, DSL examples, the built-in sites' pages and intents), the
model is randomly initialised from a seed, and both are saved with `save_pretrained` so
vLLM serves the folder and transformers loads it.

The sizes (`TinyModelSpec`) and the tokenizer recipe (`TokenizerRecipe`) are small frozen
structs so that the model recipe of the embedded default can change them. torch and
transformers are imported inside `make_tiny_model` only: importing this module is cheap.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import msgspec

from policy.profile import TINY_INFO_FILE as INFO_FILE
from policy.profile import TINY_PROFILE, ModelProfile, model_profile
from policy.prompt import COMPRESSED_OBSERVATION, SHORT_SYSTEM_PROMPT, SYSTEM_PROMPT
from runtime.base.files import write_folder

if TYPE_CHECKING:
    from tokenizers import Tokenizer

__all__ = [
    "CHATML_TEMPLATE",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "SPECIAL_TOKENS",
    "TINY_PROFILE",
    "TINY_RECIPE",
    "ModelProfile",
    "TinyModelInfo",
    "TinyModelSpec",
    "TokenizerRecipe",
    "base_corpus",
    "make_tiny_model",
    "model_profile",
    "train_tokenizer",
]

_Positive = Annotated[int, msgspec.Meta(ge=1)]

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
SPECIAL_TOKENS = (PAD_TOKEN, IM_START, EOS_TOKEN)

# ChatML, as Qwen2 uses it (without the default system prompt).
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


# Qwen2's pre-tokenizer regex (as transformers' Qwen2Tokenizer rebuilds it).
_QWEN2_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
# Letter runs, single digits, single other characters, whitespace runs.
_WORDS_SPLIT = r"\p{L}+|\p{N}|\s+|[^\s\p{L}\p{N}]"


class TinyModelSpec(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """Sizes of the tiny Qwen2 model; the vocabulary size comes from the tokenizer."""

    hidden_size: _Positive = 256
    num_layers: _Positive = 2
    num_heads: _Positive = 4
    num_kv_heads: _Positive = 2
    intermediate_size: _Positive = 512
    max_position_embeddings: _Positive = 4096
    rope_theta: float = 10000.0
    tie_word_embeddings: bool = True
    initializer_range: float = 0.02


class TokenizerRecipe(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """How the byte-level BPE tokenizer is trained (NFC-normalised, ChatML specials).

    `split` is the pre-tokenizer, the rule for where tokens may not cross:
    - "qwen2": Qwen2's own regex (a word carries one leading non-letter, such as a space
      or `>`; every digit is a token). transformers and vLLM rebuild exactly this
      pipeline for any Qwen2 model, so their encodings equal `PromptRenderer`'s.
    - "words": letters runs, digits, punctuation and whitespace are all split apart, so
      a word has the same tokens whatever precedes it (`>Lamps<` and ` Lamps` share
      `Lamps`). transformers' Qwen2 tokenizer still encodes with Qwen2's regex; encode
      with `PromptRenderer` only (decoding, what vLLM does with our ids, agrees).
    - "ids": as "words", and a compact observation's element id (` [13]`, id 1 to
      `id_tokens`) is one token of its own, so that copying it means learning one
      token -> digits mapping rather than a chain of digit look-ups.
    """

    vocab_size: _Positive = 2048
    min_frequency: _Positive = 2
    split: Literal["qwen2", "words", "ids"] = "qwen2"
    id_tokens: _Positive = 400


# The tokenizer `webagent model init --tiny` makes: words and ids as whole tokens.
TINY_RECIPE = TokenizerRecipe(split="ids")


class TinyModelInfo(msgspec.Struct, frozen=True, kw_only=True):
    """What `make_tiny_model` wrote; also saved as `tiny_model.json` in the folder."""

    path: str
    seed: int
    parameters: int
    vocab_size: int
    corpus_sha256: str
    spec: TinyModelSpec
    recipe: TokenizerRecipe
    profile: ModelProfile = TINY_PROFILE


_ACTIONS = (
    'do(action="Click", element="{id}")',
    'do(action="Hover", element="{id}")',
    'do(action="Type", argument="{word}", element="{id}")',
    'do(action="Search", argument="{word}", element="{id}")',
    'do(action="Select Dropdown Option", argument="{word}", element="{id}")',
    'do(action="Scroll Down")',
    'do(action="Scroll Up")',
    'do(action="Press Enter")',
    'do(action="Goto", argument="http://127.0.0.1/{word}")',
    'do(action="Switch Tab", argument="{small}")',
    'do(action="Wait")',
    "go_backward()",
    "go_forward()",
    'exit(message="{word}")',
)
_WORDS = (
    "lamp",
    "red shoes",
    "order 1042",
    "price",
    "sort by name",
    "blue",
    "2 items",
    "account",
    "cart",
    "search",
)


def base_corpus(seed: int = 0, examples: int = 200) -> list[str]:
    """The policy's own texts: the system prompt, ChatML turns and DSL completions.

    Deterministic for a seed; the caller adds the sites' pages and task intents.
    """
    rng = random.Random(seed)
    texts = [SYSTEM_PROMPT, SHORT_SYSTEM_PROMPT, COMPRESSED_OBSERVATION]
    for _ in range(examples):
        action = rng.choice(_ACTIONS).format(
            id=rng.randrange(200), word=rng.choice(_WORDS), small=rng.randrange(4)
        )
        thought = f"I should look at the {rng.choice(_WORDS)} next."
        texts.append(
            f"{IM_START}user\nRound {rng.randrange(15)}\n{COMPRESSED_OBSERVATION}{EOS_TOKEN}\n"
            f"{IM_START}assistant\n<think>{thought}</think><answer>{action}</answer>{EOS_TOKEN}\n"
        )
    return texts


def train_tokenizer(texts: Iterable[str], recipe: TokenizerRecipe = TokenizerRecipe()) -> Tokenizer:
    """A byte-level BPE `tokenizers.Tokenizer` trained on `texts`, with the ChatML specials.

    Deterministic: the same texts in the same order give the same tokenizer.
    """
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        trainers,
    )

    pattern = _QWEN2_SPLIT if recipe.split == "qwen2" else _WORDS_SPLIT
    tokenizer = Tokenizer(models.BPE())
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(pattern), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        min_frequency=recipe.min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if recipe.split == "ids":
        tokenizer.add_tokens(
            [AddedToken(f" [{i}]", normalized=False) for i in range(1, recipe.id_tokens + 1)]
        )
    return tokenizer


def _corpus_digest(texts: Sequence[str]) -> str:
    digest = hashlib.sha256()
    for text in texts:
        digest.update(text.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()


def make_tiny_model(
    out: str | Path,
    texts: Sequence[str],
    *,
    spec: TinyModelSpec = TinyModelSpec(),
    recipe: TokenizerRecipe = TokenizerRecipe(),
    seed: int = 0,
    overwrite: bool = False,
) -> TinyModelInfo:
    """Train the tokenizer on `texts`, initialise the model from `seed`, save both to `out`.

    The folder appears whole or not at all (written beside it, fsynced, then renamed).
    An existing `out` is an error unless `overwrite`.
    """
    import torch
    from transformers import (
        GenerationConfig,
        PreTrainedTokenizerFast,
        Qwen2Config,
        Qwen2ForCausalLM,
    )
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]

    target = Path(out)
    if target.exists() and not overwrite:
        raise FileExistsError(f"{target} exists (pass overwrite to replace it)")
    tokenizer = train_tokenizer(texts, recipe)
    hf_tokenizer = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHATML_TEMPLATE,
        model_max_length=spec.max_position_embeddings,
    )
    vocab_size = len(hf_tokenizer)
    eos_id = tokenizer.token_to_id(EOS_TOKEN)
    pad_id = tokenizer.token_to_id(PAD_TOKEN)
    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=spec.tie_word_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": spec.rope_theta},
        use_sliding_window=False,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        bos_token_id=None,
        dtype="float32",
    )
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(config)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None
    )
    parameters = sum(p.numel() for p in model.parameters())

    info = TinyModelInfo(
        path=str(target),
        seed=seed,
        parameters=parameters,
        vocab_size=vocab_size,
        corpus_sha256=_corpus_digest(texts),
        spec=spec,
        recipe=recipe,
    )

    def write(tmp: Path) -> None:
        model.save_pretrained(tmp)
        hf_tokenizer.save_pretrained(tmp)
        _put_template_in_tokenizer_config(tmp)
        (tmp / INFO_FILE).write_bytes(msgspec.json.format(msgspec.json.encode(info)))

    write_folder(target, write, replace=True)
    return info


def _put_template_in_tokenizer_config(folder: Path) -> None:
    """Keep the chat template in tokenizer_config.json, where every reader looks for it."""
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text("utf-8"))
    if "chat_template" not in config:
        config["chat_template"] = CHATML_TEMPLATE
        config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", "utf-8")
    (folder / "chat_template.jinja").unlink(missing_ok=True)
