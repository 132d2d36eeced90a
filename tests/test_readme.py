"""The README's examples, run as written on the default set-up: the default model (SmolLM2) on
CPU, speculating by n-gram, nothing configured.

Every fenced code block of README.md is one of:

- marked ``<!-- not-run: why -->`` on the line before: not run (a GPU, Docker, the hub, the suite itself);
- marked ``<!-- output -->``: what the block before it prints, compared with what it printed;
- a ``json`` job (``{"input": ...}``): sent to RunPod's local API (``/runsync``);
- ``python``: run against the pod;
- ``bash``: each command run as it is written, by kind: ``handler.py --rp_serve_api`` and
  ``-m worker serve`` are the two servers (started from those very lines); ``curl`` is sent to
  them; ``handler.py --test_input '<job>'`` is sent to ``/runsync`` (the same handler with the
  same engine, without booting a third one); ``-m worker fit | plan`` run.

A block of any other kind fails :func:`test_every_block_is_run_or_marked`: mark it, or teach this
module to run it. The README's ports (8000 for the pod, 8001 for the local API) are swapped for
free ones.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.helpers import ROOT, free_port, wait_until_ready

README = ROOT / "README.md"
# The pages whose examples run too, after the README's (the tools' examples moved out of it).
DOCS = (README, ROOT / "docs" / "tools.md", ROOT / "docs" / "pod.md")
POD_PORT, LOCAL_API_PORT = 8000, 8001  # the README's
_MARK = re.compile(r"<!-- (not-run|output)(?::\s*(.*?))? -->")
_FENCE = re.compile(r"^```(\w*)$")


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    lang: str
    body: str
    mark: str | None  # "not-run", "output" or None
    reason: str
    source: str = "README.md"

    @property
    def where(self) -> str:
        return f"{self.source}:{self.line}"


def doc_blocks() -> list[Block]:
    """The fenced blocks of every page in :data:`DOCS`, in order."""
    return [block for page in DOCS for block in readme_blocks(page.read_text(), source=str(page.relative_to(ROOT)))]


def readme_blocks(text: str, *, source: str = "README.md") -> list[Block]:
    lines = text.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = _FENCE.match(lines[i])
        if fence is None:
            i += 1
            continue
        end = lines.index("```", i + 1)
        mark = _MARK.fullmatch(lines[i - 1].strip()) if i else None
        blocks.append(
            Block(
                line=i + 1,
                lang=fence.group(1),
                body="\n".join(lines[i + 1 : end]),
                mark=mark.group(1) if mark else None,
                reason=(mark.group(2) or "") if mark else "",
                source=source,
            )
        )
        i = end + 1
    return blocks


def commands(block: Block) -> list[str]:
    """A bash block's commands: continuation lines joined, comments and blank lines dropped."""
    joined = block.body.replace("\\\n", " ")
    return [line for line in (_strip_comment(raw).strip() for raw in joined.splitlines()) if line]


def _strip_comment(line: str) -> str:
    """The line up to its comment: a ``#`` outside quotes, at the start or after a blank."""
    quote = None
    for i, ch in enumerate(line):
        if quote is not None:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def command_kind(command: str) -> str | None:
    if re.search(r"handler\.py --rp_serve_api\b", command):
        return "local_api"
    if re.search(r"-m worker serve\b", command):
        return "pod"
    if re.search(r"handler\.py --test_input '", command):
        return "job"
    if command.startswith("curl "):
        return "curl"
    if re.search(r"-m worker (fit|plan)\b", command):
        return "tool"
    return None


def block_kind(block: Block) -> str | None:
    if block.mark is not None:
        return block.mark
    if block.lang == "json" and "input" in _json_object(block.body):
        return "job"
    if block.lang == "python":
        return "python"
    if block.lang == "bash" and all(command_kind(c) for c in commands(block)):
        return "bash"
    return None


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return {}
    return value if isinstance(value, dict) else {}


def test_every_block_is_run_or_marked() -> None:
    """Each block is one this module runs, an output it compares, or marked not-run with a reason;
    an output follows a block that runs; the README opens with its two commands."""
    blocks = doc_blocks()
    assert blocks, "no code blocks found"
    problems = [f"{b.where}: a {b.lang or 'plain'} block the test cannot run" for b in blocks if block_kind(b) is None]
    problems += [f"{b.where}: not-run needs a reason" for b in blocks if b.mark == "not-run" and not b.reason]
    for before, block in itertools.pairwise(blocks):
        if block.mark == "output" and block_kind(before) not in ("bash", "job", "python"):
            problems.append(f"{block.where}: an output after a block that does not run")
    assert not problems, "mark each block <!-- not-run: why --> or teach tests/test_readme.py to run it:\n" + "\n".join(
        problems
    )
    first = commands(readme_blocks(README.read_text())[0])
    assert first[0].startswith("./scripts/setup.sh && .venv/bin/python handler.py"), first
    assert first[1].startswith("./scripts/setup.sh && .venv/bin/python -m pytest"), first


def test_block_parsing_drops_comments_outside_quotes_only() -> None:
    block = Block(1, "bash", 'curl -s x \\\n  -d \'{"a": "#1"}\'   # a comment\n# only\n\nnext', None, "")
    assert commands(block) == ['curl -s x    -d \'{"a": "#1"}\'', "next"]


# ------------------------------------------------------------------ running them


@dataclass
class Servers:
    pod: str
    local_api: str
    lines: dict[str, str]  # the README line each server was started from


def _popen(command: str, *, extra: list[str], env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    """A README command line (``VAR=value ... .venv/bin/python ...``) started as written, with this
    interpreter and ``extra`` arguments appended (argparse takes the last of a repeated option, so
    ``--port N`` appended wins over the README's port)."""
    words = shlex.split(command)
    assignments = dict(w.split("=", 1) for w in words if re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", w))
    argv = words[len(assignments) :]
    assert argv[0].endswith("python"), command
    with open(log, "wb") as out:
        return subprocess.Popen(
            [sys.executable, *argv[1:], *extra],
            cwd=ROOT,
            env={**env, **assignments},
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _server_lines() -> dict[str, str]:
    found: dict[str, str] = {}
    for block in readme_blocks(README.read_text()):
        if block_kind(block) == "bash":
            for command in commands(block):
                kind = command_kind(command)
                if kind in ("pod", "local_api"):
                    assert kind not in found, f"two {kind} commands in the README"
                    found[str(kind)] = command
    assert set(found) == {"pod", "local_api"}, found
    return found


@pytest.fixture(scope="module")
def readme_servers(subprocess_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """The pod and RunPod's local API, each started from its README line (booting at once)."""
    lines = _server_lines()
    logs = tmp_path_factory.mktemp("readme")
    pod_port, api_port = free_port(), free_port()
    pod = _popen(lines["pod"], extra=["--port", str(pod_port)], env=subprocess_env, log=logs / "pod.log")
    api = _popen(
        lines["local_api"], extra=["--rp_api_port", str(api_port)], env=subprocess_env, log=logs / "local-api.log"
    )
    servers = Servers(f"http://127.0.0.1:{pod_port}", f"http://127.0.0.1:{api_port}", lines)
    try:
        try:
            wait_until_ready(servers.pod, pod, timeout_s=300)
        except RuntimeError as exc:
            raise AssertionError(f"{exc}: {(logs / 'pod.log').read_text()[-3000:]}") from None
        deadline = time.monotonic() + 120
        while True:  # the SDK's API answers before the engine boots: the first job boots it
            try:
                httpx.get(servers.local_api + "/docs", timeout=5)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline and api.poll() is None, (logs / "local-api.log").read_text()[-3000:]
                time.sleep(0.2)  # polling a port that is not open yet: nothing to wait on
        yield servers
    finally:
        for proc in (pod, api):
            proc.terminate()
        for proc in (pod, api):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()


def _local(servers: Servers, text: str) -> str:
    return text.replace(f"localhost:{POD_PORT}", servers.pod.removeprefix("http://")).replace(
        f"localhost:{LOCAL_API_PORT}", servers.local_api.removeprefix("http://")
    )


def _runsync(servers: Servers, job: dict[str, Any], where: str) -> list[Any]:
    answer = httpx.post(servers.local_api + "/runsync", json=job, timeout=300).json()
    assert answer.get("status") == "COMPLETED", f"{where}: {answer}"
    items = answer["output"]
    errors = [item for item in items if isinstance(item, dict) and "error" in item]
    assert not errors, f"{where}: {errors}"
    return list(items)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def _check_output(printed: Any, shown: Block) -> None:
    """What a block printed against the README's ``<!-- output -->`` block after it: text exactly;
    a job's final item field by field, figures as rounded as the README shows them, but for its
    timings (they differ from run to run) and the draft's counts, which hang on where the greedy
    answer meets its prompt's n-grams, step by step: another CPU's kernels may round a near tie
    differently late in an answer. Those counts are checked for shape and arithmetic."""
    if shown.lang != "json":
        assert printed == shown.body, f"{shown.where}: the command printed\n{printed}"
        return
    expected = json.loads(shown.body)
    assert isinstance(printed, dict), f"{shown.where}: {printed!r}"
    everything = json.dumps(printed)
    assert set(printed) == set(expected), f"{shown.where}: {everything}"
    for key in expected.keys() - {"timings", "spec_decode"}:
        assert _rounded(printed[key]) == expected[key], f"{shown.where}: {key}: {everything}"
    assert set(printed["timings"]) == set(expected["timings"]), everything
    spec, shown_spec = printed["spec_decode"], expected["spec_decode"]
    assert set(spec) == set(shown_spec), everything
    for key in ("num_spec_tokens", "partial", "per_step_accepted", "per_step_drafted"):
        assert spec[key] == shown_spec[key], f"{shown.where}: spec_decode.{key}: {everything}"
    for stats in (spec, shown_spec):  # the README's own figures must add up as much as the answer's
        histogram = stats["acceptance_histogram"]
        assert len(histogram) == stats["num_spec_tokens"] + 1 and sum(histogram) == stats["num_spec_steps"], stats
        assert stats["num_draft_tokens"] == stats["num_spec_tokens"] * stats["num_spec_steps"], stats
        assert stats["num_accepted_draft_tokens"] == sum(j * n for j, n in enumerate(histogram)), stats


def _run_command(command: str, servers: Servers, where: str) -> Any:
    """Run one README command; what it printed (a job: its final item)."""
    kind = command_kind(command)
    if kind in ("pod", "local_api"):
        assert servers.lines[str(kind)] == command  # the fixture started it
        return None
    if kind == "job":
        job = json.loads(shlex.split(command)[-1])
        return _runsync(servers, job, where)[-1]
    if kind == "tool":
        argv = shlex.split(command)
        assert argv[0].endswith("python"), command
        done = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{where}: {done.stderr[-2000:]}"
        return done.stdout.rstrip("\n")
    assert kind == "curl", command
    done = subprocess.run(["bash", "-c", _local(servers, command)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{where}: curl exit {done.returncode}: {done.stderr}"
    answer = json.loads(done.stdout)
    assert "error" not in answer and answer.get("status", "COMPLETED") == "COMPLETED", f"{where}: {answer}"
    if "/runsync" in command:
        assert not [i for i in answer["output"] if "error" in i], f"{where}: {answer}"
    return answer


def _run_python(code: str, servers: Servers, where: str, namespace: dict[str, Any]) -> str:
    """Run a Python block in ``namespace``, shared by the README's Python blocks: a reader runs them
    one after another in one session (the second uses the first one's client)."""
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(_local(servers, code), where, "exec"), namespace)
    return printed.getvalue().rstrip("\n")


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_examples_run_as_written(readme_servers: Servers) -> None:
    """Every block that is not marked not-run, in the README's order, against the two servers;
    each ``<!-- output -->`` block is what the block before it printed."""
    blocks = doc_blocks()
    printed: Any = None
    num_run = 0
    namespace: dict[str, Any] = {"__name__": "readme"}
    for block in blocks:
        kind = block_kind(block)
        if kind == "not-run":
            continue
        if kind == "output":
            _check_output(printed, block)
            continue
        num_run += 1
        if kind == "job":
            items = _runsync(readme_servers, json.loads(block.body), block.where)
            printed = items[-1]
            if isinstance(printed, str):  # an openai_route stream: whole server-sent events
                assert printed.endswith("data: [DONE]\n\n"), f"{block.where}: {printed!r}"
        elif kind == "python":
            printed = _run_python(block.body, readme_servers, block.where, namespace)
        else:
            for command in commands(block):
                printed = _run_command(command, readme_servers, block.where)
    assert num_run >= 9, num_run  # the job, the servers, curl twice, Python twice, the route, fit, plan
