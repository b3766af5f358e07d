"""Run a documentation page's shell blocks in order and compare what they print with the
page (issue 31: docs that cannot drift).  Sybil finds the blocks and the skip directives;
this module is only the evaluator.

What runs, in a private directory of its own per page (mode 0700, with ``.venv``
linking to the running interpreter's environment, so ``.venv/bin/runner`` and
``../.venv/bin/runner`` both work):

* a ```` ```sh ```` block: the whole block, as a script, in one long-lived ``bash``
  session per page (so ``cd``, variables, functions and background jobs carry on to the
  next block); its output is not compared;
* a ```` ```console ```` block: each ``$ COMMAND`` line (a line ending in ``\\`` goes on
  to the next; a ``<<'EOF'`` heredoc takes its lines), then the lines up to the next
  ``$`` are what the command printed.  A command that is one simple ``runner …`` (or
  ``.venv/bin/runner …``) command (no pipe, redirection, ``&``, ``;``), that neither
  crashes nor hangs on purpose and is no ``start``, runs in this process
  (``tests.helpers.run_main``, in the session's directory, with the words the bash
  session expands: ``"$DB"`` is the page's variable): the same exit code, stdout and
  stderr as a process, without the interpreter start-up.  Everything else runs in the
  bash session.
* ``<!-- save: NAME -->`` before a ```` ```python ```` or ```` ```toml ```` block: the
  block is written to the file ``NAME`` in the session's directory (a module the page's
  commands import, a configuration file they read; the site shows "Save the next block
  as NAME"); other python and toml blocks are not run;
* ``<!-- skip: next "why" -->`` before a block: not run (the reason shows in the test
  report); keep those few.

How output is compared (these are the whole set of rules):

1. The page's lines are what the command printed on stdout and on stderr, each in its
   own order, interleaved in any way: a terminal shows the two streams as they come, and
   how they interleave is not fixed (a log line on stderr, the answer on stdout).
2. Times: every ISO 8601 time (``2026-11-30T16:44:16.000Z``, with or without fraction)
   reads ``<TIME>``.
3. Ids: each distinct ``write_id`` in the form runner makes (a UUID of the version 7
   layout: a page showing an older form fails) reads ``<ID1>``, ``<ID2>``… in order of
   first appearance on the page, and each distinct 12-hex-digit id (a pinned target's) ``<HEX1>``…
   the same way, a 32-hex-digit one (a store's identity) by its first 12 digits, as
   runner cuts it in its messages: a page that shows one id twice must show the same id
   twice.
4. Processes: ``pid=123`` and ``(pid 123`` read ``pid=<PID>``/``(pid <PID>``, and a
   host name after ``host=`` or ``on`` in a lock holder's ``(pid 1 on vm)`` ``<HOST>``,
   and a port after ``port`` or ``port=`` (``--listen 127.0.0.1:0`` takes any free one)
   ``<PORT>``.
5. Durations: a number of seconds after ``seconds=``, in ``took 1.23 s`` or as
   ``"age_seconds"`` reads ``<S>``.
6. Paths: an absolute path in quotes keeps only its file name (``'/any/where/q.db.lock'``
   reads ``'…/q.db.lock'``).
7. Trailing spaces are ignored; a page line that is only ``…`` stands for any number of
   lines, and a ``…`` inside a line for any text (``{"id":"cand-1",…}``).
8. A background task's log line (``sweep.done``: the candidate sweep that ``start``
   runs beside its cycles) is left out on both sides: whether it comes before a short
   run ends is not fixed.

To bring a page up to date after a change of output, run its test with
``RUNNER_DOCS_UPDATE=1``: every command's lines on the page are replaced with what it
printed (stdout first when the page showed stdout first, else stderr first; the private
directory reads ``/home/you``), and the page is written back.  Read the diff before
committing it: the test is only as good as the pages' review.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown import CodeBlockParser, SkipParser
from sybil.parsers.markdown.lexers import DirectiveInHTMLCommentLexer

from tests.helpers import ROOT, needs_a_process, run_main

#: set to rewrite the pages' output (see the module docstring)
UPDATE_ENV = "RUNNER_DOCS_UPDATE"
#: the seconds one command may take (a ``start --cycles 1`` takes about one)
COMMAND_TIMEOUT = 60.0

_TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?Z")
_UUID = re.compile(r"\b[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}\b")
_HEX = re.compile(r"(?<![0-9a-f-])(?:[0-9a-f]{32}|[0-9a-f]{12})(?![0-9a-f-])")
_PID = re.compile(r"(pid[= ])\d+")
_PORT = re.compile(r"\b(port[= ])\d+")
_HOST = re.compile(r"(host=|\(pid <PID> on )[^\s)]+")
_SECONDS = re.compile(r"(seconds=|took |\"age_seconds\":)\d+(?:\.\d+)?")
_PATH = re.compile(r"'/[^'\s]*/([^'/\s]+)'")
_BACKGROUND = re.compile(r"^\S+ sweep\.done ")
_STDERR = re.compile(r"^(?:\d{4}-\d\d-\d\dT|\{\"ts\":|runner:)")
_OPERATORS = frozenset("|&;<>()")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)(\w+)\1")


@dataclass
class Ids:
    """Numbers each distinct id in order of first appearance (rule 3)."""

    seen: dict[str, str] = field(default_factory=dict)

    def name(self, kind: str, text: str) -> str:
        key = f"{kind}:{text}"
        if key not in self.seen:
            self.seen[key] = f"<{kind}{sum(k.startswith(kind) for k in self.seen) + 1}>"
        return self.seen[key]


def normalise(line: str, ids: Ids) -> str:
    line = _TIME.sub("<TIME>", line.rstrip())
    line = _UUID.sub(lambda m: ids.name("ID", m.group()), line)
    line = _HEX.sub(lambda m: ids.name("HEX", m.group()[:12]), line)
    line = _PID.sub(r"\1<PID>", line)
    line = _HOST.sub(r"\1<HOST>", line)
    line = _PORT.sub(r"\1<PORT>", line)
    line = _SECONDS.sub(r"\1<S>", line)
    return _PATH.sub(r"'…/\1'", line)


def interleaves(expected: list[str], out: list[str], err: list[str]) -> bool:
    """Rules 1 and 7: ``expected`` is ``out`` and ``err`` interleaved, each in its order,
    a line ``…`` standing for any number of lines of either."""
    from functools import cache

    @cache
    def match(i: int, j: int, k: int) -> bool:
        if i == len(expected):
            return j == len(out) and k == len(err)
        if expected[i] == "…":
            return (match(i + 1, j, k) or (j < len(out) and match(i, j + 1, k))
                    or (k < len(err) and match(i, j, k + 1)))
        return ((j < len(out) and same(expected[i], out[j]) and match(i + 1, j + 1, k))
                or (k < len(err) and same(expected[i], err[k]) and match(i + 1, j, k + 1)))

    return match(0, 0, 0)


def same(expected: str, actual: str) -> bool:
    if "…" not in expected:
        return expected == actual
    pattern = ".*".join(re.escape(part) for part in expected.split("…"))
    return re.fullmatch(pattern, actual, re.DOTALL) is not None


@dataclass
class Command:
    text: str
    expected: list[str]
    line: int


def commands(source: str, first_line: int) -> Iterator[Command]:
    """The ``$`` commands of a console block with the lines each printed."""
    lines = source.splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith("$ "):
            raise AssertionError(f"line {first_line + i}: a console block starts with '$ '")
        start = i
        text = lines[i][2:]
        while text.endswith("\\") and i + 1 < len(lines):
            i += 1
            text = text + "\n" + lines[i]
        heredoc = _HEREDOC.search(text)
        if heredoc:
            while i + 1 < len(lines):
                i += 1
                text += "\n" + lines[i]
                if lines[i].strip() == heredoc.group(2):
                    break
        i += 1
        expected = []
        while i < len(lines) and not lines[i].startswith("$ "):
            expected.append(lines[i])
            i += 1
        yield Command(text, expected, first_line + start)


class Session:
    """One bash process per page: blocks run in it one after another, so the state a
    page builds up (the directory, variables, background jobs) carries on."""

    def __init__(self, home: Path) -> None:
        self.home = home
        env = {**os.environ, "PATH": f"{Path(sys.prefix) / 'bin'}:{os.environ['PATH']}",
               "HOME": str(home), "COLUMNS": "100"}
        env.pop("RUNNER_CRASH_AT", None)
        self.proc = subprocess.Popen(["bash", "--norc", "--noprofile"], cwd=home, env=env,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True,
                                     start_new_session=True)

    def run(self, script: str) -> tuple[int, str, str]:
        """Run ``script`` in the session: its exit code, stdout and stderr."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        mark = uuid.uuid4().hex
        out, err = self.home / ".out", self.home / ".err"
        self.proc.stdin.write(f"{{\n{script}\n}} >{out} 2>{err} </dev/null\n"
                              f"echo \"{mark} $? $PWD\"\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()  # bash answers when the script is done
        if not line.startswith(mark):
            raise AssertionError(f"the bash session ended: {line!r}")
        _, code, self.cwd = line.rstrip("\n").split(" ", 2)
        return int(code), out.read_text(), err.read_text()

    def pwd(self) -> Path:
        self.run(":")
        return Path(self.cwd)

    def close(self) -> None:
        """End the session and every job it left (a page's background ``start``)."""
        import signal

        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                stream.close()


def _in_process(text: str, session: Session) -> list[str] | None:
    """The arguments of a ``runner …`` command line that can run in this process: one
    simple command (no pipe, redirection, ``&``, ``;``, heredoc), whose words the bash
    session expands (``"$DB"``, ``"$(date …)"``), that neither crashes nor hangs on
    purpose and is no ``start``."""
    text = text.replace("\\\n", " ")  # a continued line is one command line
    if "\n" in text:
        return None
    lexer = shlex.shlex(text, posix=True, punctuation_chars=True)
    lexer.commenters = "#"
    try:
        tokens = list(lexer)
    except ValueError:
        return None
    if not tokens or Path(tokens[0]).name != "runner" or "$" in tokens[0]:
        return None
    if any(token and set(token) <= _OPERATORS for token in tokens):
        return None
    code, out, _ = session.run(f"printf '%s\\0' {text.split(None, 1)[1]}"
                               if " " in text.strip() else "true")
    words = out.split("\0")[:-1] if code == 0 else None
    if words is None or needs_a_process(words):
        return None
    return words
class Page:
    """The state of one page being run: its session and the ids its output showed."""

    def __init__(self, home: Path, update: bool = False) -> None:
        (home / ".venv").symlink_to(sys.prefix)
        self.home = home
        self.session = Session(home)
        self.expected_ids, self.actual_ids = Ids(), Ids()
        #: RUNNER_DOCS_UPDATE: (page line of a command, lines it showed, lines it printed)
        self.update = update
        #: False while a page the reader follows first runs (checked by its own test)
        self.checking = True
        #: the file the next python or toml block is (``<!-- save: NAME -->``)
        self.saving: str | None = None
        self.replaced: list[tuple[int, int, list[str]]] = []

    def run_sh(self, example: Example) -> None:
        code, out, err = self.session.run(example.parsed)
        if code != 0:
            raise AssertionError(f"{example.path}:{example.line}: the sh block exited {code}"
                                 f"\n{out}{err}")

    def run_console(self, example: Example) -> str | None:
        for command in commands(example.parsed, example.line + 1):
            argv = _in_process(command.text, self.session)
            if argv is not None:
                proc = run_main(*argv, cwd=self.session.pwd(), timeout=COMMAND_TIMEOUT)
                out, err = proc.stdout, proc.stderr
            else:
                _, out, err = self.session.run(command.text)
            if not self.checking:
                continue
            problem = self._compare(command, out, err)
            if problem and self.update:
                self.replaced.append((command.line, len(command.expected),
                                      self._printed(command, out, err)))
            elif problem:
                return f"{example.path}:{command.line}: $ {command.text}\n{problem}"
        return None

    def _printed(self, command: Command, out: str, err: str) -> list[str]:
        first = command.expected[:1]
        parts = [out, err] if first and not _STDERR.match(first[0]) else [err, out]
        text = "".join(parts).replace(str(self.home.resolve()), "/home/you")
        return text.replace(str(self.home), "/home/you").splitlines()

    def _compare(self, command: Command, out: str, err: str) -> str | None:
        want = [normalise(line, self.expected_ids) for line in command.expected
                if not _BACKGROUND.match(line)]
        streams = [[normalise(line, self.actual_ids) for line in text.splitlines()
                    if not _BACKGROUND.match(line)] for text in (out, err)]
        if interleaves(want, *streams):
            return None
        return ("the output differs from the page:\n--- the page (normalised)\n"
                + "\n".join(want) + "\n--- stdout (normalised)\n" + "\n".join(streams[0])
                + "\n--- stderr (normalised)\n" + "\n".join(streams[1])
                + "\n--- runner printed\n" + out + err)

    def close(self) -> None:
        self.session.close()


def _page(example: Example) -> Page:
    page = example.namespace.get("page")
    assert isinstance(page, Page), "run a page through run_page()"
    return page


def _sh(example: Example) -> None:
    _page(example).run_sh(example)


def _console(example: Example) -> str | None:
    return _page(example).run_console(example)


def _save(example: Example) -> None:
    _page(example).saving = str(example.parsed)


def _file(example: Example) -> None:
    page = _page(example)
    if page.saving is not None:
        (page.session.pwd() / page.saving).write_text(example.parsed, encoding="utf-8")
        page.saving = None


class SaveParser:
    """``<!-- save: NAME -->``: the next python or toml block is the file ``NAME``."""

    def __init__(self) -> None:
        self.lexer = DirectiveInHTMLCommentLexer(directive="save", arguments=r"[\w.-]+")

    def __call__(self, document: Document) -> Iterator[Region]:
        for region in self.lexer(document):
            region.parsed = region.lexemes["arguments"]
            region.evaluator = _save
            yield region


SYBIL = Sybil(parsers=[SkipParser(), SaveParser(), CodeBlockParser("sh", _sh),
                       CodeBlockParser("console", _console), CodeBlockParser("python", _file),
                       CodeBlockParser("toml", _file)],
              path=str(ROOT))


def run_page(relative: str, after: str | None = None, *, setup_only: bool = True
             ) -> list[str]:
    """Run every block of the page at ``relative`` (to the repository root) in order;
    raises at the first that differs.  Returns the reasons of the blocks not run.
    ``after``: a page the reader follows first, run first in the same session and not
    compared (its own test does that): only its ``sh`` blocks, the set-up, when
    ``setup_only`` (the PostgreSQL tutorial goes on from the SQLite tutorial's files),
    else all of it (the uncertain-record how-to starts where the SQLite tutorial ends)."""
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="runner-docs-") as home:
        os.chmod(home, 0o700)
        page = Page(Path(home), update=bool(os.environ.get(UPDATE_ENV)))
        try:
            if after is not None:
                page.checking = False
                _run_document(after, page, [], setup_only=setup_only)
                page.checking = True
            _run_document(relative, page, skipped)
        finally:
            page.close()
    if page.replaced:
        _rewrite(ROOT / relative, page.replaced)
    return skipped


def _run_document(relative: str, page: Page, skipped: list[str], *,
                  setup_only: bool = False) -> None:
    from unittest import SkipTest

    document: Document = SYBIL.parse(ROOT / relative)
    document.namespace["page"] = page
    for example in document.examples():
        if setup_only and example.region.evaluator is _console:
            continue
        try:
            example.evaluate()
        except SkipTest as skip:
            skipped.append(f"line {example.line}: {skip}")


def _rewrite(path: Path, replaced: list[tuple[int, int, list[str]]]) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    for line, shown, printed in sorted(replaced, reverse=True):
        start = _output_start(lines, line)
        lines[start:start + shown] = printed
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def _output_start(lines: list[str], line: int) -> int:
    """The index of the first output line of the command on page line ``line``."""
    i = line - 1
    text = lines[i]
    while text.rstrip().endswith("\\"):
        i += 1
        text = lines[i]
    heredoc = _HEREDOC.search(lines[line - 1])
    if heredoc:
        while lines[i].strip() != heredoc.group(2):
            i += 1
    return i + 1

