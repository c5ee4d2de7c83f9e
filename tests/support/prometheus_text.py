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
