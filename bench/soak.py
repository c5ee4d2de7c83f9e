"""A soak run: toolserve under steady agent load for a stretch of time, its
resources sampled each minute, to show that nothing grows once it is warm.

The load keeps `programs` agent programs running at a time: many-agent programs
(tools run by the client), and records tasks and BFCL programs whose tools the
cluster hosts (sandboxed calls, speculation, tool state), each replaced by a new
one as it ends; every other program ends its session, the rest are left to
expire. Sampled: resident memory and descriptors of every process of the
cluster's tree, the tool sandboxes' zygote children, Redis's keys by kind, the
KV blocks pins hold."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from bench.cpu import identify_process
from bench.driver import Driver
from bench.metrics import gauge_totals
from bench.provenance import (
    Provenance,
    note_code_state,
    provenance_line,
    start_provenance,
    utc_now,
)
from bench.records import ProgramLoad, append_records, start_records
from bench.runner import READY_TIMEOUT_S, Log, raw_profile_config
from bench.systems import (
    cleared_toolserve_state,
    engine_settings,
    scrape_metrics,
    system_catalog,
    with_overrides,
)
from bench.workloads.bfcl import BfclConfig, generate_bfcl
from bench.workloads.program import AgentProgram
from bench.workloads.speculation import (
    RecordsTaskConfig,
    generate_speculation,
    hosted_records_tools,
)
from bench.workloads.trace import SHORT_PROGRAM_PROFILES, TraceConfig, generate_trace
from cluster.config import REPO_ROOT, ToolserveConfig

SOAK_SYSTEM = "toolserve"
ZYGOTE_MODULE = "toolworkers.sandbox_zygote"
# BFCL programs' contexts pass 4,096 tokens (vLLM then refuses the turn with a
# 400): the soak gives the model the embedded profile's context and room for it.
KV_CACHE_MIB = 512
MAX_MODEL_LEN = 8192
RECORDS_TASKS = RecordsTaskConfig(latencies_s=(0.1, 1.0, 3.0))
KEPT_STATE_TTL_S = 300
# Everything toolserve keeps for a program or a reply expires within the run's
# warm-up (defaults are an hour), so a steady state is reached while it is watched.
SHORT_LIVED_STATE = {
    "server.session_ttl_s": KEPT_STATE_TTL_S,
    "server.program_idle_s": KEPT_STATE_TTL_S,
    "server.response_cache.ttl_s": KEPT_STATE_TTL_S,
    "tools.state_ttl_s": KEPT_STATE_TTL_S,
    "tools.cache.response_owner_ttl_s": KEPT_STATE_TTL_S,
}


@dataclass(frozen=True)
class SoakOptions:
    minutes: float
    programs: int
    """Programs running at any time."""
    hosted_share: float
    """Share of the programs whose tools the cluster runs (records tasks and BFCL)."""
    warm_up_minutes: float
    sample_interval_s: float
    seed: int
    config_path: Path | None
    output_dir: Path
    run_name: str
    argv: Sequence[str]
    allow_dirty: bool = False


@dataclass(frozen=True)
class Tolerance:
    """How much a series may move over the watched span and still count as flat:
    the larger of a share of its mean and an absolute amount."""

    share: float
    amount: float

    def of(self, mean: float) -> float:
        return max(self.share * abs(mean), self.amount)


TOLERANCES = {
    "rss_mb": Tolerance(0.05, 64),
    "fds": Tolerance(0.05, 16),
    "processes": Tolerance(0.05, 2),
    "zygote_children": Tolerance(0.0, 4),
    "zombies": Tolerance(0.0, 2),
    # Keys that expire are counted, not judged: each lives at most
    # `KEPT_STATE_TTL_S`, so their number follows how fast programs finish (one
    # recorded run: correlation 0.83), not how long the cluster has run.
    "redis_keys_without_expiry": Tolerance(0.10, 16),
    "pinned_blocks": Tolerance(0.10, 16),
}


@dataclass(frozen=True)
class Growth:
    """A series over the watched span: least-squares slope, the growth that slope
    makes over the span, and whether it stays within its tolerance."""

    series: str
    first: float
    last: float
    mean: float
    slope_per_hour: float
    growth: float
    tolerance: float

    @property
    def flat(self) -> bool:
        return self.growth <= self.tolerance

    def as_json(self) -> dict[str, Any]:
        return asdict(self) | {"flat": self.flat}


def growth_of(series: str, points: Sequence[tuple[float, float]], tolerance: Tolerance) -> Growth:
    """`points`: (seconds, value) after warm-up, at least two."""
    if len(points) < 2:
        raise ValueError(f"{series}: at least two samples after warm-up are needed")
    times = [at for at, _ in points]
    values = [value for _, value in points]
    slope = statistics.linear_regression(times, values).slope
    span = times[-1] - times[0]
    mean = statistics.fmean(values)
    return Growth(
        series=series,
        first=values[0],
        last=values[-1],
        mean=mean,
        slope_per_hour=slope * 3600,
        growth=slope * span,
        tolerance=tolerance.of(mean),
    )


@dataclass(frozen=True)
class Sample:
    elapsed_s: float
    rss_mb: dict[str, float]
    """Resident memory by process name (vLLM and Ray title theirs), summed."""
    processes: int
    fds: int
    zombies: int
    zygote_children: int
    redis_keys: dict[str, int]
    """Keys by their first two segments (`toolserve:sessions`, ...)."""
    pinned_blocks: float
    running: int
    completed: int
    failed: int
    redis_keys_without_expiry: dict[str, int] = field(default_factory=dict)
    """Of `redis_keys`, those with no expiry set: what a leak would grow."""

    def totals(self) -> dict[str, float]:
        return {
            "rss_mb": sum(self.rss_mb.values()),
            "processes": self.processes,
            "fds": self.fds,
            "zombies": self.zombies,
            "zygote_children": self.zygote_children,
            "redis_keys": sum(self.redis_keys.values()),
            "redis_keys_without_expiry": sum(self.redis_keys_without_expiry.values()),
            "pinned_blocks": self.pinned_blocks,
        }

    def as_json(self) -> dict[str, Any]:
        return {"kind": "sample", **asdict(self)}


def _key_kind(key: bytes) -> str:
    return ":".join(key.decode(errors="replace").split(":")[:2])


class ResourceSampler:
    """Reads the cluster's process tree, its Redis and its metrics."""

    def __init__(self, root_pid: int, redis_url: str, metrics_url: str):
        import redis

        self._root_pid = root_pid
        self._redis = redis.Redis.from_url(redis_url)
        self._metrics_url = metrics_url

    def close(self) -> None:
        self._redis.close()

    def _processes(self) -> tuple[dict[str, float], int, int, int, int]:
        root = psutil.Process(self._root_pid)
        rss: dict[str, float] = defaultdict(float)
        processes = fds = zombies = zygote_children = 0
        for process in [root, *root.children(recursive=True)]:
            try:
                if process.status() == psutil.STATUS_ZOMBIE:
                    zombies += 1
                    continue
                name, _ = identify_process(process)
                rss[name] += process.memory_info().rss / 2**20
                fds += process.num_fds()
                processes += 1
                if ZYGOTE_MODULE in process.cmdline():
                    zygote_children += len(process.children(recursive=True))
            except psutil.Error:
                continue
        return dict(rss), processes, fds, zombies, zygote_children

    def redis_keys(self) -> tuple[Counter[str], Counter[str]]:
        """Keys by kind: all of them, and those with no expiry."""
        keys = list(self._redis.scan_iter(count=1000))
        pipeline = self._redis.pipeline(transaction=False)
        for key in keys:
            pipeline.ttl(key)
        no_expiry = -1  # TTL's answer for a key without one (-2: gone since the scan)
        ttls = pipeline.execute()
        kinds = Counter(_key_kind(key) for key in keys)
        without_expiry = Counter(
            _key_kind(key) for key, ttl in zip(keys, ttls, strict=True) if ttl == no_expiry
        )
        return kinds, without_expiry

    def sample(self, elapsed_s: float, running: int, completed: int, failed: int) -> Sample:
        rss, processes, fds, zombies, zygote_children = self._processes()
        kinds, without_expiry = self.redis_keys()
        metrics = gauge_totals(scrape_metrics(self._metrics_url))
        return Sample(
            elapsed_s=round(elapsed_s, 1),
            rss_mb={name: round(mb, 1) for name, mb in sorted(rss.items())},
            processes=processes,
            fds=fds,
            zombies=zombies,
            zygote_children=zygote_children,
            redis_keys=dict(sorted(kinds.items())),
            redis_keys_without_expiry=dict(sorted(without_expiry.items())),
            pinned_blocks=metrics.get("toolserve_kv_pinned_blocks", 0.0),
            running=running,
            completed=completed,
            failed=failed,
        )


def soak_programs(seed: int, programs: int, hosted_share: float) -> Iterator[AgentProgram]:
    """An endless, seeded stream of programs, interleaved: many-agent programs
    (tools run by the client) and, in `hosted_share`, programs whose tools the
    cluster runs: records tasks (a call in every task, speculated and cached)
    and BFCL programs (stateful tools, called when the model chooses to). Each
    program has an id of its own."""
    hosted = round(programs * hosted_share)
    serial = itertools.count()
    for batch in itertools.count():
        kinds: list[Sequence[AgentProgram]] = [
            # 2-5 turns, not 11 and 6: full-length programs would last about the
            # whole run, their contexts growing throughout, and a new program would
            # wait behind older ones' turns (program FCFS) for their whole lives.
            generate_trace(
                TraceConfig(
                    programs=programs - hosted,
                    arrival_rate_per_s=0,
                    profiles=SHORT_PROGRAM_PROFILES,
                ),
                seed + batch,
            ),
            generate_speculation(
                RECORDS_TASKS.model_copy(update={"programs_per_latency": max(1, hosted)}),
                seed + batch,
            )[: hosted - hosted // 2],
            generate_bfcl(BfclConfig(entries=hosted // 2, arrival_rate_per_s=0), seed + batch)
            if hosted // 2
            else [],
        ]
        for program in itertools.chain(*itertools.zip_longest(*kinds)):
            if program is None:
                continue
            program.program_id = f"soak-{next(serial):05d}-{program.program_id}"
            program.arrival_s = 0.0
            yield program


async def _keep_programs_running(
    base_url: str, model: str, options: SoakOptions, load: ProgramLoad, deadline: float
) -> None:
    driver = Driver(base_url, model, SOAK_SYSTEM, 0, hosts_tools=True)
    stream = soak_programs(options.seed, options.programs, options.hosted_share)
    started_programs = itertools.count()

    async def slot() -> None:
        while True:
            program = next(stream)
            ends_session = next(started_programs) % 2 == 0
            load.started += 1
            load.running += 1
            try:
                record = await driver.run_program(program, time.monotonic(), load.requests)
                if ends_session:
                    await driver.end_session(program)
            finally:
                load.running -= 1
            load.finished(record)

    try:
        await driver.warm_up()
        slots = [asyncio.create_task(slot()) for _ in range(options.programs)]
        ended, running = await asyncio.wait(slots, timeout=max(0.0, deadline - time.monotonic()))
        load.stopped = load.running
        for task in running:
            task.cancel()
        await asyncio.gather(*running, return_exceptions=True)
        for task in ended:
            task.result()  # a slot ends early only on an error of the harness's own
    finally:
        await driver.close()


def run_soak(options: SoakOptions, log: Log = print) -> Path:
    if not 0 <= options.hosted_share <= 1:
        raise ValueError("--hosted-share must be between 0 and 1")
    if options.warm_up_minutes >= options.minutes:
        raise ValueError("--warm-up-minutes must be shorter than --minutes")
    provenance = start_provenance(
        ["toolserve", *options.argv], REPO_ROOT, options.output_dir, options.allow_dirty
    )
    run_dir = options.output_dir / options.run_name
    (run_dir / "logs").mkdir(parents=True, exist_ok=True)
    spec = system_catalog()[SOAK_SYSTEM]
    raw_config = spec.configured(raw_profile_config(options.config_path))
    raw_config = with_overrides(
        raw_config,
        SHORT_LIVED_STATE
        | {
            "tools.hosted": [
                *raw_config["tools"]["hosted"],
                *hosted_records_tools(RECORDS_TASKS.latencies_s),
            ]
        },
    )
    settings = engine_settings(
        ToolserveConfig.model_validate(raw_config), KV_CACHE_MIB * 2**20, MAX_MODEL_LEN
    )
    launch = spec.plan(settings, raw_config, run_dir, "soak")
    assert launch.toolserve_config is not None
    redis_url = launch.toolserve_config["redis"]["url"]
    log(f"soak: cleared {cleared_toolserve_state(redis_url)} toolserve keys from Redis")
    process = launch.process()
    samples: list[Sample] = []
    load = ProgramLoad()
    log(f"soak: starting toolserve at {provenance.commit}; log {launch.log_path}")
    process.start()
    try:
        process.wait_ready(launch.endpoint.base_url, settings.served_model_name, READY_TIMEOUT_S)
        sampler = ResourceSampler(process.pid, redis_url, launch.endpoint.metrics_url)
        stop_sampling = threading.Event()
        started = time.monotonic()

        def take_sample() -> Sample:
            sample = sampler.sample(
                time.monotonic() - started, load.running, load.completed, load.failed
            )
            samples.append(sample)
            return sample

        def sample_each_interval() -> None:
            while True:
                sample = take_sample()
                totals = sample.totals()
                log(
                    f"soak: {sample.elapsed_s / 60:5.1f} min  RSS {totals['rss_mb']:7.0f} MB  "
                    f"fds {sample.fds}  processes {sample.processes}  zygote children "
                    f"{sample.zygote_children}  Redis keys {totals['redis_keys']:.0f}  pinned "
                    f"blocks {sample.pinned_blocks:.0f}  programs {sample.completed} done, "
                    f"{sample.failed} failed, {sample.running} running"
                )
                if stop_sampling.wait(options.sample_interval_s):
                    return

        thread = threading.Thread(target=sample_each_interval, name="soak-sampler", daemon=True)
        thread.start()
        try:
            asyncio.run(
                _keep_programs_running(
                    launch.endpoint.base_url,
                    settings.served_model_name,
                    options,
                    load,
                    started + options.minutes * 60,
                )
            )
        finally:
            stop_sampling.set()
            thread.join()
            take_sample()
            sampler.close()
    finally:
        process.stop()
    provenance.finished_utc = utc_now()
    note_code_state(provenance, REPO_ROOT, options.output_dir)
    return write_soak_run(run_dir, options, provenance, samples, load)


def watched(samples: Sequence[Sample], warm_up_s: float, load_s: float) -> list[Sample]:
    """The samples judged: after warm-up, while the load ran."""
    return [sample for sample in samples if warm_up_s <= sample.elapsed_s <= load_s]


def growths(samples: Sequence[Sample], warm_up_s: float, load_s: float) -> list[Growth]:
    after = watched(samples, warm_up_s, load_s)
    return [
        growth_of(
            series,
            [(sample.elapsed_s, sample.totals()[series]) for sample in after],
            tolerance,
        )
        for series, tolerance in TOLERANCES.items()
    ]


def write_soak_run(
    run_dir: Path,
    options: SoakOptions,
    provenance: Provenance,
    samples: Sequence[Sample],
    load: ProgramLoad,
) -> Path:
    programs, requests = load.programs, load.requests
    warm_up_s, load_s = options.warm_up_minutes * 60, options.minutes * 60
    found = growths(samples, warm_up_s, load_s)
    records = start_records(run_dir)
    append_records(records, [*samples, *programs, *requests])
    summary = {
        "kind": "soak",
        "provenance": provenance.as_json(),
        "options": {
            "minutes": options.minutes,
            "programs": options.programs,
            "hosted_share": options.hosted_share,
            "warm_up_minutes": options.warm_up_minutes,
            "sample_interval_s": options.sample_interval_s,
            "seed": options.seed,
            "kv_cache_mib": KV_CACHE_MIB,
            "max_model_len": MAX_MODEL_LEN,
            "short_lived_state": SHORT_LIVED_STATE,
        },
        "programs": {
            "completed": sum(program.error is None for program in programs),
            "failed": sum(program.error is not None for program in programs),
            "stopped_at_the_end": load.stopped,
            "errors": sorted({program.error for program in programs if program.error}),
            "requests": len(requests),
        },
        "growth": [growth.as_json() for growth in found],
        "flat": all(growth.flat for growth in found),
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    _plot(run_dir / "soak.png", samples, warm_up_s, load_s)
    (run_dir / "report.md").write_text(soak_report(run_dir.name, summary, samples))
    return run_dir


def _plot(path: Path, samples: Sequence[Sample], warm_up_s: float, load_s: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    minutes = [sample.elapsed_s / 60 for sample in samples]
    last = samples[-1].rss_mb
    biggest = sorted(last, key=lambda name: -last[name])[:6]
    figure, axes = plt.subplots(2, 3, figsize=(15, 8))
    panels: list[tuple[Any, str, dict[str, list[float]]]] = [
        (
            axes[0][0],
            "resident memory, MB",
            {"all processes": [sample.totals()["rss_mb"] for sample in samples]},
        ),
        (
            axes[0][1],
            "resident memory by process, MB",
            {name: [sample.rss_mb.get(name, 0.0) for sample in samples] for name in biggest},
        ),
        (
            axes[0][2],
            "descriptors and processes",
            {
                "open file descriptors": [float(sample.fds) for sample in samples],
                "processes": [float(sample.processes) for sample in samples],
            },
        ),
        (
            axes[1][0],
            "tool sandboxes",
            {
                "zygote children": [float(sample.zygote_children) for sample in samples],
                "zombies": [float(sample.zombies) for sample in samples],
            },
        ),
        (
            axes[1][1],
            "Redis keys and pinned KV blocks",
            {
                "Redis keys": [sample.totals()["redis_keys"] for sample in samples],
                "Redis keys without expiry": [
                    sample.totals()["redis_keys_without_expiry"] for sample in samples
                ],
                "pinned KV blocks": [sample.pinned_blocks for sample in samples],
            },
        ),
        (
            axes[1][2],
            "programs",
            {
                "completed": [float(sample.completed) for sample in samples],
                "running": [float(sample.running) for sample in samples],
                "failed": [float(sample.failed) for sample in samples],
            },
        ),
    ]
    for axis, title, lines in panels:
        for label, values in lines.items():
            axis.plot(minutes, values, label=label)
        axis.axvline(warm_up_s / 60, color="grey", linestyle=":", label="end of warm-up")
        axis.axvline(load_s / 60, color="grey", linestyle="--", label="end of the load")
        axis.set_title(title)
        axis.set_xlabel("minutes")
        axis.set_ylim(bottom=0)
        axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def soak_report(name: str, summary: dict[str, Any], samples: Sequence[Sample]) -> str:
    provenance, options, programs = summary["provenance"], summary["options"], summary["programs"]
    lines = [
        f"# {name}",
        "",
        provenance_line(provenance),
        "",
        f"{options['programs']} programs at a time for {options['minutes']:g} minutes "
        f"({options['hosted_share']:.0%} programs whose tools the cluster runs, records "
        "tasks and BFCL programs in halves, the rest many-agent programs whose tools the "
        "client runs; every other program ends "
        f"its session), KV {options['kv_cache_mib']} MiB. Everything kept for a program or "
        f"reply expires after {KEPT_STATE_TTL_S} s (sessions, tool state, replies, "
        "response owners, program clocks). Sampled every "
        f"{options['sample_interval_s']:g} s; the series are judged from the end of "
        f"{options['warm_up_minutes']:g} minutes of warm-up to the end of the load.",
        "",
        f"Programs: {programs['completed']} completed, {programs['failed']} failed, "
        f"{programs['stopped_at_the_end']} still running when the load ended (their "
        f"requests cancelled); {programs['requests']} requests.",
        "",
        "| Series | After warm-up | At the end | Mean | Slope /hour | Growth over the span "
        "| Allowed | Flat |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for growth in summary["growth"]:
        lines.append(
            f"| {growth['series']} | {growth['first']:.0f} | {growth['last']:.0f} | "
            f"{growth['mean']:.0f} | {growth['slope_per_hour']:+.1f} | "
            f"{growth['growth']:+.1f} | {growth['tolerance']:.0f} | "
            f"{'yes' if growth['flat'] else '**no**'} |"
        )
    lines += [
        "",
        f"All flat: {'yes' if summary['flat'] else '**no**'}. Redis keys that expire are "
        "counted (the plot) and not judged: each lives at most "
        f"{KEPT_STATE_TTL_S} s, so their number follows how fast programs finish; a leak "
        "would grow the keys without expiry.",
        "",
    ]
    if programs["errors"]:
        lines += ["Errors:", "", *(f"- `{error}`" for error in programs["errors"]), ""]
    lines += _rss_table(samples, options["warm_up_minutes"] * 60, options["minutes"] * 60)
    lines += [
        "",
        "![soak](soak.png)",
        "",
        "Files: `summary.json`, this report, `soak.png`, `records.jsonl.gz` (every sample, "
        "program and request).",
        "",
    ]
    return "\n".join(lines)


def _rss_table(samples: Sequence[Sample], warm_up_s: float, load_s: float) -> list[str]:
    after = watched(samples, warm_up_s, load_s)
    first, last = after[0].rss_mb, after[-1].rss_mb
    names = sorted(set(first) | set(last), key=lambda name: -last.get(name, 0.0))
    return [
        "| Process | Resident MB after warm-up | At the end |",
        "|---|---|---|",
        *(
            f"| `{name}` | {first.get(name, 0.0):.0f} | {last.get(name, 0.0):.0f} |"
            for name in names
        ),
    ]
