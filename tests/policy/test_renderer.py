"""PromptRenderer (tokenizers + jinja2) against transformers' apply_chat_template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from policy.errors import ModelFilesError
from policy.prompt import SYSTEM_PROMPT, PromptRenderer, build_messages
from runtime.base.messages import ChatMessage

OBSERVATION = (
    '<a id="1">Electronics</a>\n<button id="25">Clear all</button>\n'
    '<input id="7" type="text" placeholder="Search"> Price: $12.99 — ünïcødé 价格 🙂'
)
CONVERSATIONS = [
    build_messages("Buy a lamp", [], OBSERVATION),
    build_messages(
        "Find the cheapest red shoes and add them to the cart",
        [
            '<think>open shoes</think><answer>do(action="Click", element="1")</answer>',
            '<think>type</think>\n<answer>do(action="Type", argument=\'red\', element="7")'
            "</answer>",
            "<answer>go_backward()</answer>",
        ],
        OBSERVATION,
    ),
    [
        *build_messages("t", ["a"], "o", keep_thoughts=True),
        ChatMessage(role="assistant", content="<think>x</think>"),
    ],
    [ChatMessage(role="user", content="  leading and trailing spaces \n\n")],
]


@pytest.fixture(scope="module")
def renderer(tiny_model: Path) -> PromptRenderer:
    return PromptRenderer.from_model(tiny_model)


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model: Path) -> object:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model)


def _reference(hf_tokenizer: object, messages: list[ChatMessage]) -> list[int]:
    chat = [{"role": m.role, "content": m.content} for m in messages]
    out = hf_tokenizer.apply_chat_template(  # type: ignore[attr-defined]
        chat, tokenize=True, add_generation_prompt=True, return_dict=True
    )
    ids: list[int] = out["input_ids"]
    return ids


@pytest.mark.parametrize("index", range(len(CONVERSATIONS)))
def test_render_equals_transformers(
    renderer: PromptRenderer, hf_tokenizer: object, index: int
) -> None:
    messages = CONVERSATIONS[index]
    ids = renderer.render(messages)
    assert ids == _reference(hf_tokenizer, messages)
    assert renderer.render(messages) == ids  # reproducible
    text = renderer.render_text(messages)
    assert text.endswith("<|im_start|>assistant\n")
    assert renderer.decode(ids, skip_special_tokens=False) == text


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["user", "assistant"]), st.text(max_size=60)),
        min_size=1,
        max_size=5,
    )
)
def test_render_equals_transformers_on_random_chats(
    renderer: PromptRenderer, hf_tokenizer: object, turns: list[tuple[str, str]]
) -> None:
    messages = [ChatMessage(role="system", content=SYSTEM_PROMPT)] + [
        ChatMessage(role=role, content=content)  # type: ignore[arg-type]
        for role, content in turns
    ]
    assert renderer.render(messages) == _reference(hf_tokenizer, messages)


def test_special_tokens_and_counting(renderer: PromptRenderer) -> None:
    ids = renderer.render([ChatMessage(role="user", content="hi")])
    im_start = renderer.tokenizer.token_to_id("<|im_start|>")
    assert ids[0] == im_start
    assert ids.count(renderer.eos_token_id) == 1  # the user turn's <|im_end|>
    assert renderer.count_tokens("") == 0
    assert renderer.count_tokens("<|im_end|>") == 1
    assert renderer.count_tokens(OBSERVATION) == len(renderer.encode(OBSERVATION))
    assert renderer.decode(renderer.encode(OBSERVATION)) == OBSERVATION


def test_template_from_jinja_file_and_generation_blocks(tiny_model: Path, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "tokenizer.json").write_bytes((tiny_model / "tokenizer.json").read_bytes())
    config = json.loads((tiny_model / "tokenizer_config.json").read_text())
    del config["chat_template"]
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}"
        "{{ m['content'] }}{% endgeneration %}{% else %}[{{ m['content'] }}]{% endif %}"
        "{% endfor %}{{ eos_token }}"
    )
    renderer = PromptRenderer.from_model(folder)
    messages = [
        ChatMessage(role="user", content="q"),
        ChatMessage(role="assistant", content="a"),
    ]
    assert renderer.render_text(messages) == "[q]a<|im_end|>"


def test_missing_files_are_named(tmp_path: Path, tiny_model: Path) -> None:
    with pytest.raises(ModelFilesError, match=r"no tokenizer\.json"):
        PromptRenderer.from_model(tmp_path)
    (tmp_path / "tokenizer.json").write_bytes((tiny_model / "tokenizer.json").read_bytes())
    with pytest.raises(ModelFilesError, match="no chat template"):
        PromptRenderer.from_model(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{broken")
    with pytest.raises(ModelFilesError, match="unreadable tokenizer files"):
        PromptRenderer.from_model(tmp_path)


def test_template_errors_are_policy_errors(renderer: PromptRenderer) -> None:
    broken = PromptRenderer(renderer.tokenizer, "{{ raise_exception('no system role') }}")
    with pytest.raises(ModelFilesError, match="no system role"):
        broken.render([ChatMessage(role="user", content="x")])
