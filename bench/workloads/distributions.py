"""Random distributions the workload generators draw from, described by the
mean and standard deviation the papers publish."""

from __future__ import annotations

import math
import random
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class Distribution(BaseModel):
    """A distribution given by its mean and standard deviation, clipped to [low, high]."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["constant", "normal", "lognormal", "exponential"] = Field(
        description="Shape. `lognormal` matches mean and sd exactly (heavy tail, never "
        "negative): the right shape for tool latencies. `exponential` ignores sd."
    )
    mean: float = Field(description="Mean before clipping.")
    sd: float = Field(default=0.0, ge=0, description="Standard deviation before clipping.")
    low: float | None = Field(default=None, description="Smallest value returned.")
    high: float | None = Field(default=None, description="Largest value returned.")

    @model_validator(mode="after")
    def _valid(self) -> Distribution:
        if self.kind in ("lognormal", "exponential") and self.mean <= 0:
            raise ValueError(f"a {self.kind} distribution needs a positive mean")
        if self.low is not None and self.high is not None and self.low > self.high:
            raise ValueError("low must not exceed high")
        return self

    def sample(self, rng: random.Random) -> float:
        if self.kind == "constant" or (self.sd == 0 and self.kind != "exponential"):
            value = self.mean
        elif self.kind == "normal":
            value = rng.gauss(self.mean, self.sd)
        elif self.kind == "exponential":
            value = rng.expovariate(1.0 / self.mean)
        else:
            sigma_squared = math.log1p((self.sd / self.mean) ** 2)
            value = rng.lognormvariate(
                math.log(self.mean) - sigma_squared / 2, math.sqrt(sigma_squared)
            )
        if self.low is not None:
            value = max(self.low, value)
        if self.high is not None:
            value = min(self.high, value)
        return value

    def sample_int(self, rng: random.Random) -> int:
        return round(self.sample(rng))


def poisson_arrivals(count: int, rate_per_s: float, rng: random.Random) -> list[float]:
    """Arrival times (seconds from the start) of a Poisson process; the first at 0."""
    if rate_per_s <= 0:
        return [0.0] * count
    times = [0.0]
    for _ in range(count - 1):
        times.append(times[-1] + rng.expovariate(rate_per_s))
    return times
