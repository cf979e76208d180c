"""machinery/cache.py: folders built once per machine and found again by content (the offline models, the cold
start, the step-0 evaluation's records): where they live, a folder's identity by content, and the lock that makes
processes starting at once (torchrun's ranks, two runs) build one folder once. What goes into a key is the caller's.
"""
from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path


def cache_dir() -> Path:
    """Where built models live: $CLEANER_CACHE, else ~/.cache/cleaner."""
    return Path(os.environ.get("CLEANER_CACHE", Path.home() / ".cache" / "cleaner"))


def hash_files(h, folder: Path, skip: tuple[str, ...] = ()) -> None:
    """Feed the files of a model folder (sorted; not those named in skip, nor subfolders), each name and its
    sha256, to the hashlib object h: the folder's identity by content (evalcache's and sft's cache keys)."""
    import hashlib
    for f in sorted(Path(folder).iterdir()):
        if f.is_file() and f.name not in skip:
            h.update(f.name.encode())
            with open(f, "rb") as fh:
                h.update(hashlib.file_digest(fh, "sha256").digest())


def built_once(final: Path, build, complete) -> Path:
    """final, a cache folder that build(tmp) writes, built once per machine: the build holds an exclusive lock
    (flock on a file beside final, released by the kernel when its holder dies), so processes that start at once
    (torchrun's ranks, two runs) wait for the first builder and then reuse its folder. The build writes a temp
    folder renamed into place, and a folder that complete() rejects (a killed build's, an older version's) is
    rebuilt, never trusted."""
    import fcntl
    if complete(final):
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if complete(final):  # another process built it while this one waited
            return final
        if final.exists():
            print(f"[cache] {final} is incomplete or stale; rebuilding", file=sys.stderr)
            shutil.rmtree(final)
        for dead in final.parent.glob(f".{final.name}.tmp-*"):  # left by killed builds: the lock is ours
            shutil.rmtree(dead, ignore_errors=True)
        tmp = final.parent / f".{final.name}.tmp-{os.getpid()}"
        build(tmp)
        os.replace(tmp, final)
    if not complete(final):
        raise RuntimeError(f"built {final}, but it is not complete; see the messages above")
    return final
