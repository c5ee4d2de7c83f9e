"""The engine's pinning decisions appended to a file, one JSON record a line."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any


class DecisionLogFile:
    def __init__(self, directory: str, replica_id: str):
        path = Path(directory) / f"{re.sub(r'[^A-Za-z0-9_.-]', '_', replica_id)}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._file = path.open("a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(record) + "\n")

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
