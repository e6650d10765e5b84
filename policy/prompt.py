"""What the model reads: the system prompt, and each turn's messages with compression.

The same functions build the messages of rollouts (runtime), of behaviour-cloning data
and of the learner's samples, and `PromptRenderer` turns them into token ids with the
model's own chat template, so a turn is rendered identically everywhere.

Dynamic context compression (WebAgent-R1): turn t sees the system prompt, the task, every
earlier turn with its observation replaced by `** Simplified html **` and its reply kept
(its thought stripped unless `keep_thoughts`), then the full current observation.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, NoReturn

from jinja2 import Template, TemplateError, nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.parser import Parser
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from policy.errors import ModelFilesError
from runtime.base.messages import ChatMessage, Turn

__all__ = [
    "COMPRESSED_OBSERVATION",
    "SHORT_SYSTEM_PROMPT",
    "SYSTEM_PROMPT",
    "PromptRenderer",
    "build_messages",
    "episode_messages",
    "strip_thought",
    "system_prompt",
    "user_message",
]

COMPRESSED_OBSERVATION = "** Simplified html **"

SYSTEM_PROMPT = """\
You are a web agent. You complete a task in a web browser, one action per round.
Each round shows the current page as simplified HTML; interactive elements carry an id,
e.g. <button id="25">Clear all</button>. Earlier pages are shown as ** Simplified html **.

Reply with your reasoning and exactly one action:
<think>your reasoning</think><answer>ACTION</answer>

ACTION is one of:
do(action="Click", element="ID")
do(action="Right Click", element="ID")
do(action="Type", argument="TEXT", element="ID")
do(action="Search", argument="TEXT", element="ID")
do(action="Hover", element="ID")
do(action="Scroll Up")
do(action="Scroll Down")
do(action="Press Enter")
do(action="Switch Tab", argument="TAB_INDEX")
do(action="Select Dropdown Option", argument="OPTION", element="ID")
do(action="Wait")
do(action="Goto", argument="URL")
go_backward()
go_forward()
exit(message="ANSWER")

Type replaces the text of a field; Search types and presses Enter. Use exit when the task
is done; its message is your answer (leave it empty if the task asks for no answer)."""

# For small models: the same contract in a few tokens. The long prompt
# costs ~250 tokens per turn, which a model that never saw English cannot use anyway.
SHORT_SYSTEM_PROMPT = """\
Web agent. Reply <think>..</think><answer>ACTION</answer>; ACTION is a do(...) action on an
element id, or exit(message="ANSWER")."""


def system_prompt(name: str) -> str:
    """The system prompt called `name`: "full" (WebAgent-R1's) or "short" (tiny models)."""
    prompts = {"full": SYSTEM_PROMPT, "short": SHORT_SYSTEM_PROMPT}
    if name == "auto":
        raise ValueError(
            'policy.system_prompt "auto" is settled against the model before episodes run '
            "(policy.profile.settle_auto)"
        )
    if name not in prompts:
        raise ValueError(f"unknown system prompt {name!r}: expected one of {sorted(prompts)}")
    return prompts[name]


_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)


def strip_thought(completion: str) -> str:
    """The completion without its `<think>...</think>` span(s)."""
    return _THINK.sub("", completion).strip()


def user_message(intent: str, round_index: int, observation: str) -> ChatMessage:
    """The user turn of round `round_index`; the task is stated in round 0."""
    if round_index == 0:
        content = f"Task: {intent}\n\nRound 0\n{observation}"
    else:
        content = f"Round {round_index}\n{observation}"
    return ChatMessage(role="user", content=content)


def build_messages(
    intent: str,
    history: Sequence[str],
    observation: str,
    *,
    keep_thoughts: bool = True,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[ChatMessage]:
    """The messages of the turn after `history` (earlier completions, oldest first).

    Earlier observations are compressed to `COMPRESSED_OBSERVATION`; `observation` is the
    current page in full.
    """
    messages = [ChatMessage(role="system", content=system_prompt)]
    for index, completion in enumerate(history):
        messages.append(user_message(intent, index, COMPRESSED_OBSERVATION))
        kept = completion if keep_thoughts else strip_thought(completion)
        messages.append(ChatMessage(role="assistant", content=kept))
    messages.append(user_message(intent, len(history), observation))
    return messages


def without_first_rounds(
    messages: Sequence[ChatMessage], intent: str, count: int
) -> list[ChatMessage]:
    """`messages` (as `build_messages` made them) as if the episode had begun `count`
    rounds later, on the page it is on: the rounds before are left out and the rest
    numbered from 0, the task stated in the new round 0."""
    system, rounds = messages[0], list(messages[1:])
    now = (len(rounds) - 1) // 2
    if not 0 <= count <= now or len(rounds) % 2 != 1:
        raise ValueError(f"cannot leave out {count} of the {now} earlier rounds")
    current = rounds[-1].content
    header = user_message(intent, now, "").content
    if not current.startswith(header):
        raise ValueError(f"the last message is not round {now}'s user message")
    history = [m.content for m in rounds[2 * count + 1 : -1 : 2]]
    return build_messages(intent, history, current[len(header) :], system_prompt=system.content)


def episode_messages(
    intent: str,
    turns: Sequence[Turn],
    *,
    keep_thoughts: bool = True,
    system_prompt: str = SYSTEM_PROMPT,
) -> list[list[ChatMessage]]:
    """The messages each recorded turn was sent, rebuilt from the record alone."""
    history: list[str] = []
    out: list[list[ChatMessage]] = []
    for turn in turns:
        out.append(
            build_messages(
                intent,
                history,
                turn.observation,
                keep_thoughts=keep_thoughts,
                system_prompt=system_prompt,
            )
        )
        history.append(turn.text)
    return out


# --------------------------------------------------------------------------- rendering

_SPECIAL_TOKEN_KEYS = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class _GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}` (assistant-mask templates): body as is."""

    tags = {"generation"}  # noqa: RUF012 (jinja2's own attribute)

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body).set_lineno(lineno)


def _raise_exception(message: str) -> NoReturn:
    raise TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes HTML characters; chat templates expect plain JSON.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _compile_template(source: str) -> Template:
    """A chat template compiled the way transformers' `apply_chat_template` compiles it."""
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationBlock, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(source)


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json stores it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return str(value["content"])
    return None


def _pick_template(raw: Any, where: Path) -> str:
    """tokenizer_config.json's chat_template: a string, or a list of named templates."""
    if isinstance(raw, str):
        return raw
    if isinstance(raw, list):
        named = {t.get("name"): t.get("template") for t in raw if isinstance(t, dict)}
        if isinstance(named.get("default"), str):
            return str(named["default"])
    raise ModelFilesError(f"{where}: chat_template is neither a string nor a named 'default'")


class PromptRenderer:
    """Chat messages to token ids with a model's own tokenizer and chat template.

    Uses `tokenizers` and jinja2 only (no torch, no transformers), compiled like
    transformers' `apply_chat_template` and encoded without added special tokens, so the
    ids equal `AutoTokenizer.apply_chat_template(..., tokenize=True)`. One renderer serves
    rollouts, behaviour-cloning data and the learner. Templates that call `strftime_now`
    (dates) are reproducible within a day only.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        chat_template: str,
        special_tokens: Mapping[str, str] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.special_tokens = dict(special_tokens or {})
        self._template = _compile_template(chat_template)
        eos = self.special_tokens.get("eos_token")
        self.eos_token_id: int | None = None if eos is None else tokenizer.token_to_id(eos)

    @classmethod
    def from_model(cls, model: str | Path) -> PromptRenderer:
        """The renderer of a model folder (tokenizer.json, tokenizer_config.json, and
        chat_template.jinja if the template is kept there), or of a Hugging Face model id
        (its files fetched through huggingface_hub; needs network)."""
        folder = Path(model)
        if not folder.is_dir():
            folder = _download_tokenizer_files(str(model))
        tokenizer_file = folder / "tokenizer.json"
        config_file = folder / "tokenizer_config.json"
        if not tokenizer_file.is_file():
            raise ModelFilesError(f"{folder}: no tokenizer.json")
        try:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
            config = json.loads(config_file.read_text("utf-8")) if config_file.is_file() else {}
        except Exception as exc:  # tokenizers raises plain Exception on a bad file
            raise ModelFilesError(f"{folder}: unreadable tokenizer files ({exc})") from exc
        jinja_file = folder / "chat_template.jinja"
        if "chat_template" in config:
            template = _pick_template(config["chat_template"], config_file)
        elif jinja_file.is_file():
            template = jinja_file.read_text("utf-8")
        else:
            raise ModelFilesError(f"{folder}: no chat template (tokenizer_config.json or .jinja)")
        specials = {
            key: text for key in _SPECIAL_TOKEN_KEYS if (text := _token_text(config.get(key)))
        }
        return cls(tokenizer, template, specials)

    def render_text(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> str:
        """The prompt as text: the chat template applied to `messages`."""
        chat = [{"role": m.role, "content": m.content} for m in messages]
        try:
            return self._template.render(
                messages=chat,
                tools=None,
                documents=None,
                add_generation_prompt=add_generation_prompt,
                **self.special_tokens,
            )
        except TemplateError as exc:
            raise ModelFilesError(f"the chat template failed: {exc}") from exc

    def render(
        self, messages: Sequence[ChatMessage], *, add_generation_prompt: bool = True
    ) -> list[int]:
        """The prompt's token ids, ready for a token-in completion request."""
        return self.encode(self.render_text(messages, add_generation_prompt=add_generation_prompt))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`; special-token strings in it map to their ids, none added."""
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def count_tokens(self, text: str) -> int:
        """How many tokens `text` takes (observation budgets)."""
        return len(self.encode(text))

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = True) -> str:
        """Text of token ids."""
        text: str = self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return text


def _download_tokenizer_files(model_id: str) -> Path:
    """The tokenizer files of a hub model, fetched into the local Hugging Face cache."""
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise ModelFilesError(f"{model_id}: not a folder, and huggingface_hub is missing") from exc
    folder: Path | None = None
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        try:
            folder = Path(hf_hub_download(model_id, name)).parent
        except Exception as exc:
            if name == "tokenizer.json":
                raise ModelFilesError(f"{model_id}: cannot fetch {name} ({exc})") from exc
    assert folder is not None
    return folder
