"""The `checkpoints:` settings as agentbox uses them: their own module, so that taking a checkpoint (a launch from
its verified plan, agentbox.session.planned) needs nothing of the config's loading."""

from __future__ import annotations

from typing import Any, NamedTuple


class CheckpointSettings(NamedTuple):
    enabled: bool = True
    max_file_size: int = 5 << 20  # bytes
    keep: int = 50
    max_file_size_text: str = "5MiB"  # as the config wrote it

    def to_json(self) -> dict[str, Any]:
        return {"enabled": self.enabled, "maxFileSize": self.max_file_size_text, "keep": self.keep}
