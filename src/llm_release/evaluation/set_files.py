"""An eval set's files read as hostile data: bounded in size and nesting before a parser
sees them, no YAML aliases or duplicate keys, every read recorded (for the check cache), and
every error an :class:`EvalSetError` naming the file, the line and the field."""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import yaml

from llm_release.errors import EvalError


class EvalSetError(EvalError):
    """A problem in an eval set, located at a file, a line and a field."""

    def __init__(
        self,
        file: Path,
        line: int | None,
        field_name: str | None,
        message: str,
        *,
        hint: str | None = None,
    ) -> None:
        self.file, self.line, self.field = Path(file), line, field_name
        where = f"{file}:{line}" if line else str(file)
        what = f" field '{field_name}':" if field_name else ""
        super().__init__(f"{where}:{what} {message}", hint=hint)


# A task.yaml is a kilobyte or two; PyYAML reads about 30 KB a second of CPU in the worst
# legitimate shapes (many short keys or flow lists), so 64 KiB bounds a file to ~2 s.
MAX_YAML_BYTES = 64 * 1024


# While a check is recorded (set_checks.validate_cached): every file an eval set's check
# read, with its SHA-256 ("" for one that was looked for and absent), so the check is redone
# only when one of them changes.
_READS: contextvars.ContextVar[dict[str, str] | None] = contextvars.ContextVar(
    "eval_set_reads", default=None
)


@contextlib.contextmanager
def recording_reads() -> Iterator[dict[str, str]]:
    """Every file read inside the block, with its SHA-256, in the dict it yields."""
    reads: dict[str, str] = {}
    token = _READS.set(reads)
    try:
        yield reads
    finally:
        _READS.reset(token)


def record_read(path: Path, data: bytes | None) -> None:
    reads = _READS.get()
    if reads is not None:
        reads[str(Path(path).absolute())] = "" if data is None else hashlib.sha256(data).hexdigest()


def read_text(path: Path, limit: int | None = None) -> str:
    """A data file as UTF-8 text. Its kind and size are checked on the open file before a
    byte is read: a FIFO in a set's folder would hang every reader (``eval-sets list``
    included), a huge file would fill the worker's memory. Bad bytes are an error naming
    the file and the line."""
    try:
        # O_NONBLOCK: opening a FIFO for reading waits for a writer otherwise
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode):
            os.close(descriptor)
            raise EvalSetError(
                path, None, None, "is not a regular file", hint="put a plain file there"
            )
        with open(descriptor, "rb") as handle:
            if limit is not None and info.st_size > limit:
                raise EvalSetError(
                    path, None, None, f"is {info.st_size} bytes; at most {limit} allowed"
                )
            data = handle.read(-1 if limit is None else limit + 1)
    except OSError as exc:
        raise EvalSetError(path, None, None, f"cannot be read: {exc.strerror or exc}") from None
    if limit is not None and len(data) > limit:  # it grew while read
        raise EvalSetError(path, None, None, f"is more than {limit} bytes; at most {limit} allowed")
    record_read(path, data)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise EvalSetError(
            path, line, None, f"not UTF-8 (byte {exc.object[exc.start]:#04x} at offset {exc.start})"
        ) from None


MAX_NESTING = 32
_BLOCK_SCALAR = re.compile(r"(?:^|[\s:-])[|>][-+0-9]*[ \t]*(?:#.*)?$")
_INDICATORS = re.compile(r"(?:[-?:](?:[ \t]+|$))+")


def check_nesting(path: Path, text: str) -> None:
    """Nesting bounded on the raw text, before any YAML parser sees it: PyYAML's scanner
    slows down with the square of the flow depth ('[[[[…' of 100 KB took 83 s of CPU) and
    its composer recurses once per level. Counted conservatively: every '[' or '{' opens a
    flow level wherever it stands (in quotes and block text too; a template's balanced
    '{{ field }}' closes what it opens), every ']' or '}' closes one; a block level is an
    indentation step or a '- ' / '? ' / ': ' indicator at the start of a line. The text of
    a '|' or '>' block scalar adds no block level (a prompt may be indented freely)."""
    flow = 0
    indents: list[int] = []
    scalar_indent: int | None = None  # the indent of the line that opened a block scalar
    for number, line in enumerate(text.splitlines(), 1):
        body = line.lstrip(" \t")
        indent = len(line) - len(body)
        if scalar_indent is not None and (not body or indent > scalar_indent):
            depth = len(indents)
        else:
            scalar_indent = None
            if not body or body.startswith("#"):
                depth = len(indents)
            else:
                while indents and indents[-1] >= indent:
                    indents.pop()
                indents.append(indent)
                marks = _INDICATORS.match(body)
                depth = len(indents) + (len(re.findall("[-?:]", marks[0])) if marks else 0)
                if _BLOCK_SCALAR.search(line):
                    scalar_indent = indent
        for char in line:
            if char in "[{":
                flow += 1
                if flow > MAX_NESTING:
                    break
            elif char in "]}" and flow:
                flow -= 1
        if depth + flow > MAX_NESTING:
            raise EvalSetError(
                path,
                number,
                None,
                f"nested more than {MAX_NESTING} levels deep ('[', '{{', indentation and "
                "'- ' count as levels)",
                hint="an eval set's task.yaml is a few levels deep; flatten it",
            )


def check_yaml_structure(path: Path, text: str) -> None:
    """No aliases (an alias bomb expands a few lines into gigabytes) and no duplicate keys
    (YAML keeps the last silently, so a reviewer reads a different task than lm-eval)."""
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.AliasEvent):
            raise EvalSetError(
                path,
                event.start_mark.line + 1,
                None,
                f"YAML alias *{event.anchor} is not allowed",
                hint="write the value out; anchors and aliases are refused in eval sets",
            )
    stack = [yaml.compose(text, Loader=yaml.SafeLoader)]
    while stack:
        node = stack.pop()
        if isinstance(node, yaml.MappingNode):
            seen: dict[str, int] = {}
            for key, value in node.value:
                name = str(key.value)
                if name in seen:
                    raise EvalSetError(
                        path,
                        key.start_mark.line + 1,
                        name,
                        f"duplicate key (first on line {seen[name]})",
                    )
                seen[name] = key.start_mark.line + 1
                stack.append(value)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)


def read_yaml(path: Path) -> dict:
    text = read_text(path, MAX_YAML_BYTES)
    check_nesting(path, text)
    try:
        check_yaml_structure(path, text)
        data = yaml.safe_load(text)
    except yaml.constructor.ConstructorError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else None
        raise EvalSetError(
            path,
            line,
            None,
            f"{exc.problem} (code tags such as !function "
            "are not allowed; use a metric registered in llm_release.evaluation.metrics)",
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise EvalSetError(
            path,
            mark.line + 1 if mark else None,
            None,
            f"not valid YAML: {getattr(exc, 'problem', exc)}",
        ) from None
    except RecursionError:
        raise EvalSetError(path, None, None, "nested too deeply") from None
    if not isinstance(data, dict):
        raise EvalSetError(path, 1, None, "expected a mapping at the top level")
    return data


@dataclass(frozen=True)
class Origin:
    """Where a top-level key of a task was written: file, key line, value line and style."""

    file: Path
    line: int
    value_line: int
    block: bool  # a '|' or '>' scalar: its text starts on the line after value_line

    def template_line(self, line_in_template: int) -> int:
        if self.block:
            return self.value_line + line_in_template
        return self.line


def key_origins(path: Path) -> dict[str, Origin]:
    try:
        node = yaml.compose(read_text(path, MAX_YAML_BYTES), Loader=yaml.SafeLoader)
    except yaml.YAMLError:
        return {}
    if not isinstance(node, yaml.MappingNode):
        return {}
    return {
        str(k.value): Origin(
            path,
            k.start_mark.line + 1,
            v.start_mark.line + 1,
            getattr(v, "style", None) in ("|", ">"),
        )
        for k, v in node.value
    }
