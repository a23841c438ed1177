"""Hypothesis example databases for long runs: a local directory (persisted between nights),
a shared Redis server (``redis://host:port/db``), and, read-only, the last nightly's database
published as a GitHub Actions artifact, multiplexed with the local one.

The database is a cache of interesting examples; the durable corpus is our JSON traces.
"""

from __future__ import annotations

from hypothesis.database import (DirectoryBasedExampleDatabase, ExampleDatabase,
                                 GitHubArtifactDatabase, MultiplexedDatabase, ReadOnlyDatabase)


class DatabaseError(ValueError):
    pass


def open_database(where: str | None, github_artifact: str | None = None) -> ExampleDatabase | None:
    """``where``: a directory path or ``redis://...``; ``github_artifact``:
    ``OWNER/REPO`` or ``OWNER/REPO:ARTIFACT`` (read-only, needs ``GITHUB_TOKEN`` to fetch)."""
    local = None
    if where:
        if where.startswith(("redis://", "rediss://", "unix://")):
            try:
                import redis
                from hypothesis.extra.redis import RedisExampleDatabase
            except ImportError:
                raise DatabaseError("a Redis database needs the 'redis' package "
                                    "(pip install 'kvcheck[nightly]')") from None
            client = redis.Redis.from_url(where)
            try:
                client.ping()
            except Exception as exc:
                raise DatabaseError(f"cannot reach Redis at {where}: {exc}") from None
            local = RedisExampleDatabase(client)
        elif "://" in where:
            raise DatabaseError(f"--database {where}: unsupported URL scheme "
                                f"{where.split('://')[0]!r}; use a directory or redis://host:port/db")
        else:
            from pathlib import Path

            probe = Path(where)
            while not probe.exists() and probe.parent != probe:
                probe = probe.parent
            if probe.exists() and not probe.is_dir():
                raise DatabaseError(f"--database {where}: "
                                    + ("exists and is not a directory" if probe == Path(where)
                                       else f"cannot be created ({probe} is not a directory)"))
            local = DirectoryBasedExampleDatabase(where)
    if not github_artifact:
        return local
    repo, _, artifact = github_artifact.partition(":")
    owner, sep, name = repo.partition("/")
    if not sep or not owner or not name:
        raise DatabaseError(f"--github-artifact expects OWNER/REPO[:ARTIFACT], got "
                            f"{github_artifact!r}")
    shared = ReadOnlyDatabase(GitHubArtifactDatabase(
        owner, name, artifact_name=artifact or "kvcheck-hypothesis-db"))
    return MultiplexedDatabase(local, shared) if local is not None else shared
