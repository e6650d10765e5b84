"""The locally made tiny model: sizes, determinism, tokenizer recipes, `webagent model init`."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from policy.prompt import PromptRenderer
from policy.tiny import (
    EOS_TOKEN,
    TinyModelSpec,
    TokenizerRecipe,
    base_corpus,
    make_tiny_model,
    train_tokenizer,
)

TEXTS = [*base_corpus(0), '<li><a id="12">Lamps</a> $12.99</li> Lamps and lamps', "Buy 3 Lamps"]


def _files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in folder.iterdir() if p.name != "tiny_model.json"}


def test_same_seed_same_files_other_seed_other_weights(tmp_path: Path) -> None:
    spec = TinyModelSpec(hidden_size=64, num_layers=1, num_heads=2, num_kv_heads=1,
                         intermediate_size=128)  # fmt: skip
    a = make_tiny_model(tmp_path / "a", TEXTS, spec=spec, seed=3)
    make_tiny_model(tmp_path / "b", TEXTS, spec=spec, seed=3)
    make_tiny_model(tmp_path / "c", TEXTS, spec=spec, seed=4)
    files_a, files_b, files_c = (_files(tmp_path / n) for n in "abc")
    assert files_a == files_b
    assert files_a["tokenizer.json"] == files_c["tokenizer.json"]
    assert files_a["model.safetensors"] != files_c["model.safetensors"]
    assert sorted(files_a) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ]
    config = json.loads(files_a["config.json"])
    assert config["architectures"] == ["Qwen2ForCausalLM"]
    assert (config["hidden_size"], config["num_hidden_layers"]) == (64, 1)
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (2, 1)
    assert config["vocab_size"] == a.vocab_size
    renderer = PromptRenderer.from_model(tmp_path / "a")
    assert config["eos_token_id"] == renderer.eos_token_id == renderer.encode(EOS_TOKEN)[0]
    assert json.loads(files_a["generation_config.json"])["eos_token_id"] == config["eos_token_id"]
    assert "<|im_start|>" in json.loads(files_a["tokenizer_config.json"])["chat_template"]
    with pytest.raises(FileExistsError):
        make_tiny_model(tmp_path / "a", TEXTS, spec=spec, seed=3)
    assert not list(tmp_path.glob(".*tmp*"))  # nothing half-written left beside


def test_default_size_loads_in_transformers_and_generates(tiny_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    info = json.loads((tiny_model / "tiny_model.json").read_text())
    assert info["spec"]["hidden_size"] == 256
    assert 1e6 < info["parameters"] < 5e6
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    assert sum(p.numel() for p in model.parameters()) == info["parameters"]
    out = model.generate(torch.tensor([[1, 5, 6]]), max_new_tokens=4, do_sample=False)
    assert out.shape == (1, 7)


def test_words_recipe_gives_a_word_the_same_tokens_after_any_character() -> None:
    qwen2 = train_tokenizer(TEXTS, TokenizerRecipe(vocab_size=400))
    words = train_tokenizer(TEXTS, TokenizerRecipe(vocab_size=400, split="words"))

    def tokens(tok: object, text: str) -> list[str]:
        return tok.encode(text, add_special_tokens=False).tokens  # type: ignore[attr-defined,no-any-return]

    # Qwen2's split glues one leading character to a word; "words" never does.
    assert tokens(qwen2, " Lamps") != tokens(qwen2, ">Lamps")
    lamps = tokens(words, "Lamps")
    assert tokens(words, " Lamps") == ["Ġ", *lamps]
    assert tokens(words, ">Lamps") == [">", *lamps]
    # Digits are single tokens in both.
    assert tokens(qwen2, "1299") == ["1", "2", "9", "9"]
    assert tokens(words, "1299") == ["1", "2", "9", "9"]


@pytest.mark.parametrize("split", ["words", "ids"])
def test_words_recipes_decode_like_transformers(tmp_path: Path, split: str) -> None:
    """transformers (and vLLM) rebuild Qwen2's pre-tokenizer, so only encoding differs;
    decoding our ids, which is all vLLM does with them, gives the same text."""
    from transformers import AutoTokenizer

    recipe = TokenizerRecipe(vocab_size=400, split=split, id_tokens=50)  # type: ignore[arg-type]
    spec = TinyModelSpec(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                         intermediate_size=64)  # fmt: skip
    make_tiny_model(tmp_path / "m", TEXTS, spec=spec, recipe=recipe)
    renderer = PromptRenderer.from_model(tmp_path / "m")
    hf = AutoTokenizer.from_pretrained(tmp_path / "m")
    for text in [*TEXTS[-3:], "ünïcødé 价格 🙂 <|im_end|>", "link Lamps [13]\nbutton Go [50]"]:
        ids = renderer.encode(text)
        assert hf.decode(ids, skip_special_tokens=False) == renderer.decode(
            ids, skip_special_tokens=False
        )
        assert hf.decode(ids, skip_special_tokens=True) == renderer.decode(ids)


def test_ids_recipe_makes_an_element_id_one_token() -> None:
    ids = train_tokenizer(TEXTS, TokenizerRecipe(vocab_size=400, split="ids", id_tokens=120))
    assert ids.encode("link Lamps [13]").tokens[-1] == " [13]"
    assert ids.encode("button Go [120]\n").tokens[-2] == " [120]"
    # past id_tokens, and without the leading space, ids are plain pieces
    assert " [121]" not in ids.encode("x [121]").tokens
    assert "[13]" not in "".join(t for t in ids.encode("x[13]").tokens if t.startswith(" ["))
    words = train_tokenizer(TEXTS, TokenizerRecipe(vocab_size=400, split="words"))
    assert " [13]" not in words.encode("link Lamps [13]").tokens


def _webagent(*args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in its own process (it configures logging and runs its own event loop)."""
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_model_init_command(tmp_path: Path) -> None:
    out = tmp_path / "tiny"
    started = time.monotonic()
    done = _webagent("model", "init", "--tiny", "--out", str(out), "--seed", "1")
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr
    assert elapsed < 30, f"model init took {elapsed:.1f} s"
    assert "2 layers x 256" in done.stdout
    info = json.loads((out / "tiny_model.json").read_text())
    assert info["seed"] == 1
    # the sites' pages fill the learned vocabulary; element ids 1-400 are added tokens
    assert info["vocab_size"] == 2048 + 400
    assert info["recipe"]["split"] == "ids"
    assert info["profile"] == {"observation_style": "compact", "system_prompt": "short"}
    renderer = PromptRenderer.from_model(out)
    # Trained on the sites' pages: their words are single tokens, whatever precedes them.
    assert renderer.count_tokens("product") == renderer.count_tokens(">the") - 1 == 1
    assert renderer.decode(renderer.encode("link Lamps [13]")[-1:]) == " [13]"
    again = _webagent("model", "init", "--tiny", "--out", str(out))
    assert again.returncode == 2
    assert "exists" in again.stderr
