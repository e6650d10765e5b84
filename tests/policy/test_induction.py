"""policy.induction: a tiny model made with the hand-set circuit looks ids up from step 0,
and training leaves the circuit as it was set."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from policy.induction import freeze_induction, plant_induction
from policy.prompt import PromptRenderer
from policy.tiny import (
    TINY_RECIPE,
    TinyModelSpec,
    base_corpus,
    induction_heads,
    make_tiny_model,
)

WORDS = [
    "Kelby",
    "Socks",
    "Adams",
    "Park",
    "Nelson",
    "Station",
    "Brown",
    "Academy",
    "Miller",
    "Market",
    "Cortello",
    "Litter",
    "Box",
    "Falcon",
    "Raven",
    "Otter",
    "Hospital",
    "Pine",
    "Road",
    "Birch",
    "Way",
    "Lamp",
    "Garden",
    "Rose",
    "Meter",
    "Lens",
    "Prime",
]
IGNORE = -100


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """The same tiny model (seed 0, the recipe's tokenizer) with 0 and 1 planted heads."""
    pages = [" ".join(WORDS[k:] + WORDS[:k]) for k in range(len(WORDS))]
    texts = base_corpus(0) + pages
    out = tmp_path_factory.mktemp("induction")
    made = {}
    for heads in (0, 1):
        spec = TinyModelSpec(induction_heads=heads)
        make_tiny_model(out / str(heads), texts, spec=spec, recipe=TINY_RECIPE, seed=0)
        made[heads] = out / str(heads)
    return made


def lookup(rng: random.Random, encode: Any) -> tuple[list[int], list[int]]:
    """8 page lines `link K [id]`, then `click K [id]` for 4 of them: the ids are targets."""
    keys: list[str] = []
    while len(keys) < 8:
        key = " ".join(rng.sample(WORDS, rng.randint(1, 2)))
        if key not in keys:
            keys.append(key)
    numbers = rng.sample(range(1, 60), 8)
    ids = encode("".join(f"link {k} [{i}]\n" for k, i in zip(keys, numbers, strict=True)))
    labels = [IGNORE] * len(ids)
    for j in rng.sample(range(8), 4):
        query, answer = encode(f"click {keys[j]}"), encode(f" [{numbers[j]}]\n")
        ids += query + answer
        labels += [IGNORE] * len(query) + answer[:1] + [IGNORE] * (len(answer) - 1)
    return ids, labels


def lookup_accuracy(model: Any, folder: Path, sequences: int = 16) -> float:
    import torch

    renderer = PromptRenderer.from_model(folder)
    examples = [lookup(random.Random(k), renderer.encode) for k in range(sequences)]
    right = scored = 0
    for token_ids, labels in examples:
        ids = torch.tensor([token_ids])
        with torch.no_grad():
            predicted = model(input_ids=ids).logits[0, :-1].argmax(-1).tolist()
        for guess, target in zip(predicted, labels[1:], strict=True):
            if target != IGNORE:
                scored += 1
                right += guess == target
    return right / scored


def test_the_planted_model_looks_ids_up_the_fresh_one_does_not(models: dict[int, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    accuracy = {}
    for heads, folder in models.items():
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        accuracy[heads] = lookup_accuracy(model, folder)
    print(f"look-up accuracy at step 0: fresh {accuracy[0]:.2f}, planted {accuracy[1]:.2f}")
    assert accuracy[1] >= 0.6  # chance: 1/8
    assert accuracy[0] <= 0.2
    assert induction_heads(models[1]) == 1 and induction_heads(models[0]) == 0


def test_frozen_circuit_survives_training_the_rest_does_not(models: dict[int, Path]) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    folder = models[1]
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    handles = freeze_induction(model, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    generator = torch.Generator().manual_seed(0)
    for _ in range(3):
        ids = torch.randint(3, model.config.vocab_size, (4, 40), generator=generator)
        loss = model(input_ids=ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    params = dict(model.named_parameters())
    layer0 = "model.layers.0.self_attn"
    # planted: head 0's query rows, key-value head 0's key rows, head 0's output columns,
    # the embedding's last head_dim dimensions (the previous token's)
    kept = {
        f"{layer0}.q_proj.weight": (slice(0, head_dim), slice(None)),
        f"{layer0}.k_proj.bias": (slice(0, head_dim),),
        "model.layers.1.self_attn.o_proj.weight": (slice(None), slice(0, head_dim)),
        "model.embed_tokens.weight": (slice(None), slice(-head_dim, None)),
    }
    for name, index in kept.items():
        assert torch.equal(params[name][index], before[name][index]), name
    # the rest of the same tensors moved
    assert not torch.equal(
        params[f"{layer0}.q_proj.weight"][head_dim:], before[f"{layer0}.q_proj.weight"][head_dim:]
    )
    assert not torch.equal(
        params["model.embed_tokens.weight"][:, :-head_dim],
        before["model.embed_tokens.weight"][:, :-head_dim],
    )
    for handle in handles:
        handle.remove()


def test_a_model_it_does_not_fit_is_refused() -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    def model(**changes: Any) -> Any:
        config = dict(
            vocab_size=64, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True,
        )  # fmt: skip
        torch.manual_seed(0)
        return Qwen2ForCausalLM(Qwen2Config(**(config | changes)))

    plant_induction(model())  # fits
    with pytest.raises(ValueError, match="needs 2 layers, the model has 1"):
        plant_induction(model(num_hidden_layers=1))
    with pytest.raises(ValueError, match="tied input and output"):
        plant_induction(model(tie_word_embeddings=False))
    with pytest.raises(ValueError, match="3 key-value heads"):
        plant_induction(model(), kv_heads_used=3)
