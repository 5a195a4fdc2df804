"""Which engine versions a plugin builds commands for, and how an option is spelled in each.

An engine renames and removes flags between releases (SGLang 0.5.10 dropped
``--speculative-ngram-{min,max}-match-window-size`` and renamed
``--speculative-ngram-branch-length`` to ``--speculative-ngram-max-trie-depth``), so a plugin
declares once, as :attr:`perflab.EnginePlugin.engine_versions`, the range of versions it maps
(``oldest`` .. ``newest``, each checked in the engine's own code) and every spelling that
changed inside it (:class:`Since`, with its source). Its launch building asks
:meth:`EngineVersions.how` for the spelling of the version the core chose
(:class:`VersionChoice`: the version asked for, else the installed one, else ``newest``).

Versions are compared by :func:`version_key`, which reads PEP 440 releases (``0.5.5.post1``,
``0.11.0rc2``, ``1.2.0rc1``) and MindIE's ``2.1.RC1`` alike, without a dependency.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from perflab.contract.errors import UnsupportedOption, UsageError

#: a version as users write it: digits first (``0.5.23``, ``2.1.RC1``, ``0.11.0rc2``, ``0.32.0+cpu``)
VERSION_RE = re.compile(r"^v?\d+(?:\.\d+)*[A-Za-z0-9.+_-]*$")
_PART = re.compile(r"(\d+)|([A-Za-z]+)")
# PEP 440 order of the segments after the release: dev < a < b < rc < (final) < post
_PRE = {"dev": -4, "a": -3, "alpha": -3, "b": -2, "beta": -2, "c": -1, "rc": -1, "pre": -1, "preview": -1}
_POST = {"post": 1, "rev": 1, "r": 1}


def version_key(version: str) -> tuple[tuple[int, ...], tuple[tuple[int, int], ...]]:
    """A sort key: the release numbers (trailing zeros dropped: ``0.5`` == ``0.5.0``), then each
    later segment as (rank, number), final release ranking between ``rc`` and ``post``.
    A local part (``+cpu``) does not count. UsageError when ``version`` is no version."""
    text = version.strip().lower().removeprefix("v").split("+", 1)[0]
    if not VERSION_RE.match(text):
        raise UsageError(f"{version!r} is not a version (expected e.g. 0.5.23, 2.1.RC1, 0.11.0rc2)")
    m = re.match(r"\d+(?:\.\d+)*", text)
    assert m is not None  # VERSION_RE starts with a digit
    release = [int(p) for p in m.group().split(".")]
    while len(release) > 1 and release[-1] == 0:
        release.pop()
    rest: list[tuple[int, int]] = []
    word: str | None = None
    for num, letters in _PART.findall(text[m.end():]):
        if letters:
            word = letters
            rank = _PRE.get(letters, _POST.get(letters, 0))
            rest.append((rank, 0))
        elif word is not None:
            rest[-1] = (rest[-1][0], int(num))
            word = None
        else:  # a number without a word (MindIE's build numbers): after the release
            rest.append((0, int(num)))
    if not rest or rest[0][0] >= 0:
        rest.insert(0, (0, 0))  # the final release, before any post
    return tuple(release), tuple(rest)


@dataclass(frozen=True)
class Since:
    """From engine version ``version`` on (until the option's next :class:`Since`), option
    ``option`` is spelled ``how``; ``how`` None: the engine has no way to say it from then on
    (``why`` says what happened). ``option`` is the plugin's own name for what it maps
    (``speculative_config.prompt_lookup_max``, ``options.kv_cache_memory_bytes``); ``source``
    is where that version's spelling was read (file and version)."""

    option: str
    version: str
    how: str | None
    source: str
    why: str = ""


@dataclass(frozen=True)
class EngineVersions:
    """The engine versions a plugin maps, ``oldest`` to ``newest`` (both checked in the engine's
    own code, ``source``), and each option whose spelling changed inside that range: its
    spelling at ``oldest`` and at every later change, in any order."""

    oldest: str
    newest: str
    source: str
    changes: tuple[Since, ...] = ()

    def __post_init__(self) -> None:
        # a malformed declaration is the plugin's bug: said when the plugin is loaded
        low, high = version_key(self.oldest), version_key(self.newest)
        if low > high:
            raise ValueError(f"EngineVersions: oldest {self.oldest} is newer than newest {self.newest}")
        for option in self.options():
            entries = [c for c in self.changes if c.option == option]
            keys = sorted(version_key(c.version) for c in entries)
            if keys[0] != low:
                raise ValueError(f"EngineVersions: {option!r} needs its spelling at the oldest version, {self.oldest}")
            if keys[-1] > high or len(set(keys)) != len(keys):
                raise ValueError(f"EngineVersions: {option!r} changes twice at one version or after the newest, "
                                 f"{self.newest}")
            if any((c.how is None and not c.why) or not c.source for c in entries):
                raise ValueError(f"EngineVersions: every change of {option!r} needs a source, and a why where it "
                                 "cannot be said")

    def nearest(self, version: str) -> str:
        """``version`` itself when it is in the range, else the nearest end of it."""
        key = version_key(version)
        if key < version_key(self.oldest):
            return self.oldest
        if key > version_key(self.newest):
            return self.newest
        return version

    def outside(self, version: str, display_name: str) -> str | None:
        """The one-line warning when ``version`` is outside the range (None: inside)."""
        nearest = self.nearest(version)
        if nearest == version:
            return None
        side = "older than the oldest" if version_key(version) < version_key(self.oldest) else "newer than the newest"
        return (f"{display_name} {version} is {side} version perflab maps ({self.oldest} .. {self.newest}); "
                f"its command lines are built with {display_name} {nearest}'s options")

    def spelling(self, option: str, version: str | None) -> Since:
        """The :class:`Since` in force for ``option`` at ``version`` (None: ``newest``; a version
        outside the range: the nearest end's)."""
        entries = sorted((c for c in self.changes if c.option == option), key=lambda c: version_key(c.version))
        if not entries:
            raise KeyError(f"no spelling declared for {option!r}")
        try:
            key = version_key(self.nearest(version or self.newest))
        except UsageError:  # a version perflab cannot read (choose_version warned): the newest
            key = version_key(self.newest)
        chosen = entries[0]
        for entry in entries:
            if version_key(entry.version) <= key:
                chosen = entry
        return chosen

    def how(self, engine: str, option: str, version: str | None, what: str | None = None,
            default: str | None = None) -> str:
        """``option``'s spelling at ``version``, or :class:`UnsupportedOption` (``what``, default
        ``option``) saying which version dropped it and why; ``default`` for an option whose
        spelling never changed (none declared), KeyError without one."""
        if default is not None and option not in self.options():
            return default
        entry = self.spelling(option, version)
        if entry.how is None:
            first = min((c for c in self.changes if c.option == option), key=lambda c: version_key(c.version))
            gone = "" if entry is first else f", gone since {entry.version}"
            raise UnsupportedOption(engine, what or option,
                                    f"not in {engine} {version or self.newest}{gone}: {entry.why} ({entry.source})")
        return entry.how

    def options(self) -> tuple[str, ...]:
        """The options whose spelling is declared, in declaration order."""
        return tuple(dict.fromkeys(c.option for c in self.changes))


#: where the version a command line is built for came from
Origin = Literal["asked", "plan", "installed", "newest", "unknown"]
ORIGIN_WORDS: dict[str, str] = {
    "asked": "--engine-version",
    "plan": "the plan's engine_versions",
    "installed": "installed",
    "newest": "not installed here: the newest version the plugin maps",
    "unknown": "not installed here; the plugin declares no versions",
}


@dataclass(frozen=True)
class VersionChoice:
    """The engine version a command line is built for: ``version`` (None only when it is not
    installed and the plugin declares no :class:`EngineVersions`), where it came from, the
    version installed here when it was read, and the warning when the plugin does not map it."""

    engine: str
    version: str | None
    origin: Origin
    installed: str | None = None
    warning: str | None = None

    @property
    def label(self) -> str:
        """``0.5.23 (--engine-version)``, as the CLI and the report say it."""
        return f"{self.version or '-'} ({ORIGIN_WORDS[self.origin]})"

    @property
    def notes(self) -> tuple[str, ...]:
        """What to warn about: a version asked for that is not the one installed here (the
        command may not run here), and a version outside the plugin's range."""
        out = []
        if self.origin in ("asked", "plan") and self.installed is not None and self.installed != self.version:
            out.append(f"{self.engine}'s commands are built for {self.version} ({ORIGIN_WORDS[self.origin]}), "
                       f"but {self.installed} is installed here")
        if self.warning:
            out.append(self.warning)
        return tuple(out)

    def to_json(self) -> dict[str, str | None]:
        return {"version": self.version, "from": self.origin, "installed": self.installed, "warning": self.warning}


def choose_version(engine: str, display_name: str, versions: EngineVersions | None, asked: str | None,
                   installed: str | None, origin: Origin = "asked") -> VersionChoice:
    """The version to build for: ``asked`` (``origin`` says who asked), else ``installed``, else
    the plugin's newest. A version outside the plugin's range is used as it is, with a warning:
    the plugin builds it with the nearest end's spellings (:meth:`EngineVersions.nearest`)."""
    if asked is not None:
        try:
            version_key(asked)  # a malformed version is a usage error, said once, here
        except UsageError as exc:
            raise UsageError(f"{ORIGIN_WORDS[origin]}: {engine}: {exc}") from None
        choice = VersionChoice(engine, asked.strip(), origin, installed)
    elif installed is not None:
        choice = VersionChoice(engine, installed, "installed", installed)
    elif versions is not None:
        choice = VersionChoice(engine, versions.newest, "newest")
    else:
        choice = VersionChoice(engine, None, "unknown")
    warning = None
    if versions is not None and choice.version is not None:
        try:
            warning = versions.outside(choice.version, display_name)
        except UsageError:  # an installed version perflab cannot read: built as the newest
            warning = f"{display_name} reports version {choice.version!r}, which perflab cannot compare; " \
                      f"its command lines are built with {display_name} {versions.newest}'s options"
    return VersionChoice(choice.engine, choice.version, choice.origin, choice.installed, warning)
