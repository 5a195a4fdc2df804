"""report.md's boxes: plain Markdown that GitHub renders, and PyMdown's syntax for report.html.

report.md is read on GitHub (and in other Markdown viewers) as much as in a browser, where
MkDocs' ``!!! note`` admonitions and PyMdown's ``??? info`` boxes show as literal text. So
report.md writes a callout as a blockquote opening with GitHub's alert marker and a bold title
(:func:`callout`), and a collapsible box as ``<details><summary>`` (:func:`details`): GitHub
renders both, and anywhere else they read as a quote and a box. report.html keeps the seeds'
look: :func:`to_pymdown` turns exactly these forms back into the admonitions and PyMdown details
it renders (:mod:`perflab.lab.report.html`).
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping

#: a callout's kind (PyMdown's admonition class, the seeds' look) -> GitHub's alert marker
ALERTS: Mapping[str, str] = {"note": "NOTE", "tip": "TIP", "important": "IMPORTANT", "warning": "WARNING",
                             "danger": "CAUTION"}
_KINDS = {v: k for k, v in ALERTS.items()}

#: a collapsible box's kind: the seeds' ``??? info`` (closed) and ``???+ tip`` (open)
DETAIL_KINDS = ("info", "tip", "note", "warning")

_ALERT_RE = re.compile(r"^> \[!(?P<alert>[A-Z]+)\]$")
_TITLE_RE = re.compile(r"^> \*\*(?P<title>.+)\*\*$")
_DETAILS_RE = re.compile(r'^<details class="(?P<kind>[a-z]+)"(?P<open> open)?><summary>(?P<title>.*)</summary>$')


def callout(kind: str, title: str | None, lines: Iterable[str]) -> list[str]:
    """A callout of ``kind`` (a key of :data:`ALERTS`): ``lines`` are its Markdown, one per line."""
    out = [f"> [!{ALERTS[kind]}]"]
    if title:
        out += [f"> **{title}**", ">"]
    return out + [f"> {line}" if line else ">" for item in lines for line in item.split("\n")]


def details(kind: str, title: str, body: str, *, open_: bool = False) -> list[str]:
    """A collapsible box of ``kind`` (one of :data:`DETAIL_KINDS`) holding ``body`` (Markdown:
    GitHub needs the blank lines around it to render it as such)."""
    if kind not in DETAIL_KINDS:
        raise ValueError(f"no collapsible box of kind {kind!r} (expected one of: {', '.join(DETAIL_KINDS)})")
    return [f'<details class="{kind}"{" open" if open_ else ""}><summary>{html.escape(title, quote=False)}</summary>',
            "", *body.splitlines(), "", "</details>"]


def to_pymdown(text: str) -> str:
    """``text`` with the forms of :func:`callout` and :func:`details` in PyMdown's syntax
    (``!!! kind "title"`` and ``???[+] kind "title"``, the body indented by four spaces); the
    rest as it is. Code fences are passed over: a line of code is never a box."""
    lines = text.split("\n")
    out: list[str] = []
    i, fenced = 0, False
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):
            fenced = not fenced
        if not fenced and (m := _ALERT_RE.match(line)) and m["alert"] in _KINDS:
            i += 1
            title = None
            if i < len(lines) and (t := _TITLE_RE.match(lines[i])):
                title, i = t["title"], i + 1
                if i < len(lines) and lines[i] == ">":
                    i += 1
            out.append(f"!!! {_KINDS[m['alert']]}" + (f' "{title}"' if title else ""))
            while i < len(lines) and (lines[i] == ">" or lines[i].startswith("> ")):
                out.append(_indent(lines[i][2:]))
                i += 1
            continue
        if not fenced and (m := _DETAILS_RE.match(line)):
            body: list[str] = []
            i += 1
            inner_fence = False
            while i < len(lines) and (inner_fence or lines[i] != "</details>"):
                if lines[i].startswith("```"):
                    inner_fence = not inner_fence
                body.append(lines[i])
                i += 1
            i += 1  # the closing tag
            while body and not body[0]:
                body.pop(0)
            while body and not body[-1]:
                body.pop()
            title = html.unescape(m["title"])
            out.append(f'???{"+" if m["open"] else ""} {m["kind"]} "{title}"')
            out += [_indent(b) for b in body]
            continue
        out.append(line)
        i += 1
    return "\n".join(out)


def _indent(line: str) -> str:
    return "    " + line if line else ""
