"""The soak run's judgement of its series and the programs it keeps running."""

from __future__ import annotations

import itertools
import os
import statistics

import pytest

from bench.soak import ResourceSampler, Sample, Tolerance, growth_of, growths, soak_programs
from bench.workloads.bfcl import BfclProgram
from bench.workloads.speculation import RecordsProgram
from bench.workloads.trace import TraceProgram


def _sample(
    elapsed_s: float, rss_mb: float, redis_keys: int = 100, lasting_keys: int = 12
) -> Sample:
    return Sample(
        elapsed_s=elapsed_s,
        rss_mb={"ingress": rss_mb / 2, "engine": rss_mb / 2},
        processes=20,
        fds=300,
        zombies=0,
        zygote_children=1,
        redis_keys={"toolserve:sessions": redis_keys},
        pinned_blocks=40,
        running=32,
        completed=int(elapsed_s),
        failed=0,
        redis_keys_without_expiry={"toolserve:ledger": lasting_keys},
    )


def test_a_series_that_wanders_around_its_level_is_flat() -> None:
    points = [(60.0 * minute, 1000 + (8 if minute % 2 else -8)) for minute in range(20)]
    growth = growth_of("rss_mb", points, Tolerance(0.05, 64))
    assert growth.flat
    assert abs(growth.growth) < 8


def test_a_steady_climb_is_growth_even_when_each_step_is_small() -> None:
    points = [(60.0 * minute, 1000 + 4.0 * minute) for minute in range(30)]
    growth = growth_of("rss_mb", points, Tolerance(0.05, 64))
    assert growth.slope_per_hour == pytest.approx(240)
    assert growth.growth == pytest.approx(4.0 * 29)
    assert not growth.flat


def test_only_samples_after_warm_up_and_before_the_load_drains_are_judged() -> None:
    climbing_then_level = [
        _sample(60.0 * minute, 500 + 100 * min(minute, 8)) for minute in range(30)
    ]
    judged = {growth.series: growth for growth in growths(climbing_then_level, 8 * 60, 30 * 60)}
    assert judged["rss_mb"].flat
    assert judged["rss_mb"].first == judged["rss_mb"].last == 1300
    from_the_start = {growth.series: growth for growth in growths(climbing_then_level, 0, 30 * 60)}
    assert not from_the_start["rss_mb"].flat
    draining = [*climbing_then_level, _sample(31 * 60, 100, lasting_keys=0)]
    judged_while_loaded = {growth.series: growth for growth in growths(draining, 8 * 60, 30 * 60)}
    assert judged_while_loaded["redis_keys_without_expiry"].flat
    assert judged_while_loaded["rss_mb"].flat


def test_keys_that_expire_follow_the_load_unjudged_and_lasting_keys_are_judged() -> None:
    busier = [_sample(60.0 * minute, 1000, redis_keys=100 + 10 * minute) for minute in range(30)]
    judged = {growth.series: growth for growth in growths(busier, 0, 30 * 60)}
    assert "redis_keys" not in judged and judged["redis_keys_without_expiry"].flat
    leaking = [_sample(60.0 * minute, 1000, lasting_keys=12 + 2 * minute) for minute in range(30)]
    judged = {growth.series: growth for growth in growths(leaking, 0, 30 * 60)}
    assert not judged["redis_keys_without_expiry"].flat


def test_a_judgement_needs_two_samples_after_warm_up() -> None:
    with pytest.raises(ValueError, match="two samples"):
        growth_of("fds", [(0.0, 1.0)], Tolerance(0, 1))


def test_the_program_stream_mixes_hosted_programs_in_their_share_with_ids_of_their_own() -> None:
    programs = list(itertools.islice(soak_programs(seed=3, programs=8, hosted_share=0.25), 24))
    assert sum(isinstance(program, RecordsProgram) for program in programs) == 3
    assert sum(isinstance(program, BfclProgram) for program in programs) == 3
    assert len({program.program_id for program in programs}) == 24
    assert all(program.arrival_s == 0 for program in programs)
    again = list(itertools.islice(soak_programs(seed=3, programs=8, hosted_share=0.25), 24))
    assert [program.program_id for program in again] == [program.program_id for program in programs]


def test_the_many_agent_programs_are_short_enough_to_turn_over() -> None:
    programs = itertools.islice(soak_programs(seed=5, programs=32, hosted_share=0.25), 480)
    turns = [program.turns for program in programs if isinstance(program, TraceProgram)]
    assert len(turns) == 360
    assert min(turns) >= 2 and max(turns) <= 5 and statistics.fmean(turns) <= 4


def test_the_sampler_tells_keys_without_expiry_from_those_that_expire(redis_url: str) -> None:
    import redis

    url = f"{redis_url.rpartition('/')[0]}/15"
    client = redis.Redis.from_url(url)
    client.flushdb()
    try:
        client.set("toolserve:sessions:a", "1", ex=300)
        client.set("toolserve:sessions:b", "1", ex=300)
        client.set("toolserve:ledger:pins", "1")
        sampler = ResourceSampler(os.getpid(), url, "http://127.0.0.1:9/metrics")
        try:
            kinds, without_expiry = sampler.redis_keys()
        finally:
            sampler.close()
        assert kinds == {"toolserve:sessions": 2, "toolserve:ledger": 1}
        assert without_expiry == {"toolserve:ledger": 1}
    finally:
        client.flushdb()
        client.close()
