"""Reading the cluster's Prometheus text in end-to-end tests."""

from __future__ import annotations


def metric_total(text: str, sample_name: str, **labels: str) -> float:
    """A sample summed over the label sets that contain `labels` (names may carry
    Ray's `ray_` prefix)."""
    from prometheus_client.parser import text_string_to_metric_families

    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.removeprefix("ray_") == sample_name
        and all(sample.labels.get(key) == value for key, value in labels.items())
    )


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts by upper bound, summed over series."""
    from prometheus_client.parser import text_string_to_metric_families

    counts: dict[float, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.removeprefix("ray_") == f"{name}_bucket":
                bound = float(sample.labels["le"])
                counts[bound] = counts.get(bound, 0.0) + sample.value
    return counts
