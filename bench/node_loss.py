"""A node-loss run: agent programs on a cluster of several nodes (`toolserve
nodes up`), one model node lost mid-run (every process of it killed) and started
again, then Redis cut off the network for a while; what was started, completed,
sent again and refused, counted from the client's side and the cluster's.

The run drives the cluster as an operator does: `toolserve nodes up|kill|start|
partition` and the OpenAI API; it watches `/health` and the TTL ledger every
few seconds, and reads the ingress's metrics at the end."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.driver import Driver
from bench.metrics import counter_totals, gauge_totals
from bench.provenance import (
    Provenance,
    note_code_state,
    provenance_line,
    start_provenance,
    utc_now,
)
from bench.records import ProgramLoad, RequestRecord, append_records, start_records
from bench.runner import Log
from bench.soak import soak_programs
from bench.systems import scrape_metrics, toolserve_command
from cluster.config import REPO_ROOT, ToolserveConfig, load_config
from cluster.node_layout import DEFAULT_NODES, head_node
from cluster.store.pins import TtlLedger

SYSTEM = "toolserve"
HEALTH_INTERVAL_S = 2.0
RESENDS_METRIC = "toolserve_turn_resends_total"
SERVING_TIMEOUT_S = 900.0
BUSY_WAIT_S = 60.0
RUNNING_EVENT = "turns running on the node"
RUNNING_GAUGES = ("vllm:num_requests_running", "vllm_num_requests_running")


@dataclass(frozen=True)
class NodeLossOptions:
    programs: int
    """Programs running at any time while the load runs."""
    load_minutes: float
    """How long new programs start; those running then are let finish."""
    lost_node: str
    kill_at_s: float
    down_s: float
    """How long the lost node stays down before `toolserve nodes start`."""
    partition_at_s: float
    partition_s: float
    drain_timeout_s: float
    seed: int
    config_path: Path
    output_dir: Path
    run_name: str
    argv: Sequence[str]
    allow_dirty: bool = False

    def check(self) -> None:
        start_at = self.kill_at_s + self.down_s
        load_s = self.load_minutes * 60
        if not 0 < self.kill_at_s < start_at < self.partition_at_s < load_s:
            raise ValueError(
                "the faults must come in order within the load: 0 < kill at < kill at + "
                "down < partition at < load minutes"
            )
        if self.programs < 1:
            raise ValueError("--programs must be at least 1")


@dataclass(frozen=True)
class Event:
    at_s: float
    what: str
    detail: str = ""

    def as_json(self) -> dict[str, Any]:
        return {"kind": "event", **asdict(self)}


@dataclass(frozen=True)
class Observation:
    """`/health` and the TTL ledger at one moment; None where they did not answer."""

    at_s: float
    status: str | None
    main_nodes: dict[str, str]
    """Each ready main replica's node address."""
    pending: int
    pins: dict[str, int] | None
    """Live pins by replica, from the ledger."""

    def as_json(self) -> dict[str, Any]:
        return {"kind": "observation", **asdict(self)}


@dataclass
class NodeLossRun:
    """What a node-loss run did and saw."""

    options: NodeLossOptions
    lost_address: str
    config: ToolserveConfig
    provenance: Provenance
    load: ProgramLoad = field(default_factory=ProgramLoad)
    events: list[Event] = field(default_factory=list)
    observations: list[Observation] = field(default_factory=list)
    resends: float = 0.0
    """Turns the ingress sent again after losing their replica."""


class _Watcher:
    """Samples `/health` and the ledger on a thread of its own."""

    def __init__(self, health_url: str, redis_url: str, started: float):
        self._health_url = health_url
        self._ledger = TtlLedger(redis_url)
        self._started = started
        self._stop = threading.Event()
        self.observations: list[Observation] = []
        self._thread = threading.Thread(target=self._run, name="node-loss-watch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        self._ledger.close()

    def _run(self) -> None:
        while not self._stop.wait(HEALTH_INTERVAL_S):
            self.observations.append(self.observe())

    def observe(self) -> Observation:
        at = time.monotonic() - self._started
        status, main_nodes, pending = _health(self._health_url)
        return Observation(
            round(at, 1), status, main_nodes, pending, self._ledger.pins_by_replica()
        )


def _health(url: str) -> tuple[str | None, dict[str, str], int]:
    """`/health`'s status, each ready main replica's node address, and how many
    main replicas are pending; None and nothing when it does not answer."""
    main_nodes: dict[str, str] = {}
    pending = 0
    try:
        health = httpx.get(url, timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return None, main_nodes, pending
    for engine in health.get("engines", []):
        if engine.get("role") != "main":
            continue
        if engine.get("state") == "ready":
            main_nodes[engine["replica"]] = engine.get("node", "")
        elif engine.get("state") == "pending":
            pending += 1
    return health.get("status"), main_nodes, pending


async def _run_load(
    base_url: str, model: str, options: NodeLossOptions, load: ProgramLoad, started: float
) -> None:
    driver = Driver(base_url, model, SYSTEM, 0)
    stream = soak_programs(options.seed, options.programs, hosted_share=0.0)
    load_ends = started + options.load_minutes * 60

    async def slot() -> None:
        while time.monotonic() < load_ends:
            program = next(stream)
            load.started += 1
            load.finished(await driver.run_program(program, started, load.requests))

    try:
        await driver.warm_up()
        # Programs still running at the timeout count as unfinished.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                asyncio.gather(*(slot() for _ in range(options.programs))),
                timeout=options.load_minutes * 60 + options.drain_timeout_s,
            )
    finally:
        await driver.close()


def _running_turns(metrics_url: str) -> float:
    gauges = gauge_totals(scrape_metrics(metrics_url))
    return sum(gauges.get(name, 0.0) for name in RUNNING_GAUGES)


def _until_turns_run_on(metrics_url: str, done: threading.Event) -> float:
    """Waits (up to `BUSY_WAIT_S`) until the node's engine is running turns, so the
    kill finds turns in flight; how many it runs."""
    deadline = time.monotonic() + BUSY_WAIT_S
    while not done.is_set():
        running = _running_turns(metrics_url)
        if running > 0 or time.monotonic() > deadline:
            return running
        time.sleep(0.2)
    return 0.0


def _faults(
    options: NodeLossOptions,
    lost_metrics_url: str,
    started: float,
    events: list[Event],
    done: threading.Event,
    log: Log,
) -> None:
    """Kill the node, start it again, then partition Redis, each at its time."""

    def at(seconds: float) -> bool:
        return not done.wait(max(0.0, started + seconds - time.monotonic()))

    def run(what: str, *arguments: str) -> None:
        events.append(Event(round(time.monotonic() - started, 1), f"{what} begins"))
        command = toolserve_command("nodes", *arguments)
        result = subprocess.run(command, capture_output=True, text=True)
        detail = "" if result.returncode == 0 else result.stderr.strip()[-500:]
        events.append(Event(round(time.monotonic() - started, 1), f"{what} ends", detail))
        log(f"node-loss: {what} (exit {result.returncode})")

    if at(options.kill_at_s):
        running = _until_turns_run_on(lost_metrics_url, done)
        events.append(Event(round(time.monotonic() - started, 1), RUNNING_EVENT, str(running)))
        run("kill", "kill", options.lost_node)
    if at(options.kill_at_s + options.down_s):
        run("start", "start", options.lost_node)
    if at(options.partition_at_s):
        run("partition", "partition", "redis", "--seconds", str(options.partition_s))


def run_node_loss(options: NodeLossOptions, log: Log = print) -> Path:
    options.check()
    provenance = start_provenance(
        ["toolserve", *options.argv], REPO_ROOT, options.output_dir, options.allow_dirty
    )
    run_dir = options.output_dir / options.run_name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    config = load_config(options.config_path)
    nodes = {node.name: node for node in DEFAULT_NODES}
    if options.lost_node not in nodes or nodes[options.lost_node].head:
        workers = sorted(name for name, node in nodes.items() if not node.head)
        raise ValueError(f"--lost-node must be a worker node: one of {workers}")
    head = head_node()
    api_root = f"http://{head.address}:{config.server.port}"
    lost_address = nodes[options.lost_node].address
    redis_url = config.redis.url
    if redis_url is None:
        raise ValueError("the profile must name the nodes' Redis (redis.url)")
    log(f"node-loss: starting the nodes and toolserve at {provenance.commit}")
    nodes_log_path = run_dir / "logs" / "nodes.log"
    with nodes_log_path.open("ab") as nodes_log:
        cluster = subprocess.Popen(
            toolserve_command("nodes", "up", "--config", str(options.config_path)),
            stdout=nodes_log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
        )
    run = NodeLossRun(options, lost_address, config, provenance)
    load, events = run.load, run.events
    try:
        _wait_until_serving(f"{api_root}/health", cluster, config, nodes_log_path)
        started = time.monotonic()
        watcher = _Watcher(f"{api_root}/health", redis_url, started)
        watcher.start()
        done = threading.Event()
        faults = threading.Thread(
            target=_faults,
            args=(options, nodes[options.lost_node].metrics_url, started, events, done, log),
            name="node-loss-faults",
        )
        faults.start()
        try:
            asyncio.run(
                _run_load(
                    f"{api_root}/v1", config.main.engine.served_model_name, options, load, started
                )
            )
            events.append(Event(round(time.monotonic() - started, 1), "load drained"))
            faults.join()
            _wait_for_ok(watcher, nodes_back_timeout_s=SERVING_TIMEOUT_S)
        finally:
            done.set()
            faults.join()
            watcher.stop()
        ingress_metrics = scrape_metrics(head.metrics_url)
    finally:
        cluster.send_signal(signal.SIGINT)
        try:
            cluster.wait(timeout=180)
        except subprocess.TimeoutExpired:
            cluster.kill()
            subprocess.run(toolserve_command("nodes", "down"), check=False)
    provenance.finished_utc = utc_now()
    note_code_state(provenance, REPO_ROOT, options.output_dir)
    counters = counter_totals(ingress_metrics)
    run.resends = counters.get(RESENDS_METRIC, 0.0) + counters.get(f"ray_{RESENDS_METRIC}", 0.0)
    run.observations = watcher.observations
    return write_node_loss_run(run_dir, run)


def _wait_until_serving(
    health_url: str, cluster: subprocess.Popen[bytes], config: ToolserveConfig, log_path: Path
) -> None:
    deadline = time.monotonic() + SERVING_TIMEOUT_S
    wanted = config.main.num_replicas
    while time.monotonic() < deadline:
        if cluster.poll() is not None:
            raise RuntimeError(f"toolserve nodes up exited ({cluster.returncode}); see {log_path}")
        status, main_nodes, _ = _health(health_url)
        if status == "ok" and len(main_nodes) == wanted:
            return
        time.sleep(2)
    raise RuntimeError(f"{health_url} not ok with {wanted} main replicas in time")


def _wait_for_ok(watcher: _Watcher, nodes_back_timeout_s: float) -> None:
    """Until `/health` is ok again after the faults (the node's replica placed)."""
    deadline = time.monotonic() + nodes_back_timeout_s
    while time.monotonic() < deadline:
        if watcher.observations and watcher.observations[-1].status == "ok":
            return
        time.sleep(HEALTH_INTERVAL_S)


def _first(
    observations: Sequence[Observation], after_s: float, test: Callable[..., bool]
) -> float | None:
    return next((seen.at_s for seen in observations if seen.at_s >= after_s and test(seen)), None)


def _event_at(events: Sequence[Event], what: str) -> float | None:
    return next((event.at_s for event in events if event.what == what), None)


def _error_kind(error: str) -> str:
    """The error's class and status; whether a 5xx came with OpenAI's error body."""
    kind = error.split(":", 1)[0]
    if "Error code: 5" in error:
        kind += " (OpenAI-style body)" if "{'error':" in error else " (no OpenAI-style body)"
    return kind


def node_loss_summary(run: NodeLossRun) -> dict[str, Any]:
    options, config, load, lost_address = run.options, run.config, run.load, run.lost_address
    events, observations = run.events, run.observations
    killed_at = _event_at(events, "kill ends")
    started_at = _event_at(events, "start ends")
    partition = (_event_at(events, "partition begins"), _event_at(events, "partition ends"))
    before_kill = [seen for seen in observations if killed_at is None or seen.at_s < killed_at]
    lost_replicas = {
        replica
        for seen in before_kill[-5:]
        for replica, node in seen.main_nodes.items()
        if node == lost_address
    }
    pins_at_kill = max(
        (
            sum((seen.pins or {}).get(replica, 0) for replica in lost_replicas)
            for seen in before_kill[-3:]
        ),
        default=0,
    )
    pins_gone = (
        None
        if killed_at is None
        else _first(
            observations,
            killed_at,
            lambda seen: (
                seen.pins is not None
                and not any(seen.pins.get(replica) for replica in lost_replicas)
            ),
        )
    )
    degraded = (
        None
        if killed_at is None
        else _first(observations, killed_at, lambda seen: seen.status == "degraded")
    )
    back = (
        None
        if started_at is None
        else _first(
            observations,
            started_at,
            lambda seen: seen.status == "ok" and lost_address in seen.main_nodes.values(),
        )
    )
    requests = load.requests
    errors = Counter(_error_kind(request.error) for request in requests if request.error)
    replicas_by_program: dict[str, set[str]] = {}
    for request in requests:
        if request.replica:
            replicas_by_program.setdefault(request.program_id, set()).add(request.replica)
    in_partition = [
        request
        for request in requests
        if partition[0] is not None
        and partition[1] is not None
        and partition[0] <= request.sent_s + request.latency_s <= partition[1]
    ]
    return {
        "kind": "node_loss",
        "provenance": run.provenance.as_json(),
        "options": {
            "programs": options.programs,
            "load_minutes": options.load_minutes,
            "lost_node": options.lost_node,
            "kill_at_s": options.kill_at_s,
            "down_s": options.down_s,
            "partition_at_s": options.partition_at_s,
            "partition_s": options.partition_s,
            "seed": options.seed,
            "profile": str(options.config_path),
            "pinning_mode": config.main.pinning.mode,
            "max_pin_ttl_s": config.main.pinning.max_ttl_s,
        },
        "programs": {
            "started": load.started,
            "completed": load.completed,
            "failed": load.failed,
            "unfinished": load.started - load.completed - load.failed,
            "on_both_model_nodes": sum(len(used) > 1 for used in replicas_by_program.values()),
        },
        "requests": {
            "sent": len(requests),
            "failed": sum(request.error is not None for request in requests),
            "errors": dict(errors),
            "sent_again_after_replica_loss": run.resends,
            "completed_during_partition": sum(request.error is None for request in in_partition),
            "failed_during_partition": sum(request.error is not None for request in in_partition),
        },
        "node": {
            "address": lost_address,
            "replicas": sorted(lost_replicas),
            "killed_at_s": killed_at,
            "started_at_s": started_at,
            "turns_running_at_kill": next(
                (float(event.detail) for event in events if event.what == RUNNING_EVENT), None
            ),
            "pins_at_kill": pins_at_kill,
            "pins_gone_after_s": None
            if pins_gone is None or killed_at is None
            else round(pins_gone - killed_at, 1),
            "health_degraded_after_s": None
            if degraded is None or killed_at is None
            else round(degraded - killed_at, 1),
            "serving_again_after_start_s": None
            if back is None or started_at is None
            else round(back - started_at, 1),
        },
        "events": [event.as_json() for event in events],
    }


def write_node_loss_run(run_dir: Path, run: NodeLossRun) -> Path:
    summary = node_loss_summary(run)
    records = start_records(run_dir)
    append_records(
        records, [*run.events, *run.observations, *run.load.programs, *run.load.requests]
    )
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(run_dir / "node-loss.png", summary, run.observations, run.load.requests)
    (run_dir / "report.md").write_text(node_loss_report(run_dir.name, summary))
    return run_dir


def _plot(
    path: Path,
    summary: dict[str, Any],
    observations: Sequence[Observation],
    requests: Sequence[RequestRecord],
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bucket_s = 10.0
    replicas = sorted({request.replica or "(none)" for request in requests})
    last = max((request.sent_s + request.latency_s for request in requests), default=0.0)
    buckets = [index * bucket_s for index in range(int(last // bucket_s) + 1)]
    figure, (turns_axis, pins_axis) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    for replica in replicas:
        ended = Counter(
            int((request.sent_s + request.latency_s) // bucket_s)
            for request in requests
            if (request.replica or "(none)") == replica and request.error is None
        )
        turns_axis.plot(
            buckets, [ended.get(index, 0) for index in range(len(buckets))], label=replica
        )
    failed = Counter(
        int((request.sent_s + request.latency_s) // bucket_s)
        for request in requests
        if request.error
    )
    if failed:
        turns_axis.plot(
            buckets, [failed.get(index, 0) for index in range(len(buckets))], label="failed"
        )
    turns_axis.set_title(f"turns completed per {bucket_s:.0f} s, by replica")
    pinned_replicas = sorted({replica for seen in observations for replica in seen.pins or {}})
    times = [seen.at_s for seen in observations]
    for replica in pinned_replicas:
        pins_axis.plot(
            times,
            [(seen.pins or {}).get(replica, 0) for seen in observations],
            label=f"pins {replica}",
        )
    unhealthy = [seen.at_s for seen in observations if seen.status != "ok"]
    if unhealthy:
        pins_axis.scatter(
            unhealthy, [0] * len(unhealthy), marker="|", color="red", label="/health not ok"
        )
    pins_axis.set_title("live pins in the TTL ledger, by replica")
    pins_axis.set_xlabel("seconds")
    for event in summary["events"]:
        if event["what"].endswith("begins"):
            for axis in (turns_axis, pins_axis):
                axis.axvline(event["at_s"], color="grey", linestyle=":")
            turns_axis.annotate(
                event["what"].split()[0], (event["at_s"], 0), rotation=90, fontsize="small"
            )
    for axis in (turns_axis, pins_axis):
        axis.legend(fontsize="small")
        axis.set_ylim(bottom=0)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def node_loss_report(name: str, summary: dict[str, Any]) -> str:
    provenance, options = summary["provenance"], summary["options"]
    programs, requests, node = summary["programs"], summary["requests"], summary["node"]

    def seconds(value: float | None) -> str:
        return "never" if value is None else f"{value:g} s"

    lines = [
        f"# {name}",
        "",
        provenance_line(provenance),
        "",
        f"Profile `{options['profile']}` on `toolserve nodes up` (a head, two model nodes "
        f"with a main replica each, a tool node, Redis; each its own network namespace). "
        f"{options['programs']} many-agent programs at a time (2-5 turns, tools run by "
        f"the client) for {options['load_minutes']:g} minutes, then the running ones "
        f"finish. Every process of `{options['lost_node']}` killed at "
        f"{options['kill_at_s']:g} s, `toolserve nodes start` {options['down_s']:g} s later; "
        f"Redis cut off the bridge for {options['partition_s']:g} s at "
        f"{options['partition_at_s']:g} s. Pins: {options['pinning_mode']}, at most "
        f"{options['max_pin_ttl_s']:g} s.",
        "",
        "| Count | |",
        "|---|---|",
        f"| programs started | {programs['started']} |",
        f"| programs completed | {programs['completed']} |",
        f"| programs failed | {programs['failed']} |",
        f"| programs unfinished when the run ended | {programs['unfinished']} |",
        f"| programs served on both model nodes | {programs['on_both_model_nodes']} |",
        f"| turns sent | {requests['sent']} |",
        f"| turns failed | {requests['failed']} |",
        f"| turns the ingress sent again after losing their replica | "
        f"{requests['sent_again_after_replica_loss']:g} |",
        f"| turns completed / failed while Redis was cut off | "
        f"{requests['completed_during_partition']} / {requests['failed_during_partition']} |",
        "",
        f"The lost node ({node['address']}, replica {', '.join(node['replicas']) or 'unknown'}) "
        f"ran {node['turns_running_at_kill'] or 0:g} turns and "
        f"held {node['pins_at_kill']} pins when killed; they left the ledger "
        f"{seconds(node['pins_gone_after_s'])} after the kill (pins live at most "
        f"{options['max_pin_ttl_s']:g} s). `/health` said degraded "
        f"{seconds(node['health_degraded_after_s'])} after the kill, and ok with the node's "
        f"replica serving {seconds(node['serving_again_after_start_s'])} after "
        "`toolserve nodes start`.",
        "",
    ]
    if requests["errors"]:
        lines += [
            "Errors, by kind:",
            "",
            *(f"- {kind}: {count}" for kind, count in sorted(requests["errors"].items())),
            "",
        ]
    lines += [
        "![node loss](node-loss.png)",
        "",
        "Files: `summary.json`, this report, `node-loss.png`, `records.jsonl.gz` (every "
        "event, `/health` and ledger observation, program and turn).",
        "",
    ]
    return "\n".join(lines)
