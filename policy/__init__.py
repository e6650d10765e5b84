"""The policy layer: prompts, the vLLM server and client, adapter versions and hot-swap.

    PromptRenderer   chat messages -> token ids with the model's own chat template
    VLLMServer       the vLLM OpenAI-compatible server as a child process group (or a URL)
    CompletionClient token-in/token-out /v1/completions, health, models, LoRA load/unload
    ReplicaSet       several servers of one model used as one client: least-loaded routing,
                     adapters on every replica, a failed replica out until it rejoins
    AdapterManager   versioned adapters `policy@vN`, leases, hot-swap, unloading
    VLLMPolicy       the runtime's `Policy`: all of the above for one turn

torch and transformers are imported only by `policy.tiny.make_tiny_model`.
"""

from policy.adapters import AdapterManager
from policy.client import CompletionClient, SamplingParams, VLLMPolicy
from policy.errors import PolicyError
from policy.prompt import PromptRenderer
from policy.replicas import ReplicaSet
from policy.server import VLLMServer

__all__ = [
    "AdapterManager",
    "CompletionClient",
    "PolicyError",
    "PromptRenderer",
    "ReplicaSet",
    "SamplingParams",
    "VLLMPolicy",
    "VLLMServer",
]
