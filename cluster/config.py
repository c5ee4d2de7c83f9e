"""The one configuration model of a toolserve deployment.

`configs/embedded-cpu.yaml` is the embedded default; GPU profiles are further
YAML files of the same model. Field descriptions double as documentation.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, model_validator

REPO_ROOT = Path(__file__).resolve().parent.parent
CONFIGS_DIR = REPO_ROOT / "configs"
DEFAULT_CONFIG_PATH = CONFIGS_DIR / "embedded-cpu.yaml"

# Engine arguments owned by typed fields; passing them through `extra_engine_args`
# as well would let two places disagree.
_TYPED_ENGINE_ARGS = {
    "model",
    "served_model_name",
    "dtype",
    "max_model_len",
    "block_size",
    "enable_prefix_caching",
    "enforce_eager",
    "kv_cache_memory_bytes",
    "gpu_memory_utilization",
    "tensor_parallel_size",
    "max_num_seqs",
    "seed",
}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class EngineConfig(_Strict):
    """Arguments of one vLLM engine (a subset of vLLM's AsyncEngineArgs, plus pass-through)."""

    model: str = Field(
        description="Model to load: a Hugging Face id, a local directory, or "
        "`embedded:<name>` for a model toolserve prepares itself "
        "(`embedded:smollm2-135m-instruct`, `embedded:tiny-random-llama`)."
    )
    served_model_name: str = Field(
        description="Name clients pass as `model` in API requests and see in `GET /v1/models`."
    )
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        default="auto",
        description="Weight and activation dtype. On CPUs without AVX-512 bf16, "
        "float32 is about 3x faster than bfloat16.",
    )
    max_model_len: int = Field(
        default=8192, gt=0, description="Longest prompt plus completion, in tokens."
    )
    block_size: int = Field(
        default=64,
        description="Tokens per KV block. Prefix-cache hits are whole blocks, so "
        "agent turns want 32 or 64 (the CPU backend's default of 128 wastes reuse).",
    )
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse KV blocks of identical prompt prefixes."
    )
    enforce_eager: bool = Field(
        default=False,
        description="Skip torch.compile and graph capture. On CPU this cuts start-up "
        "from minutes to seconds for ~20% slower prefill.",
    )
    kv_cache_memory_bytes: int | None = Field(
        default=None,
        gt=0,
        description="Exact KV cache size in bytes. Required on CPU (otherwise vLLM "
        "sizes the cache from the whole NUMA node's memory).",
    )
    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Fraction of GPU memory vLLM may use (weights, activations, KV). "
        "GPU only; ignored when `kv_cache_memory_bytes` is set.",
    )
    tensor_parallel_size: int = Field(
        default=1, ge=1, description="GPUs per replica the model is sharded over."
    )
    max_num_seqs: int = Field(
        default=64, ge=1, description="Most sequences the engine decodes at once."
    )
    seed: int = Field(default=0, description="Engine random seed.")
    extra_engine_args: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vLLM AsyncEngineArgs passed through unchanged "
        "(for example `scheduler_cls`, `scheduling_policy`, `additional_config`, "
        "`speculative_config`).",
    )

    @model_validator(mode="after")
    def _no_shadowed_engine_args(self) -> EngineConfig:
        shadowed = sorted(_TYPED_ENGINE_ARGS & self.extra_engine_args.keys())
        if shadowed:
            raise ValueError(
                f"extra_engine_args repeats typed fields {shadowed}; set them directly"
            )
        if self.block_size % 16:
            raise ValueError("block_size must be a multiple of 16")
        return self

    def engine_kwargs(
        self, resolved_model: str, served_model_names: list[str] | None = None
    ) -> dict[str, Any]:
        """Keyword arguments for vLLM's AsyncEngineArgs; the engine answers to
        `served_model_names` (default: `served_model_name`)."""
        kwargs: dict[str, Any] = {
            "model": resolved_model,
            "served_model_name": served_model_names or [self.served_model_name],
            "dtype": self.dtype,
            "max_model_len": self.max_model_len,
            "block_size": self.block_size,
            "enable_prefix_caching": self.enable_prefix_caching,
            "enforce_eager": self.enforce_eager,
            "tensor_parallel_size": self.tensor_parallel_size,
            "max_num_seqs": self.max_num_seqs,
            "seed": self.seed,
        }
        if self.kv_cache_memory_bytes is not None:
            kwargs["kv_cache_memory_bytes"] = self.kv_cache_memory_bytes
        if self.gpu_memory_utilization is not None:
            kwargs["gpu_memory_utilization"] = self.gpu_memory_utilization
        return kwargs | self.extra_engine_args


class TokenizeCacheConfig(_Strict):
    """Tokenizing only what a turn adds to its program's last prompt."""

    enabled: bool = Field(
        default=False,
        description="Keep the token ids of each prompt up to its last turn marker (a "
        "special token such as `<|im_start|>`) and, when a later prompt extends that "
        "text, tokenize only the rest. The ids equal a full tokenization's: prompts "
        "are only split where a special token starts.",
    )
    max_cached_tokens: int = Field(
        default=2_000_000,
        ge=1,
        description="Most token ids one replica keeps (about 4 bytes each, plus the "
        "prompt text); the least recently used prompt goes first.",
    )
    audit_first: int = Field(
        default=8,
        ge=0,
        description="The first joined tokenizations are checked against a full one; a "
        "mismatch turns the cache off for the replica's life (and is counted).",
    )
    audit_every: int = Field(
        default=100,
        ge=0,
        description="After those, one joined tokenization in this many is checked (0: none).",
    )


class PrefixIntegrityConfig(_Strict):
    """Checking each turn's prompt against what the engine holds for its program."""

    enabled: bool = Field(
        default=True,
        description="Compare each prompt of a program with its last prompt and the "
        "tokens the model wrote there; count where and why they part "
        "(`toolserve_prefix_breaks_total{cause}`, the session's `prefix` block, the "
        "`X-Toolserve-Prefix` header).",
    )
    repair: bool = Field(
        default=True,
        description="Where the client sent the model's reply back meaning what the model "
        "wrote (the same calls and arguments once parsed, the same text but for "
        "whitespace at its ends), run the prompt with the model's own tokens for it, so "
        "the program's cached prefix holds.",
    )
    max_held_tokens: int = Field(
        default=4_000_000,
        ge=1,
        description="Most token ids one replica keeps of its programs' last turns (4 "
        "bytes each); the program least recently served goes first.",
    )


class ChatConfig(_Strict):
    """How the OpenAI chat front end of a model replica renders and parses."""

    chat_template: str | None = Field(
        default=None,
        description="Jinja chat template: a path (relative paths are resolved against "
        "`configs/`) or None for the tokenizer's own template. It must render "
        "`tools`, assistant `tool_calls` and `tool` messages.",
    )
    tool_call_parser: str = Field(
        default="hermes",
        description="vLLM tool-call parser matching the chat template's call format "
        "(`hermes`, `llama3_json`, `mistral`, ...).",
    )
    tool_strict_level: Literal["auto", "function", "parameter"] = Field(
        default="parameter",
        description="vLLM's floor for constrained tool calls. `parameter` makes "
        "`tool_choice` required/named produce schema-valid arguments even from "
        "small models.",
    )
    tokenize_cache: TokenizeCacheConfig = Field(
        default_factory=TokenizeCacheConfig,
        description="Tokenizing only the part of a prompt its program's last prompt lacks.",
    )
    prefix_integrity: PrefixIntegrityConfig = Field(
        default_factory=PrefixIntegrityConfig,
        description="Each turn's prompt against what the engine holds for its program: "
        "breaks counted by cause, and repaired where the server caused them.",
    )

    def resolved_chat_template(self) -> str | None:
        if self.chat_template is None:
            return None
        path = Path(self.chat_template)
        return str(path if path.is_absolute() else CONFIGS_DIR / path)

    def frontend_kwargs(self) -> dict[str, Any]:
        """vLLM's OpenAI front-end arguments for this chat configuration."""
        return {
            "chat_template": self.resolved_chat_template(),
            "enable_auto_tool_choice": True,
            "tool_call_parser": self.tool_call_parser,
            "tool_strict_level": self.tool_strict_level,
            "enable_prompt_tokens_details": True,
        }


class PinningConfig(_Strict):
    """KV pinning between an agent's turns and program-level FCFS (main model)."""

    mode: Literal["off", "fixed", "cost_model"] = Field(
        default="cost_model",
        description="`off`: a finished turn's KV is freed as in stock vLLM. `fixed`: "
        "it stays pinned for `fixed_ttl_s`. `cost_model`: for the TTL the cost model "
        "chooses from the tool's observed durations, queueing delay and prefill cost.",
    )
    program_fcfs: bool = Field(
        default=True,
        description="Order waiting requests by their program's first arrival "
        "(vLLM's priority policy), so returning turns are not starved by new programs.",
    )
    fcfs_horizon_s: float | None = Field(
        default=None,
        gt=0,
        description="With `program_fcfs`: a turn queues at its program's first arrival "
        "but no earlier than this many seconds before its own arrival, so a program "
        "that arrives while older ones are busy waits behind their turns for about "
        "this long at most instead of until they end. None: no limit (Continuum's order).",
    )
    program_admission_share: float | None = Field(
        default=0.5,
        gt=0,
        le=4,
        description="A program new to an engine starts its first "
        "turn only while its prompt and the contexts of the programs already started "
        "there (a turn running or waiting, or back within `max_ttl_s`) fit this share "
        "of the KV pool, or the engine runs nothing; a prefix the pool held already "
        "when a program started (a preamble shared with programs before it) counts "
        "only for the program that brought it; new programs start in arrival "
        "order. Without it a new program starts whenever no older program's turn "
        "waits, and loses its KV first when their turns return. Below one because "
        "started contexts grow turn by turn. Applies with `program_fcfs`. None: off.",
    )
    fixed_ttl_s: float = Field(
        default=2.0,
        ge=0,
        description="TTL in `fixed` mode, and in `cost_model` mode until the tools "
        "together have `min_tool_samples` observed durations (while nobody waits "
        "for the memory, `max_ttl_s` instead).",
    )
    max_ttl_s: float = Field(
        default=30.0,
        gt=0,
        description="Longest TTL any pin gets; a program not back this long after a "
        "turn counts for the cost model as never coming back after that tool.",
    )
    charge_withheld_cache: bool = Field(
        default=False,
        description="In `cost_model` mode, charge a pin at least its share of the "
        "evictable prefix cache (its blocks over the free blocks and its own), since "
        "new requests evict other programs' cached prefixes from the free blocks while "
        "it holds its own. Off: a pin costs only what requests waiting now need "
        "beyond the free blocks, so while nobody waits it is held as long as "
        "`idle_hold_factor` says.",
    )
    idle_hold_factor: float = Field(
        default=2.0,
        ge=1,
        description="In `cost_model` mode, while nobody waits for the memory: a pin "
        "is held this many times the longest return seen after its tool (at least "
        "`fixed_ttl_s`, up to `max_ttl_s`). After n returns, the next is slower than "
        "all of them about once in n + 1, while a pin held in vain keeps others' "
        "cached prefixes out of the free blocks. A large factor holds every such pin "
        "up to `max_ttl_s`.",
    )
    max_pinned_fraction: float = Field(
        default=0.5,
        gt=0,
        le=1,
        description="Largest share of the KV cache pins may hold; a pin that would "
        "exceed it displaces pins of later-arrived programs or is not made.",
    )
    tenant_max_pinned_fraction: float | None = Field(
        default=None,
        gt=0,
        le=1,
        description="Largest share of the KV cache one tenant's pins may hold (a "
        "tenant: an API key, or every caller without one); a pin past it displaces "
        "the tenant's own pins of later-arrived programs or is not made. None: no "
        "share per tenant.",
    )
    min_tool_samples: int = Field(
        default=5,
        ge=1,
        description="Observed durations a distribution needs before the cost model "
        "prices pins from it (before that, the next one of `durations_by`'s order).",
    )
    durations_by: Literal["tool", "single"] = Field(
        default="tool",
        description="Whose durations price a pin in `cost_model` mode. `tool`: the tool "
        "the turn called, as its tenant's calls of it took; with too few of those, the "
        "program's own returns, then the tool's across tenants, then every tool's. "
        "`single`: every tool's together (one distribution).",
    )
    sample_window: int = Field(
        default=256,
        ge=1,
        description="Sliding window of tool durations, queueing delays and "
        "completed-program lengths the cost model learns from.",
    )
    default_memoryfulness: float = Field(
        default=1.0,
        ge=0,
        le=1,
        description="Memoryfulness η assumed until enough programs have completed.",
    )
    max_tracked_programs: int = Field(
        default=10000,
        ge=1,
        description="Programs whose first arrival and last turn the engine remembers "
        "(least recently seen forgotten first).",
    )
    decision_log_dir: str | None = Field(
        default=None,
        description="A directory each engine appends its pinning decisions to, "
        "`<replica>.jsonl`: one JSON record a line with the event's inputs (times, "
        "tokens, holding costs) and the outcome (pin made, pins released and why, "
        "queue place), replayable through another configuration "
        "(`cluster/policies/pinning_log.py`). None: no log.",
    )
    prefill_profile_lengths: list[int] = Field(
        default_factory=lambda: [256, 1024, 2048, 4096],
        min_length=3,
        description="Prompt lengths timed at start-up to fit the quadratic prefill-time "
        "profile (cached per model and engine settings; lengths above "
        "max_model_len are skipped).",
    )

    @property
    def enabled(self) -> bool:
        return self.mode != "off" or self.program_fcfs

    @property
    def admission_share(self) -> float | None:
        """`program_admission_share` where it applies: it starts new programs in
        arrival order, so only with program FCFS (pinning off means all of it off)."""
        return self.program_admission_share if self.program_fcfs else None


class PromptLookupConfig(_Strict):
    """Prompt-lookup decoding: each step, a decoding request's next tokens are
    drafted from its own prompt (the n-gram that ends its output, found earlier
    in it) and verified together; gated per request (toolserve's scheduler)."""

    enabled: bool = Field(
        default=False,
        description="Draft and verify with vLLM's n-gram proposer (its speculative "
        "decoding, `method: ngram`), gated per request as below.",
    )
    window: int = Field(
        default=4,
        ge=1,
        le=16,
        description="Most drafts a request has verified per step (vLLM's "
        "`num_speculative_tokens`); a request writing a tool call gets all of them.",
    )
    min_match: int = Field(default=2, ge=1, description="Shortest n-gram looked up in the prompt.")
    max_match: int = Field(default=5, ge=1, description="Longest n-gram looked up in the prompt.")
    prose_floor: int = Field(
        default=1,
        ge=0,
        description="Drafts a request writing prose gets whatever its acceptance; "
        "above it, the window times its acceptance there.",
    )
    ema_weight: float = Field(
        default=0.3,
        gt=0,
        le=1,
        description="Weight of a verified step in a request's acceptance average.",
    )
    initial_acceptance: float = Field(
        default=0.5, ge=0, le=1, description="A request's acceptance before it has any."
    )
    learned_initial_acceptance: bool = Field(
        default=True,
        description="A request's prose acceptance starts from the engine's recent "
        "prose acceptance (its verified prose drafts, the latest weighing most) "
        "instead of `initial_acceptance`, once it has any: each new turn of a "
        "workload whose prose repeats nothing of its prompt would otherwise spend "
        "several steps' drafts learning so again.",
    )
    min_prose_acceptance: float = Field(
        default=0.1,
        ge=0,
        le=1,
        description="Below this acceptance in prose a request gets no drafts, but for "
        "one probe step (`prose_floor` drafts) every `probe_every` steps that keeps its "
        "average current: a verified draft costs the step's compute whether or not it "
        "is accepted, and text that repeats nothing of the prompt wastes every one.",
    )
    probe_every: int = Field(
        default=8, ge=1, description="Steps per probe while prose drafts are withheld."
    )
    max_decoders: int | None = Field(
        default=None,
        ge=0,
        description="With more requests decoding at once, none gets drafts: each "
        "verified draft costs the batch compute whether or not it is accepted. None: "
        "no cap. On CPUs a draft token costs about a third of a decoding sequence's "
        "share of a step at any batch, so drafts accepted as often as the gate keeps "
        "them pay at any concurrency (bench/results/client-agents-draft-cap: a cap "
        "of 8 made agents 1.52x slower); a cap is for engines whose verification "
        "grows costly past some batch.",
    )
    past_cap_acceptance: float | None = Field(
        default=None,
        ge=0,
        le=1,
        description="Above `max_decoders`, a request in prose whose acceptance is at "
        "least this keeps its drafts (replies that copy figures from their tool "
        "results); None: no request does.",
    )
    call_opening: str = Field(
        default="<tool_call>",
        description="Text that opens a tool call in the model's output (hermes).",
    )
    call_closing: str = Field(default="</tool_call>", description="Text that closes a tool call.")
    predicted_calls: bool = Field(
        default=True,
        description="While a request writes a tool call, draft from the calls its turn's "
        "speculation predicted (learned predictions known when the turn starts) before "
        "the prompt: a correctly predicted call is verified a window at a time.",
    )

    def engine_kwargs(self) -> dict[str, Any]:
        """AsyncEngineArgs for vLLM's n-gram drafts, as stock vLLM takes them (the
        per-request gate is toolserve's scheduler, chosen by the replica)."""
        if not self.enabled:
            return {}
        return {
            # Drafts are gated per request between steps, which vLLM's asynchronous
            # scheduling (it schedules the next step before drafts exist) rules out.
            "async_scheduling": False,
            "speculative_config": {
                "method": "ngram",
                "num_speculative_tokens": self.window,
                "prompt_lookup_min": self.min_match,
                "prompt_lookup_max": self.max_match,
            },
        }

    def process_environment(self) -> dict[str, str]:
        """Environment an engine's processes need for n-gram drafts."""
        if not self.enabled:
            return {}
        # vLLM's n-gram proposer is a numba `parallel=True` function. Without TBB,
        # numba's first parallel call starts its OpenMP layer in the worker, which
        # sets the process's OpenMP thread count to numba's default there (1: the
        # worker's main thread is pinned to one core), and torch's kernels share
        # that libgomp: every forward pass after the first draft ran on one thread.
        # numba's own thread pool leaves OpenMP alone.
        return {"NUMBA_THREADING_LAYER": "workqueue"}

    @model_validator(mode="after")
    def _match_range(self) -> PromptLookupConfig:
        if self.min_match > self.max_match:
            raise ValueError("prompt_lookup.min_match exceeds max_match")
        if self.prose_floor > self.window:
            raise ValueError("prompt_lookup.prose_floor exceeds window")
        return self


class AdmissionConfig(_Strict):
    """Cell-budget admission: a waiting sequence starts its prefill only when the
    KV it may claim fits beside what the running sequences may claim."""

    enabled: bool = Field(
        default=False,
        description="Hold new prefills (first come, first served) while the running "
        "sequences' demand plus theirs exceeds `kv_share` of the KV pool. A "
        "sequence's demand: its prompt less the prefix cache's hit, plus its output.",
    )
    kv_share: float = Field(
        default=0.9,
        gt=0,
        le=1,
        description="Share of the KV pool the admitted sequences may claim together.",
    )
    output_reserve_tokens: int = Field(
        default=512,
        ge=0,
        description="Output tokens each sequence is counted for at most (its "
        "`max_tokens` when smaller): counting every reply's whole allowance would "
        "run requests without `max_tokens` one at a time.",
    )


class KvOffloadConfig(_Strict):
    """LMCache's CPU tier under each engine's KV cache (vLLM's LMCache connector).
    GPU engines only: LMCache does not run on vLLM's CPU backend."""

    enabled: bool = Field(
        default=False,
        description="Save every request's KV to LMCache's CPU memory and load it "
        "back on a prefix hit there. Pinned blocks stay in GPU memory; blocks the "
        "engine frees go on living in the CPU tier, so the TTL cost model prices "
        "a lost pin at the reload from CPU rather than a prefill.",
    )
    cpu_gib: float = Field(
        default=20,
        gt=0,
        description="CPU memory each engine's LMCache tier holds, in GiB "
        "(LMCache's `max_local_cpu_size`).",
    )
    chunk_size: int = Field(
        default=256, ge=16, description="Tokens per LMCache chunk (its `chunk_size`)."
    )
    reload_bytes_per_s: float = Field(
        default=10e9,
        gt=0,
        description="Host-to-GPU copy rate the TTL cost model assumes for loading an "
        "offloaded context back (bytes per second); the KV bytes per token come "
        "from the engine's own KV layout.",
    )
    lmcache_config: dict[str, Any] = Field(
        default_factory=dict,
        description="Further LMCache settings by their own names (without the "
        "`lmcache.` prefix), e.g. `{remote_url: ...}`.",
    )


CPU_PRIMITIVE_CACHE_CAPACITY = 128


class ModelDeploymentConfig(_Strict):
    """A Ray Serve deployment of model replicas, each running one vLLM engine."""

    engine: EngineConfig = Field(description="The vLLM engine every replica runs.")
    chat: ChatConfig = Field(
        default_factory=ChatConfig, description="OpenAI chat rendering and tool parsing."
    )
    num_replicas: int = Field(default=1, ge=1, description="Number of replicas.")
    num_cpus: float = Field(
        default=0,
        ge=0,
        description="CPUs Ray reserves per replica. 0 lets replicas share a small "
        "machine; threads are set by `cpu_threads` regardless.",
    )
    num_gpus: float = Field(default=0, ge=0, description="GPUs Ray reserves per replica.")
    ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each replica reserves, so replicas go only to "
        "the nodes that offer them (a node's `ray start --resources`, KubeRay's "
        "`rayStartParams.resources`), e.g. `{model_node: 1}`.",
    )
    max_replicas_per_node: int | None = Field(
        default=None,
        ge=1,
        description="Serve's cap on this deployment's replicas per node (1 spreads "
        "them over nodes). None: no cap.",
    )
    cpu_threads_bind: str = Field(
        default="auto",
        description="CPU backend only: cores the engine's OpenMP threads bind to "
        "(vLLM's VLLM_CPU_OMP_THREADS_BIND, e.g. `0-1`; `auto` lets vLLM choose "
        "per NUMA node, `nobind` leaves threads unbound). Set it per replica: the "
        "default binds to the whole node and ignores Ray's num_cpus.",
    )
    cpu_threads_bind_by_local_rank: list[str] = Field(
        default_factory=list,
        description="CPU backend only: core sets per replica, indexed by the replica's "
        "rank on its node (modulo the list's length), e.g. `['0', '1']` for two "
        "one-core replicas on a 2-core machine. Empty: every replica binds "
        "`cpu_threads_bind`.",
    )
    cpu_primitive_cache_capacity: int = Field(
        default=CPU_PRIMITIVE_CACHE_CAPACITY,
        ge=0,
        description="CPU backend only: primitives oneDNN keeps in its process-wide "
        "cache (ONEDNN_PRIMITIVE_CACHE_CAPACITY; oneDNN's own default is 1024). vLLM's "
        "CPU linear layers keep their own primitives per batch size; the process-wide "
        "cache behind them takes one for every batch size the engine ever ran, and "
        "at oneDNN's default grew the model process by 15-35 MB a minute under load.",
    )
    max_ongoing_requests: int = Field(
        default=256, ge=1, description="Requests Ray Serve lets one replica hold at once."
    )

    def cpu_process_environment(self) -> dict[str, str]:
        """CPU backend only: what the engine's processes start with, beside the
        cores they bind (a benchmark's stock arms get the same)."""
        return {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": str(self.cpu_primitive_cache_capacity)}

    def cpu_binding(self, local_rank: int) -> str:
        """The cores the engine of the replica with this node-local rank binds."""
        if not self.cpu_threads_bind_by_local_rank:
            return self.cpu_threads_bind
        return self.cpu_threads_bind_by_local_rank[
            local_rank % len(self.cpu_threads_bind_by_local_rank)
        ]

    startup_timeout_s: float = Field(
        default=900,
        gt=0,
        description="How long `toolserve up` waits for the engine to load.",
    )
    pinning: PinningConfig = Field(
        default_factory=PinningConfig,
        description="KV pinning and program-level FCFS in this deployment's engines.",
    )
    prompt_lookup: PromptLookupConfig = Field(
        default_factory=PromptLookupConfig,
        description="Prompt-lookup decoding in this deployment's engines.",
    )
    admission: AdmissionConfig = Field(
        default_factory=AdmissionConfig,
        description="Cell-budget admission of new prefills in this deployment's engines.",
    )
    kv_offload: KvOffloadConfig = Field(
        default_factory=KvOffloadConfig,
        description="LMCache CPU offload under this deployment's engines (GPU only).",
    )

    @property
    def schedules_by_priority(self) -> bool:
        """Whether the engines order requests by vLLM's `priority` (which they
        refuse otherwise)."""
        if self.pinning.enabled:
            return self.pinning.program_fcfs
        return self.engine.extra_engine_args.get("scheduling_policy") == "priority"

    @property
    def uses_toolserve_scheduler(self) -> bool:
        return self.pinning.enabled or self.prompt_lookup.enabled or self.admission.enabled

    @model_validator(mode="after")
    def _pinning_owns_scheduler(self) -> ModelDeploymentConfig:
        owned = {"scheduler_cls", "scheduling_policy", "additional_config"}
        clashing = sorted(owned & self.engine.extra_engine_args.keys())
        if self.uses_toolserve_scheduler and clashing:
            raise ValueError(
                f"pinning, prompt lookup and admission set {clashing} themselves; turn "
                "them off (pinning mode: off, program_fcfs: false; prompt_lookup and "
                "admission enabled: false) "
                "to pass them in extra_engine_args"
            )
        shards = self.engine.tensor_parallel_size
        if shards > 1 and self.num_gpus != shards:
            # One replica actor holds every shard's GPU, so Ray places them on one
            # node and hands them to vLLM's workers (CUDA_VISIBLE_DEVICES); a replica
            # without them would see no GPU at all.
            raise ValueError(
                f"a replica sharded over {shards} GPUs (engine.tensor_parallel_size) "
                f"reserves them: set num_gpus: {shards} (it has {self.num_gpus:g})"
            )
        if self.kv_offload.enabled and self.num_gpus == 0:
            raise ValueError(
                "kv_offload needs GPU replicas (num_gpus > 0): LMCache does not run "
                "on vLLM's CPU backend"
            )
        if self.kv_offload.enabled and "kv_transfer_config" in self.engine.extra_engine_args:
            raise ValueError("kv_offload sets kv_transfer_config itself; turn it off to pass one")
        if self.prompt_lookup.enabled and "speculative_config" in self.engine.extra_engine_args:
            raise ValueError(
                "prompt_lookup sets speculative_config itself; turn it off to pass one"
            )
        return self


class RedisConfig(_Strict):
    """Where cluster-wide state lives."""

    url: str | None = Field(
        default="redis://127.0.0.1:6379/0",
        description="Redis to use when reachable. If it is not (or None), "
        "`toolserve up` starts its own `redis-server` on a free local port.",
    )


class RayConfig(_Strict):
    """The Ray cluster the Serve application runs on."""

    address: str | None = Field(
        default=None,
        description="Address of an existing Ray cluster (`auto`, `ray://...`); "
        "None starts a local Ray instance.",
    )
    num_cpus: int | None = Field(
        default=None, ge=1, description="CPUs of a local Ray instance; None: all."
    )
    metrics_export_port: int = Field(
        default=8080,
        ge=1,
        le=65535,
        description="Port of Ray's metrics agent, which serves Prometheus text "
        "at `/metrics` (toolserve's and vLLM's metrics).",
    )
    include_dashboard: bool = Field(
        default=False, description="Start Ray's dashboard with a local instance."
    )
    serve_control_loop_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="How often Serve's controller reconciles the application on a "
        "local instance (Ray's own default is 0.1 s). Each pass costs CPU the engine "
        "would otherwise have; a longer interval only delays noticing a replica that "
        "died or became ready by up to this long. A joined cluster keeps its own.",
    )
    serve_metrics_flush_interval_s: float = Field(
        default=1.0,
        gt=0,
        le=10,
        description="How often, on a local instance, each Serve replica and "
        "deployment handle hands the request metrics it has gathered to Ray's metrics "
        "(Ray's own default is 0.1 s). Each pass wakes every replica and handle for "
        "CPU the engine would otherwise have; Ray's agent exports them to Prometheus "
        "only every report interval (10 s by default) either way. A joined cluster "
        "keeps its own.",
    )
    serve_one_event_loop: bool = Field(
        default=True,
        description="On a local instance, each Serve replica runs its handlers and "
        "its deployment handles' routing on the replica's own event loop (Ray Serve's "
        "`RAY_SERVE_RUN_USER_CODE_IN_SEPARATE_THREAD=0` and "
        "`RAY_SERVE_RUN_ROUTER_IN_SEPARATE_LOOP=0`), so a request and each chunk of "
        "its stream cross no thread. False: Ray's default of a thread and a loop "
        "each. A joined cluster keeps its own.",
    )
    daemon_nice: int = Field(
        default=19,
        ge=0,
        le=19,
        description="Niceness a local instance's Ray daemons that serve no request "
        "run at once the cluster is ready: the GCS, the log, autoscaler and dashboard "
        "monitors, the dashboard and runtime-env agents, Serve's controller, and "
        "Serve's proxy while the ingress replica takes requests itself. Each wakes "
        "many times a second; on a machine whose cores the engine's threads share, "
        "every such wake-up stalls the engine, whose threads wait for each other. At "
        "19 they run in the engine's gaps instead. 0 leaves them as Ray starts "
        "them. The raylet keeps its niceness (the workers it starts inherit it). "
        "`toolserve nodes up` sets it on every node it starts (Serve's proxies on "
        "the nodes but the head among them); a joined cluster keeps its own.",
    )
    session_nice: int = Field(
        default=5,
        ge=0,
        le=19,
        description="Niceness of the login session `toolserve up` runs in, while it "
        "runs, against the machine's other sessions (Linux's autogroup: the kernel "
        "shares the CPU between sessions first, then among each session's processes). "
        "Above 0 the cluster yields the CPU to agents started from another terminal "
        "of the same machine; at 0 the engine's busy threads kept a benchmark client "
        "beside the embedded default waiting for a CPU for up to 4 s at a time. No "
        "effect where the kernel keeps no autogroups or in a container's own cgroup "
        "(KubeRay); a joined cluster keeps its own.",
    )


class ResponseCacheConfig(_Strict):
    """Exact repeats of a chat request answered from a stored reply, with no engine
    work (the `X-Toolserve-Cache` response header says `hit` or `miss`)."""

    enabled: bool = Field(
        default=False,
        description="Keep replies and answer exact repeats from them: the same model, "
        "messages, tools and sampling parameters, from the same tenant (API key) and "
        "session (requests outside any session are shared by their tenant). Only "
        "requests whose reply the request determines are cached: `temperature` 0 or "
        "an explicit `seed`. A reply for which a hosted tool ran is never kept.",
    )
    seed_sampled_requests: bool = Field(
        default=False,
        description="Also cache sampled requests without a `seed`, by seeding each "
        "from a digest of the request: repeats of the same request then sample the "
        "same reply, which changes sampling's meaning (a client retrying for another "
        "sample gets the same one).",
    )
    max_entries: int = Field(
        default=10000, ge=1, description="Replies kept; the least recently used go first."
    )
    ttl_s: float = Field(default=3600, gt=0, description="A reply unused for this long is dropped.")
    max_entry_bytes: int = Field(
        default=1024 * 1024, ge=1024, description="Larger replies are not kept."
    )


class TenantQuotaLimits(_Strict):
    """One tenant's limits at the API."""

    requests_per_s: float | None = Field(
        default=None,
        gt=0,
        description="Chat requests a tenant may send per second (a token bucket of "
        "`burst`); None: no limit.",
    )
    burst: int = Field(
        default=20, ge=1, description="Requests a tenant may send at once past its rate."
    )
    max_programs: int | None = Field(
        default=None,
        ge=1,
        description="Programs a tenant may run at once (from its first turn until a "
        "last-step turn, `DELETE /v1/sessions/{id}` or `program_idle_s`); a new "
        "program's first turn past it is refused. None: no limit.",
    )


class TenantQuotaConfig(TenantQuotaLimits):
    """Per-tenant quotas at the API (a tenant: one API key, or every caller without
    one): the limits above for every tenant, unless `tenants` gives it its own. A
    request past one is answered 429 with `Retry-After`, as OpenAI's API answers,
    so clients' own retries back off; refusals are counted in
    `toolserve_quota_refusals_total{quota}`."""

    programs_retry_after_s: float = Field(
        default=5,
        gt=0,
        description="`Retry-After` of a turn refused for `max_programs`.",
    )
    tenants: dict[str, TenantQuotaLimits] = Field(
        default_factory=dict,
        description="Limits of their own, in place of the ones above, by tenant id "
        "(`toolserve tenant-id` prints an API key's; `anonymous` for callers without one).",
    )


class ServerConfig(_Strict):
    """The OpenAI-compatible HTTP endpoint."""

    host: str = Field(default="127.0.0.1", description="Address the API binds.")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port.")
    ingress: Literal["direct", "proxy"] = Field(
        default="direct",
        description="How HTTP reaches the ingress replica. `direct`: the ingress "
        "replica serves the API port itself (Ray Serve's direct ingress), one process "
        "less on every request's path; a local Ray instance only. `proxy`: through "
        "Serve's HTTP proxy, for a Ray cluster of several nodes (`ray.address`).",
    )
    request_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="Longest a single API request may take, its wait for a place in "
        "the engine included; Serve then drops the connection. None: no limit, as in "
        "vLLM's server. Under program FCFS the newest programs' first turns wait while "
        "older programs' turns run, minutes when many programs arrive at once; a limit "
        "turns that wait into failed programs.",
    )
    stream_keep_alive_s: float | None = Field(
        default=15,
        gt=0,
        description="A streamed reply that has sent nothing for this long gets an SSE "
        "comment line (`: keep-alive`), which SSE clients skip, so a turn waiting for "
        "its place in the engine is not dropped by the client's read timeout or a "
        "proxy's idle timeout (often 60 s). None: nothing is sent until the first "
        "chunk, as in vLLM's server.",
    )
    ingress_ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources the ingress replica reserves, so it goes only "
        "to a node that offers them (on KubeRay, the head), e.g. `{ingress_node: 1}`.",
    )
    access_log: bool = Field(
        default=False,
        description="Serve's access log: a line per request in the replicas' logs. "
        "Off by default: every line costs the ingress and Ray's log monitor CPU that "
        "the engine would otherwise have; the request metrics count the same requests.",
    )
    max_ongoing_requests: int = Field(
        default=1024,
        ge=1,
        description="Requests the ingress holds at once (a stream holds one until it "
        "ends). Ray Serve's default of 5 would queue agents in the HTTP proxy, in "
        "front of an engine with free capacity.",
    )
    max_queued_requests: int = Field(
        default=1024,
        ge=1,
        description="Requests that may wait for one of `max_ongoing_requests`; one "
        "more is refused at once with 429 and `Retry-After` (Ray Serve's backpressure, "
        "whose body is Serve's plain text, not an OpenAI error), so an overloaded "
        "server answers instead of hanging. Serve counts every arriving request as "
        "waiting until it takes a slot, free or not: keep this above the largest "
        "burst of simultaneous arrivals, or a burst is refused with slots free.",
    )
    retry_after_s: float = Field(
        default=1, ge=0, description="The `Retry-After` of a request refused with 429."
    )
    max_request_bytes: int = Field(
        default=8 * 1024 * 1024,
        ge=1024,
        description="Largest request body; a larger one is refused with 413 before it "
        "is read whole.",
    )
    max_messages: int = Field(
        default=4096, ge=1, description="Most messages a chat request may carry (400 beyond)."
    )
    derive_program_ids: bool = Field(
        default=False,
        description="A chat request without a session id (header, body or agent hint) "
        "belongs to the program named by a digest of its conversation's opening "
        "(instructions, first user message, tools), so agents that send no id still get "
        "pins and program FCFS; conversations that open identically share one program. "
        "False: such a request is a program of one turn.",
    )
    max_session_id_chars: int = Field(
        default=256,
        ge=8,
        description="Longest session id (`X-Session-ID` or `session_id`); control "
        "characters are refused too (400).",
    )
    api_keys: list[SecretStr] = Field(
        default_factory=list,
        description="API keys the server accepts (`Authorization: Bearer KEY`; shown "
        "masked wherever the configuration is printed or saved); a "
        "missing or unknown key gets 401. Empty, with no `api_keys_file`: no key is "
        "required. Either way a key names its caller's tenant (callers without one "
        "are one anonymous tenant): programs, pins, tool state and cached tool "
        "outputs are the tenant's own.",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="A file of further accepted API keys, one per line (blank lines "
        "and `#` comments skipped), read when the application is built: a "
        "Kubernetes Secret mounted as a file.",
    )
    shared_prefix_cache: bool = Field(
        default=False,
        description="Let requests of different tenants hit each other's cached "
        "prompt prefixes in the engine. Off: each tenant's prefix blocks are salted "
        "with its tenant (vLLM's `cache_salt`), so a tenant cannot learn another's "
        "prompts by timing a cache hit; on: common preambles (system prompt, tool "
        "schemas) are prefilled once for all tenants.",
    )
    quotas: TenantQuotaConfig = Field(
        default_factory=TenantQuotaConfig, description="Per-tenant quotas at the API."
    )
    program_idle_s: float = Field(
        default=300,
        gt=0,
        description="A program with no turn for this long counts as ended in the "
        "program metrics (`toolserve_program_completion_s`, `toolserve_program_turns`); "
        "a last-step turn or `DELETE /v1/sessions/{id}` ends it at once.",
    )
    session_ttl_s: float = Field(
        default=3600,
        gt=0,
        description="How long a session id stays known after its last turn or "
        "tool-state reset; `DELETE /v1/sessions/{id}` of an id unknown to the "
        "caller's tenant (never used, ended, or idle longer) answers 404.",
    )

    response_cache: ResponseCacheConfig = Field(
        default_factory=ResponseCacheConfig,
        description="Replies of deterministic requests kept in Redis, for exact repeats.",
    )

    def accepted_api_keys(self) -> list[str]:
        """`api_keys` and those in `api_keys_file`."""
        keys = [key.get_secret_value() for key in self.api_keys]
        if self.api_keys_file is not None:
            try:
                lines = self.api_keys_file.read_text().splitlines()
            except OSError as error:
                raise ConfigError(
                    f"server.api_keys_file {self.api_keys_file}: {error.strerror}"
                ) from error
            stripped = (line.strip() for line in lines)
            keys += [key for key in stripped if key and not key.startswith("#")]
        return keys


class RoutingConfig(_Strict):
    """How the ingress picks a main-model replica for each turn (draft-model
    replicas always go to the least-loaded of two random choices)."""

    policy: Literal["session", "power_of_two", "consistent_hash"] = Field(
        default="session",
        description="`session`: toolserve's router (the replica holding the program's "
        "pinned KV, then the replica of its previous turn, then by its prompt prefix for "
        "new programs (`prefix_placement`), then consistent hashing with bounded "
        "load). `power_of_two` and `consistent_hash` are Ray Serve's own routers, for "
        "comparison.",
    )
    load_epsilon: float = Field(
        default=0.25,
        gt=0,
        description="Bounded load: except for pinned turns, no replica takes a request "
        "that would leave it above ceil((1 + load_epsilon) x mean) requests in flight.",
    )
    affinity_load_factor: float = Field(
        default=1.5,
        description="A program goes to the replica holding its pinned KV (else to the "
        "replica of its previous turn) unless that replica would exceed "
        "ceil(affinity_load_factor x mean) in flight, or serves more than "
        "ceil(affinity_load_factor x mean) live programs; then the turn goes elsewhere "
        "and a pin there is released. At least 1 + load_epsilon.",
    )
    stay_while_engine_has_room: bool = Field(
        default=True,
        description="A program also stays on its pinned (or previous) replica, whatever "
        "the mean in flight (not when it is crowded with live programs), while that "
        "replica has fewer requests in flight than its engine "
        "decodes at once (`main.engine.max_num_seqs`): the turn starts at once with its KV "
        "resident, where a move would cost a whole prefill for a less busy batch.",
    )
    live_after_turn_s: float = Field(
        default=30.0,
        ge=0,
        description="A program counts as live on its replica while a turn is in flight "
        "and this long after a turn ends (its tool is running). New programs are placed "
        "so that no replica serves more than ceil((1 + load_epsilon) x mean) live "
        "programs where the in-flight bound allows it.",
    )
    virtual_nodes: int = Field(
        default=100, ge=1, description="Points per replica on the consistent-hash ring."
    )
    min_prefix_chars: int = Field(
        default=1000,
        ge=1,
        description="Shortest shared prefix (system messages plus tool schemas, as "
        "JSON) by which a new program is placed (`prefix_placement`).",
    )
    prefix_placement: Literal["join", "spread"] = Field(
        default="join",
        description="Where a new program whose long prompt prefix other programs "
        "share goes. `join`: the least loaded replica already serving that prefix "
        "(its prefill computed once for all). `spread`: the replica that took the "
        "fewest programs of that prefix, so programs of one kind, which tend to run "
        "alike (as long, as many turns), are divided evenly between the replicas, "
        "each computing the prefix once. Both within the load bounds.",
    )
    max_remembered_programs: int = Field(
        default=100_000, ge=1, description="Programs whose last replica the router keeps."
    )
    ledger_timeout_s: float = Field(
        default=0.25,
        gt=0,
        description="Longest a routing decision waits for the TTL ledger; when Redis is "
        "slower or down the router routes without pins (on previous replicas) for 5 s.",
    )

    @model_validator(mode="after")
    def _pinned_bound_not_tighter(self) -> RoutingConfig:
        if self.affinity_load_factor < 1 + self.load_epsilon:
            raise ValueError("affinity_load_factor must be at least 1 + load_epsilon")
        return self


class SandboxLimits(_Strict):
    """Limits of the subprocess each hosted tool call runs in."""

    memory_mb: int = Field(
        default=1024, ge=64, description="Address-space limit of the tool process, MiB."
    )
    cpu_s: float = Field(
        default=60, gt=0, description="CPU seconds a call may use (also capped by its timeout)."
    )
    max_output_bytes: int = Field(
        default=1_000_000, ge=1024, description="Largest result a call may return."
    )
    max_file_bytes: int = Field(
        default=64 * 1024 * 1024, ge=0, description="Largest file a call may write."
    )
    network: bool = Field(
        default=False,
        description="Let tools open sockets. Off: an empty network namespace where the "
        "kernel allows one, and socket calls refused in the tool process either way.",
    )
    allowed_paths: list[str] = Field(
        default_factory=list,
        description="Further paths every tool may read and write. Beyond them a tool "
        "reads only its call directory, absolute paths in its `options` and the Python "
        "installation, writes only its call directory and paths in its `options`, and "
        "starts no process, calls no foreign code (ctypes) and signals only itself.",
    )
    run_as: tuple[int, int] = Field(
        default=(65534, 65534),
        description="uid and gid a tool runs as when the worker is root (else as the "
        "worker's own user, inside a user namespace). Paths in a tool's options and "
        "`allowed_paths` must be readable (writable) by them.",
    )
    scratch_mb: int = Field(
        default=64, ge=1, description="Size of a call's scratch directory (memory-backed), MiB."
    )
    max_processes: int = Field(
        default=32,
        ge=1,
        description="Processes the tool's uid may have (`RLIMIT_NPROC`; calls share the uid).",
    )
    max_open_files: int = Field(
        default=256, ge=16, description="File descriptors a call's process may hold."
    )
    audit_hooks: bool = Field(
        default=True,
        description="Python audit hooks in the tool process that refuse, with an error "
        "saying why, what the operating system's confinement refuses anyway (it is "
        "what confines; the hooks only explain). Off: the tool meets the kernel's refusals.",
    )


class HostedToolConfig(_Strict):
    """One hosted tool: a Python callable declared with `@hosted_tool`."""

    function: str = Field(
        description="`package.module:function` of a callable declared with "
        "`toolworkers.registry.hosted_tool`."
    )
    name: str | None = Field(default=None, description="Tool name; None: the declared one.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="Keyword arguments bound to every call (e.g. `root` of file tools).",
    )
    timeout_s: float | None = Field(
        default=None, gt=0, description="Wall-clock limit per call; None: the declared one."
    )
    side_effect_free: bool | None = Field(
        default=None,
        description="Override the declaration; only side-effect-free tools are "
        "speculated or cached. None: the declared value.",
    )
    keep_alive_s: float | None = Field(
        default=None, gt=0, description="Tool-cache lifetime of a result; None: the default."
    )


class ToolCacheConfig(_Strict):
    """The global tool cache in Redis."""

    max_entries: int = Field(
        default=100_000, ge=1, description="Results kept at most; the soonest to expire go first."
    )
    keep_alive_s: float = Field(
        default=300, gt=0, description="Default lifetime of a cached result."
    )
    max_posted_keep_alive_s: float = Field(
        default=86_400,
        gt=0,
        description="Longest lifetime a client may give an output it posts "
        "(`/cache-tool-output`, `keep_alive`); a longer one is cut to this.",
    )
    response_owner_ttl_s: float = Field(
        default=3600,
        gt=0,
        description="How long after a chat completion its caller may still post tool "
        "outputs for it (`/cache-tool-output/{response_id}`).",
    )
    pending_lease_s: float = Field(
        default=30,
        gt=0,
        description="How long a running call holds its key beyond its timeout before "
        "another requester may run it (a worker that died mid-call).",
    )


class ContinuationConfig(_Strict):
    """Engine-side continuation: the server runs the model's calls of hosted tools
    (and uses results the client posted for its own tools) and continues the turn."""

    enabled: bool = Field(
        default=True,
        description="Continue turns server-side; a request can still turn it off "
        "(`toolserve.execute_tools: false`).",
    )
    max_rounds: int = Field(
        default=8, ge=1, description="Tool rounds one request may run before the call goes back."
    )
    client_result_wait_s: float = Field(
        default=0.0,
        ge=0,
        description="How long to wait for a client-posted result of a client tool the "
        "model called; 0: use it only when already posted.",
    )
    stream_client_calls: bool = Field(
        default=True,
        description="In a streamed turn, send a call of a tool the client runs (declared, "
        "not hosted) as the model writes it, as vLLM does, instead of whole at its "
        "round's end; the round then goes to the client, so a result the client posts "
        "for that call is not waited for. A request may choose otherwise "
        "(`toolserve.stream_client_calls`).",
    )
    partial_execution: bool = Field(
        default=True,
        description="Start a hosted tool that takes partial input (the `python` tool) "
        "on the parts of its arguments already decoded, while the model still writes "
        "the call (streamed turns; needs Redis, which carries the parts to the tool "
        "worker). Off, or without Redis: the call runs once the turn has ended.",
    )
    stop_invalid_calls: bool = Field(
        default=True,
        description="Stop decoding a streamed round at the first call that can never be "
        "valid (a tool the request does not declare; an argument the tool's schema "
        "rejects, checked as each argument closes) when the server would answer the "
        "call, and answer it with the reason instead, so the model writes it again in "
        "the next round. A request can set it (`toolserve.stop_invalid_calls`).",
    )


class SpeculationConfig(_Strict):
    """Speculative tool calls: predicted calls of side-effect-free hosted tools start
    on the tool workers while the main model is still generating."""

    enabled: bool = Field(default=True, description="Speculate at all.")
    draft_predictions: int = Field(
        default=1,
        ge=0,
        description="λ: tool-call samples asked of the draft model per request (0: none; "
        "needs a draft deployment).",
    )
    draft_temperature: float = Field(
        default=0.8,
        ge=0,
        description="Temperature of the draft's samples when λ > 1 (one sample is greedy).",
    )
    draft_max_tokens: int = Field(
        default=128, ge=8, description="Longest draft prediction, in tokens."
    )
    draft_when: Literal["always", "no_learned_prediction"] = Field(
        default="always",
        description="Ask the draft for every request, or only when the learned "
        "predictor has no call to start (the draft costs model time; where it shares "
        "the cores with the main model, it slows the turn it predicts).",
    )
    draft_min_run_ratio: float = Field(
        default=1.0,
        ge=0,
        description="Ask the draft only for turns declaring a side-effect-free hosted "
        "tool whose typical run lasts at least this many times the draft's typical "
        "answer (medians of their last runs here; a tool not run yet, or a draft not "
        "answered yet, counts as worth it): a guessed run saves at most the tool's own "
        "run time, and the draft's answer takes its own, on shared cores from the turn "
        "it predicts (0: every turn).",
    )
    learned: bool = Field(
        default=True,
        description="Also predict from transitions learned online per agent kind "
        "(toolworkers/predictor.py).",
    )
    learned_predictions: int = Field(
        default=1, ge=1, description="Learned predictions tried per request."
    )
    learned_min_support: int = Field(
        default=2, ge=1, description="Times a transition must have been seen to be predicted."
    )
    learned_min_confidence: float = Field(
        default=0.5,
        ge=0,
        le=1,
        description="Least frequency of the predicted tool and of each argument's source.",
    )
    moderate_min_confidence: float = Field(
        default=0.3, ge=0, le=1, description="Least confidence to speculate a moderate-cost tool."
    )
    expensive_min_confidence: float = Field(
        default=0.8, ge=0, le=1, description="Least confidence to speculate an expensive tool."
    )
    ledger_ttl_s: float = Field(
        default=7 * 24 * 3600.0,
        gt=0,
        description="How long a tenant's speculation ledger (runs used and discarded, "
        "their tool CPU and draft tokens; `GET /v1/tools`) is kept after its last turn.",
    )


class ToolsConfig(_Strict):
    """Hosted tools, the tool workers that run them, and the global tool cache."""

    hosted: list[HostedToolConfig] = Field(
        default_factory=list, description="Tools the cluster can run itself."
    )
    workers: int = Field(default=1, ge=1, description="Tool-worker actors.")
    worker_ray_resources: dict[str, float] = Field(
        default_factory=dict,
        description="Ray custom resources each tool worker reserves, so tool workers "
        "go only to the nodes that offer them, e.g. `{tool_node: 0.01}`.",
    )
    worker_max_concurrency: int = Field(
        default=8, ge=1, description="Calls one tool worker runs at once."
    )
    max_calls_per_tenant: int | None = Field(
        default=None,
        ge=1,
        description="Hosted calls one tenant runs at once from one deployment replica "
        "(the ingress, each model replica); more wait for one to end, and "
        "speculative calls past it are not made. None: no limit.",
    )
    sandbox: SandboxLimits = Field(
        default_factory=SandboxLimits, description="Limits of each call's process."
    )
    cache: ToolCacheConfig = Field(
        default_factory=ToolCacheConfig, description="Global tool cache."
    )
    state_ttl_s: float = Field(
        default=3600,
        gt=0,
        description="How long a program's stateful-tool state (and scenario) is kept "
        "after its last change; `DELETE /v1/sessions/{program}` drops it at once.",
    )
    continuation: ContinuationConfig = Field(
        default_factory=ContinuationConfig, description="Engine-side continuation."
    )
    speculation: SpeculationConfig = Field(
        default_factory=SpeculationConfig, description="Speculative tool calls."
    )


class ToolserveConfig(_Strict):
    """A whole toolserve deployment."""

    name: str = Field(description="Name of the Serve application and of this profile.")
    main: ModelDeploymentConfig = Field(description="Main-model replicas agents talk to.")
    draft: ModelDeploymentConfig | None = Field(
        default=None,
        description="Draft-model replicas used to predict tool calls; None: no draft.",
    )
    draft_placement: Literal["own_replicas", "main_replicas"] = Field(
        default="own_replicas",
        description="Where the draft runs. `main_replicas`, for a draft that is the main "
        "model: the main replicas' engines also answer to the draft's name, so a "
        "prediction shares the conversation's cached prefix and batches with the turn "
        "instead of a second engine competing for the same cores (only the draft's "
        "`served_model_name` is used then).",
    )
    main_placement: Literal["own_replicas", "ingress"] = Field(
        default="own_replicas",
        description="Where the main model runs. `own_replicas`: a deployment of its own, "
        "whose replicas the session router picks per turn. `ingress`: inside the ingress "
        "replica, one main replica then, called directly: a turn makes no Ray call "
        "between ingress and model, and there is nothing to route.",
    )
    redis: RedisConfig = Field(default_factory=RedisConfig, description="Cluster state store.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray cluster.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP endpoint.")
    routing: RoutingConfig = Field(
        default_factory=RoutingConfig, description="Choice of main-model replica per turn."
    )
    tools: ToolsConfig = Field(
        default_factory=ToolsConfig, description="Hosted tools, tool workers, tool cache."
    )
    cache_dir: Path = Field(
        default_factory=lambda: Path(
            os.environ.get("TOOLSERVE_CACHE_DIR", Path.home() / ".cache" / "toolserve")
        ),
        description="Where embedded models and profiles are prepared. "
        "Defaults to $TOOLSERVE_CACHE_DIR or ~/.cache/toolserve.",
    )

    @model_validator(mode="after")
    def _distinct_model_names(self) -> ToolserveConfig:
        if self.draft and (
            self.draft.engine.served_model_name == self.main.engine.served_model_name
        ):
            raise ValueError("main and draft need different served_model_name values")
        return self

    @model_validator(mode="after")
    def _main_in_the_ingress_is_one_replica(self) -> ToolserveConfig:
        if self.main_placement == "ingress" and self.main.num_replicas != 1:
            raise ValueError(
                "main_placement ingress runs one main replica; set main.num_replicas: 1 "
                "or main_placement: own_replicas"
            )
        return self

    @model_validator(mode="after")
    def _direct_ingress_on_a_local_instance(self) -> ToolserveConfig:
        if self.server.ingress == "direct" and self.ray.address is not None:
            raise ValueError(
                "server.ingress direct needs a local Ray instance (ray.address unset); "
                "set server.ingress: proxy to join a Ray cluster"
            )
        return self

    @model_validator(mode="after")
    def _draft_on_main_is_the_main_model(self) -> ToolserveConfig:
        if self.draft_placement == "main_replicas" and (
            self.draft is None
            or (self.draft.engine.model, self.draft.engine.dtype)
            != (self.main.engine.model, self.main.engine.dtype)
        ):
            raise ValueError(
                "draft_placement main_replicas needs a draft with the main model and dtype"
            )
        return self

    @property
    def draft_replicas(self) -> ModelDeploymentConfig | None:
        """The draft's own deployment, if it has one."""
        return self.draft if self.draft_placement == "own_replicas" else None

    @property
    def names_served_by_main(self) -> list[str]:
        names = [self.main.engine.served_model_name]
        if self.draft is not None and self.draft_replicas is None:
            names.append(self.draft.engine.served_model_name)
        return names


class ConfigError(ValueError):
    """A configuration file is missing or invalid."""


def load_config(path: Path | str | None = None) -> ToolserveConfig:
    """Load and validate a deployment profile (the embedded default when no path)."""
    config_path = Path(path) if path is not None else DEFAULT_CONFIG_PATH
    if not config_path.exists() and not config_path.is_absolute():
        config_path = CONFIGS_DIR / config_path
    try:
        raw = yaml.safe_load(config_path.read_text())
    except FileNotFoundError as error:
        raise ConfigError(f"no configuration file at {config_path}") from error
    except yaml.YAMLError as error:
        raise ConfigError(f"{config_path} is not valid YAML: {error}") from error
    try:
        return ToolserveConfig.model_validate(raw)
    except ValidationError as error:
        raise ConfigError(f"{config_path} is not a valid toolserve config:\n{error}") from error
