"""mkdocs hook: pages name what they document, and the text comes from the code at build time, so
the reference lists what the code holds and never a copy of it.

- `<!-- api: PACKAGE -->` becomes one mkdocstrings block per public name of that package face.
- `<!-- docstring: MODULE -->` becomes the module's docstring as it is written (a text block: its
  own layout, such as a folder tree, kept).
- `<!-- config: MODULE.CLASS -->` becomes a table of the dataclass's keys: each field (a field that
  is itself a dataclass, a section, as `section.key`), its default, and the comment written beside
  it in the source.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import inspect
import io
import re
import sys
import tokenize
from typing import Any

_API = re.compile(r"^<!-- api: ([\w.]+) -->$", re.MULTILINE)
_CONFIG = re.compile(r"^<!-- config: ([\w.]+) -->$", re.MULTILINE)
_DOCSTRING = re.compile(r"^<!-- docstring: ([\w.]+) -->$", re.MULTILINE)


def public_names(package: str) -> list[tuple[str, str]]:
    """(name, defining module) for each public name of `package`, in the face's own order: from
    its lazy `_EXPORTS` table where it has one (PEP 562 faces), else from `__all__`."""
    face = importlib.import_module(package)
    exports: dict[str, str] | None = getattr(face, "_EXPORTS", None)
    names = list(exports) if exports is not None else list(face.__all__)
    return [(name, _home(package, name)) for name in names]


def _home(module_name: str, name: str) -> str:
    """The module that defines `name`, following lazy faces (`_EXPORTS`, which may point at another
    face) without importing what they guard (torch, the expert engine)."""
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.submodule_search_locations is None:
        return module_name  # a plain module defines what it is asked for; importing it could load torch
    module = importlib.import_module(module_name)
    exports: dict[str, str] | None = getattr(module, "_EXPORTS", None)
    if exports is not None and name in exports:
        return _home(importlib.util.resolve_name(exports[name], module_name), name)
    return _defining_module(module, name)  # an eager package face: the name is imported into it


def _defining_module(face: Any, name: str) -> str:
    """The module that defines `face.name`: a class's or function's own; for a constant, the
    submodule of the face that assigns it (griffe documents it there, not where it is imported)."""
    value = getattr(face, name)
    module = getattr(value, "__module__", None)
    if module and (inspect.isclass(value) or inspect.isfunction(value)):
        return module
    assignment = re.compile(rf"^{re.escape(name)}\s*(?::[^=\n]*)?=", re.MULTILINE)
    for module_name, module_object in sorted(sys.modules.items()):
        if (
            module_name.startswith(face.__name__ + ".")
            and getattr(module_object, name, None) is value
            and assignment.search(inspect.getsource(module_object))
        ):
            return module_name
    return face.__name__


def _field_comments(cls: type) -> dict[str, str]:
    """The comment on each field's line in the class's source, else the comment lines just above
    it (a comment that explains one field is written on it or right before it)."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        match = re.match(r"\s+(\w+)\s*:", line)
        if match is None:
            continue
        if number in comments and not line.lstrip().startswith("#"):
            found[match.group(1)] = comments[number]
            continue
        above: list[str] = []
        previous = number - 1
        while previous in comments and lines[previous - 1].lstrip().startswith("#"):
            above.insert(0, comments[previous])
            previous -= 1
        if len(above) > 1:  # a one-line comment above a field heads a group of fields
            found[match.group(1)] = " ".join(above)
    return found


def _default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def config_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str]]:
    """(key, default, comment) for each field of the dataclass `cls`, sections expanded."""
    comments = _field_comments(cls)
    rows: list[tuple[str, str, str]] = []
    for field in dataclasses.fields(cls):
        if field.name.startswith("_"):
            continue
        default = _default(field)
        if dataclasses.is_dataclass(default) and not isinstance(default, type):
            rows.extend(config_rows(type(default), prefix + field.name + "."))
            continue
        shown = "(required)" if default is dataclasses.MISSING else f"`{default!r}`"
        rows.append((prefix + field.name, shown, comments.get(field.name, "")))
    return rows


def _config_table(match: re.Match[str]) -> str:
    module, _, name = match.group(1).rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    lines = ["| key | default | what it is |", "| --- | --- | --- |"]
    lines += [
        f"| `{key}` | {default} | {comment.replace('|', '/')} |" for key, default, comment in config_rows(cls)
    ]
    return "\n".join(lines)


def _api_blocks(match: re.Match[str]) -> str:
    package = match.group(1)
    return "\n\n".join(f"::: {module}.{name}" for name, module in public_names(package))


def _docstring_block(match: re.Match[str]) -> str:
    docstring = inspect.getdoc(importlib.import_module(match.group(1))) or ""
    return f"```text\n{docstring}\n```"


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    for pattern, replace in ((_API, _api_blocks), (_CONFIG, _config_table), (_DOCSTRING, _docstring_block)):
        markdown = pattern.sub(replace, markdown)
    return markdown
