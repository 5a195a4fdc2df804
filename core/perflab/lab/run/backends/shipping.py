"""A run's files, written on a node that cannot see the study directory, shipped to the driver
(issue #14: Ray without a shared filesystem).

A remote agent never writes into the study directory: it runs the executor into a
:class:`Stage` — a private (0700) directory under the node's temp dir, named by study and run
— and ships what the run wrote there back to the driver as :class:`~perflab.lab.run.backends.local.Files`
events, whenever the run reaches a point worth keeping (the engine is ready, each profile is
measured, the run ends), so a node lost mid-run loses only what it wrote since. The driver,
the only writer of the study, puts them in the run directory (:func:`receive`). The stage is
removed when the run is over, also when it failed or was cancelled.

What is shipped, and how
------------------------
* Only what changed since the last shipment (size and modification time), in parts of at most
  :data:`CHUNK` bytes (Ray keeps every event in its object store: no event is large).
* perflab's own records (``*.json``: config, hardware, launch, bench, observe, earlystop,
  outcome) are shipped whole and replaced atomically on the driver (``write_json``'s
  temp-file-and-rename); a path inside the stage in them becomes the driver's run directory
  (``outcome.json``'s ``log`` and ``workdir``), so the records name the files where they are.
* Anything else (engine logs) only grows: the new bytes are shipped as appends at their
  offset, as the engine writes its log locally. A file larger than :data:`SHIP_CAP` is shipped
  as its first and last ``SHIP_CAP / 2`` bytes with one marker line between saying how many
  bytes were left out (a log's start says how the engine came up, its end why it stopped).
  Real logs are far smaller: vLLM 0.32.0's (CPU) startup-to-shutdown log is about 20 KB
  (``tests/fixtures/real/vllm-0.32.0-cpu/serve-default.log``); its periodic stats lines add
  about 100 KB an hour.
* The driver refuses a path that is absolute, has a ``..`` part, or resolves (through a link)
  outside the run directory (:class:`UnsafePath`).
"""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from perflab.contract.errors import PerflabError
from perflab.lab.run.backends.local import FilePart, Files

CHUNK = 1 << 20  # bytes in one shipped part at most
SHIP_CAP = 64 << 20  # a file larger than this is shipped as its head and tail, with a marker


class UnsafePath(PerflabError):
    """A shipped file's path would land outside the run directory."""


# --------------------------------------------------------------------------- the node's side


def stage_root() -> Path:
    """The node's staging directories: ``<temp dir>/perflab-stage-<user>`` (private: 0700)."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    root = Path(tempfile.gettempdir()).resolve() / f"perflab-stage-{user}"
    root.mkdir(mode=0o700, exist_ok=True)
    if root.is_symlink() or root.stat().st_uid != os.getuid():
        raise PerflabError(f"{root} is not this user's own directory: refusing to stage run files there")
    os.chmod(root, 0o700)
    return root


def study_tag(study_dir: Path) -> str:
    """A study's name among the node's staging directories: its directory's name and a digest
    of the driver's path (two studies named alike never share a stage)."""
    digest = hashlib.sha256(str(study_dir).encode()).hexdigest()[:12]
    return f"{study_dir.name[:40]}-{digest}"


def study_stage(study_dir: Path, root: Path | None = None) -> Path:
    """The node's directory of a study: its runs' stages, the simulator's per-node state."""
    base = (root or stage_root()) / study_tag(study_dir)
    base.mkdir(mode=0o700, parents=True, exist_ok=True)
    return base


def forget_study(study_dir: Path) -> None:
    """Remove the node's directory of a study (the driver, when the study ends)."""
    shutil.rmtree(stage_root() / study_tag(study_dir), ignore_errors=True)


@dataclass
class _Sent:
    size: int = 0  # bytes of the node's file shipped (its head, when capped)
    mtime_ns: int = -1
    capped: bool = False  # the head of a file over SHIP_CAP went; the rest waits for the end


class Stage:
    """One run's staging directory on a node, and what of it was shipped to the driver.

    ``run_dir``: the run directory on the driver (``<study>/runs/<NNN-label>``); the stage is
    ``<stage_root>/<study tag>/<NNN-label><suffix>``, created empty (0700); ``suffix`` tells
    apart the stages of one run on one host (a group's ranks: ``.node1@<node id>``)."""

    def __init__(self, run_dir: Path, *, root: Path | None = None, node: str = "", suffix: str = "") -> None:
        self.run_dir = run_dir
        self.node = node
        base = study_stage(run_dir.parent.parent, root)
        self.path = base / f"{run_dir.name}{suffix}"
        if self.path.exists():  # a stale stage of the same run (an agent killed before it removed it)
            shutil.rmtree(self.path)
        self.path.mkdir(mode=0o700)
        self._sent: dict[str, _Sent] = {}

    def driver(self, path: str | Path) -> str:
        """A path inside the stage as the driver's run directory has it."""
        p = Path(path)
        try:
            return str(self.run_dir / p.relative_to(self.path))
        except ValueError:
            return str(path)

    def _files(self) -> Iterator[tuple[str, Path]]:
        for dirpath, dirnames, filenames in os.walk(self.path):
            dirnames.sort()
            for name in sorted(filenames):
                if name.startswith(".") and name.endswith(".tmp"):  # write_json's file being written
                    continue
                p = Path(dirpath) / name
                if p.is_symlink() or not p.is_file():
                    continue
                yield p.relative_to(self.path).as_posix(), p

    def ship(self, *, final: bool = False) -> Iterator[Files]:
        """What changed since the last call, as Files events of at most :data:`CHUNK` bytes
        each; ``final``: the run is over (a capped file's tail goes now)."""
        parts: list[FilePart] = []
        size = 0
        for rel, p in self._files():
            for part in self._parts(rel, p, final):
                if parts and size + len(part.data) > CHUNK:
                    yield Files(tuple(parts), self.node)
                    parts, size = [], 0
                parts.append(part)
                size += len(part.data)
        if parts:
            yield Files(tuple(parts), self.node)

    def _parts(self, rel: str, p: Path, final: bool) -> Iterator[FilePart]:
        try:
            st = p.stat()
        except OSError:  # removed meanwhile
            return
        sent = self._sent.setdefault(rel, _Sent())
        if st.st_mtime_ns == sent.mtime_ns and st.st_size == sent.size and not (final and sent.capped):
            return
        if rel.endswith(".json"):  # perflab's record: whole (rewritten, never appended), paths as the driver's
            try:
                data = self._record(p.read_bytes())
            except OSError:
                return
            sent.size, sent.mtime_ns = st.st_size, st.st_mtime_ns
            for at in range(0, max(1, len(data)), CHUNK):
                yield FilePart(rel, data[at:at + CHUNK], offset=at, whole=True, last=at + CHUNK >= len(data))
            return
        if st.st_size < sent.size:  # rewritten shorter: from the start again
            sent.size, sent.capped = 0, False
        with p.open("rb") as f:
            if st.st_size <= SHIP_CAP and not sent.capped:
                yield from _read(f, rel, sent.size, st.st_size, sent.size)
                sent.size, sent.mtime_ns = st.st_size, st.st_mtime_ns
                return
            half = SHIP_CAP // 2
            if sent.size < half:  # the head, now
                yield from _read(f, rel, sent.size, half, sent.size)
                sent.size = half
            sent.capped, sent.mtime_ns = True, st.st_mtime_ns
            if not final:
                return
            head, start = sent.size, max(sent.size, st.st_size - half)
            if start > head:  # the tail, after a marker saying what is left out
                marker = (f"\n[perflab: {start - head} bytes of {rel} (of {st.st_size}) were not shipped from node "
                          f"{self.node or '?'}: its first {head} and last {st.st_size - start} bytes are kept]\n").encode()
                yield FilePart(rel, marker, offset=head)
                head += len(marker)
            yield from _read(f, rel, start, st.st_size, head)
            sent.capped, sent.size = False, st.st_size

    def _record(self, data: bytes) -> bytes:
        """A JSON record with paths inside the stage as the driver's (unchanged if not JSON)."""
        try:
            value = json.loads(data)
        except ValueError:
            return data
        here = str(self.path)

        def walk(v: Any) -> Any:
            if isinstance(v, str):
                return str(self.run_dir) + v[len(here):] if v == here or v.startswith(here + "/") else v
            if isinstance(v, list):
                return [walk(x) for x in v]
            if isinstance(v, dict):
                return {k: walk(x) for k, x in v.items()}
            return v

        out = walk(value)
        return data if out == value else (json.dumps(out, indent=2) + "\n").encode("utf-8")

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        try:
            self.path.parent.rmdir()  # the study's last run on this node
        except OSError:
            pass


def _read(f: Any, rel: str, start: int, end: int, at: int) -> Iterator[FilePart]:
    """Bytes ``start``..``end`` of ``f`` as parts written at ``at`` onwards."""
    f.seek(start)
    while start < end:
        data = f.read(min(CHUNK, end - start))
        if not data:
            return
        yield FilePart(rel, data, offset=at)
        start += len(data)
        at += len(data)


# --------------------------------------------------------------------------- the driver's side


def target(run_dir: Path, rel: str) -> Path:
    """Where a shipped file goes: inside ``run_dir``, or :class:`UnsafePath`."""
    p = PurePosixPath(rel)
    if not rel or p.is_absolute() or "\\" in rel or any(x in ("..", "") for x in rel.split("/")) or "\0" in rel:
        raise UnsafePath(f"refused a shipped file {rel!r}: not a plain path inside the run directory")
    out = run_dir.joinpath(*p.parts)
    if not out.parent.resolve().is_relative_to(run_dir.resolve()):
        raise UnsafePath(f"refused a shipped file {rel!r}: it resolves outside the run directory")
    if out.is_symlink():  # never written through (the run directory's files are plain files)
        raise UnsafePath(f"refused a shipped file {rel!r}: it is a link in the run directory")
    return out


def receive(run_dir: Path, files: Files) -> list[str]:
    """Write ``files`` into ``run_dir`` (the driver): a whole record atomically, a log's part at
    its offset; a path that would land outside ``run_dir`` is not written. The refused paths,
    with why."""
    refused: list[str] = []
    for part in files.parts:
        try:
            out = target(run_dir, part.path)
        except UnsafePath as exc:
            refused.append(str(exc))
            continue
        out.parent.mkdir(parents=True, exist_ok=True)
        if part.whole:  # a record: into a temp file beside it, renamed into place with its last part
            _whole(out, part)
            continue
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        try:
            if part.offset == 0:
                os.ftruncate(fd, 0)
            os.pwrite(fd, part.data, part.offset)
        finally:
            os.close(fd)
    return refused


def _whole(path: Path, part: FilePart) -> None:
    """A record shipped whole (in one part or several): written into a temp file beside it,
    fsynced and renamed into place with its last part (``write_json``'s atomic write): a
    reader sees the old record or the new one, never half; a temp file of a record whose last
    part never came (a lost node) is left as ``.NAME.shipped.tmp``."""
    tmp = path.with_name(f".{path.name}.shipped.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW | (os.O_TRUNC if part.offset == 0 else 0),
                 0o644)
    try:
        os.pwrite(fd, part.data, part.offset)
        if part.last:
            os.fsync(fd)
    finally:
        os.close(fd)
    if part.last:
        os.replace(tmp, path)


__all__ = ["CHUNK", "SHIP_CAP", "Stage", "UnsafePath", "forget_study", "receive", "stage_root", "study_stage", "study_tag",
           "target"]
