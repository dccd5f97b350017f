"""What the plugin scenarios get from the ``slurm`` fixture (kept out of
conftest.py so test modules can import the type)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .cluster import Cluster


@dataclass
class SlurmEnv:
    """What the scenarios use: the cluster, the installed plugin, configs, files."""

    cluster: Cluster
    prefix: Path
    files: Path
    audit_log: Path
    configs: dict[str, Path] = field(default_factory=dict)

    @property
    def plugin(self) -> Path:
        return self.prefix / "lib" / "slurm" / "spank_grace_policy.so"

    def use(self, config: str | Path | None = "base", *extra: str) -> None:
        """Point plugstack.conf at the plugin with ``config`` (a name from
        ``configs`` or a path) and extra ``key=value`` arguments."""
        args = []
        if config is not None:
            path = self.configs.get(str(config), config)
            args.append(f"config={path}")
        self.cluster.set_plugstack([f"required {self.plugin} {' '.join([*args, *extra])}"])

    def audit_lines(self) -> list[str]:
        return self.audit_log.read_text().splitlines()

    def side_file(self, name: str) -> Path:
        """A path in the shared dir no earlier step has touched."""
        path = self.cluster.shared / name
        if path.exists():
            path.unlink()
        return path
