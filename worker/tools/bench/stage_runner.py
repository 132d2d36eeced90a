"""Runs the GPU benchmark's stages (:mod:`.stages`): each run one child process under a deadline,
everything it started stopped afterwards, and the output folder packed after each run.

    python -m worker bench --stage list                     # the stages, their runs and checkpoints
    python -m worker bench --stage overhead,pod --out bench-gpu --archive $OUT/bench.tgz --time-limit 570
    python -m worker bench --stage spec-map-draft -- --configs 'none;$draft:3:1.5:auto;$draft:3:1.5:static'
    python -m worker bench --stage overhead --smoke         # tiny models, tiny sizes: the harness, on a CPU

Each run writes, under ``--out``: ``LABEL/`` (the program's own folder: ``bench.json``,
``bench.md``, plots, server logs), ``LABEL.log`` (its output), ``LABEL.json`` (a copy of its
result file) and ``stage-runs.json`` (every run's command, settings and how it ended). With
``--archive``, the whole folder is packed there (a tar.gz, written beside it and moved into
place) after every run: a call cut short still returns what its finished runs wrote. Under
``--time-limit`` each run is cut short of the limit by a margin (time for the archive), and a run
with less than its ``min_s`` left is skipped.

A run's program starts in a session of its own, so that its process group is the run: at the
deadline (or when it ends, or when the runner is stopped) the group gets SIGTERM, which the bench
turns into an exit that stops the servers it started, then SIGKILL once ``grace_s`` has passed.
Servers start sessions of their own, so their groups are not the run's: the run's process tree is
read (psutil) before the group is stopped, and every group found in it is killed too. A server
whose parent has already gone is not in that tree; the runner makes itself the child subreaper
(Linux), so such orphans become its own children, and those that appeared during the run are
counted as the run's. The runner then waits for every process of the run to be gone, so that the
next run finds the GPU's memory free.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from worker.tools.bench.stages import ROOT, SHAPES, STAGES, TINY, Checkpoints, Stage, command, placeholders

__all__ = ["Finished", "become_subreaper", "gpu_label", "main", "run_process", "run_stages", "write_archive"]

_PR_SET_CHILD_SUBREAPER = 36


@dataclass(frozen=True, slots=True)
class Finished:
    """How a run's process ended: ``ok`` (exit 0), ``failed`` (another exit), ``timed out`` (stopped
    at its deadline), or ``stopped`` (the runner itself was stopped)."""

    status: Literal["ok", "failed", "timed out", "stopped"]
    returncode: int | None
    seconds: float
    num_killed: int  # processes of the run still alive after it ended, killed by the clean-up


def become_subreaper() -> bool:
    """Make this process the reaper of its descendants' orphans (Linux's
    ``PR_SET_CHILD_SUBREAPER``), so a run's servers whose parent died stay findable as this
    process's children. False where the platform has no such thing."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return bool(libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)


def _own_children() -> set[int]:
    import psutil

    return {child.pid for child in psutil.Process().children()}


def run_process(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    cwd: Path,
    log_path: Path,
    limit_s: float | None,
    grace_s: float = 20.0,
) -> Finished:
    """Run ``argv`` with its output in ``log_path``, stop it after ``limit_s`` seconds (None: no
    limit), and stop whatever it started (module docstring) before returning."""
    known = _own_children()
    started = time.monotonic()
    status: Literal["ok", "failed", "timed out", "stopped"] = "stopped"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            list(argv), cwd=cwd, env=dict(env), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            proc.wait(timeout=limit_s)
            status = "ok" if proc.returncode == 0 else "failed"
        except subprocess.TimeoutExpired:
            status = "timed out"
        finally:  # also when the runner itself is stopped (SIGTERM turned into SystemExit, ^C)
            num_killed = stop_run(proc, known_children=known, grace_s=grace_s)
    return Finished(
        status=status, returncode=proc.returncode, seconds=time.monotonic() - started, num_killed=num_killed
    )


def stop_run(proc: subprocess.Popen[bytes], *, known_children: set[int], grace_s: float) -> int:
    """Stop the run led by ``proc`` and everything it started; ``known_children``: this process's
    children before the run (the rest, other than ``proc``, are the run's adopted orphans).
    Returns how many of the run's processes were still alive to be killed."""
    import psutil

    def tree(pid: int) -> list[psutil.Process]:
        try:
            return [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    found = tree(proc.pid)[1:] if proc.poll() is None else []
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace_s)
    found += tree(proc.pid)[1:] if proc.poll() is None else []
    for orphan in _own_children() - known_children - {proc.pid}:
        found += tree(orphan)
    groups = {proc.pid}
    for member in found:
        with contextlib.suppress(psutil.NoSuchProcess):
            groups.add(os.getpgid(member.pid))
    groups -= {os.getpgrp(), 0, 1}  # never the runner's own group
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signal.SIGKILL)
    proc.wait()
    alive = {member.pid: member for member in found if member.is_running()}
    # Gone, not just signalled: a killed engine frees its GPU memory as it exits (and an adopted
    # orphan is reaped here).
    _, still = psutil.wait_procs(list(alive.values()), timeout=60)
    for member in still:
        print(f"stage runner: process {member.pid} of the run outlived SIGKILL", file=sys.stderr, flush=True)
    return len(alive)


def write_archive(out: Path, archive: Path) -> None:
    """``out`` as a tar.gz at ``archive`` (written beside it, then moved into place); an archive
    inside ``out`` leaves itself out."""
    archive.parent.mkdir(parents=True, exist_ok=True)
    partial = archive.with_name(archive.name + ".partial")
    skip = {archive.resolve(), partial.resolve()}

    def keep(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
        return None if (out / member.name).resolve() in skip else member

    with tarfile.open(partial, "w:gz") as tar:
        tar.add(out, arcname=".", filter=keep)
    os.replace(partial, archive)


def gpu_label(name: str) -> str | None:
    """The roofline's name (worker/tools/sizing.py's GPUS) for a card as nvidia-smi names it (an
    H100 80GB HBM3 is the SXM part); None for a card it does not know."""
    rules = [
        (("H100", "PCIe"), "H100 PCIe"),
        (("H100",), "H100 SXM"),
        (("H200",), "H200"),
        (("A100", "80GB"), "A100 80GB"),
        (("A100",), "A100 40GB"),
        (("L40S",), "L40S"),
    ]
    return next((label for words, label in rules if all(word in name for word in words)), None)


def _this_gpu() -> str | None:
    if not shutil.which("nvidia-smi"):
        return None
    query = ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"]
    names = subprocess.run(query, capture_output=True, text=True, check=False).stdout.splitlines()
    return gpu_label(names[0]) if names else None


def make_checkpoints(names: set[str], checkpoints: Checkpoints) -> None:
    """The shapes among ``names`` that are not on disk yet (tiny models are built on first use)."""
    for name in sorted(names & set(SHAPES) & set(checkpoints.paths)):
        path = Path(checkpoints.paths[name])
        if checkpoints.paths[name] == TINY.get(name):
            continue
        _, shape, awq = SHAPES[name]
        done = path / ("model.safetensors.index.json" if name == "real" else "config.json")
        if done.is_file():
            continue
        from worker.tools.bench.shapes import make_shape_model, write_random_weights

        print(f"stage runner: making {path} ({shape}{', AWQ' if awq else ''})", flush=True)
        make_shape_model(path, awq=awq, shape=shape)
        if name == "real":
            write_random_weights(path)


def _warm(model: str) -> None:
    """Read a checkpoint's weight files, so the page cache holds them."""
    for path in sorted(Path(model).glob("*.safetensors")) if Path(model).is_dir() else []:
        with open(path, "rb") as weights:
            while weights.read(1 << 24):
                pass


def _tail(path: Path, num_lines: int = 3) -> str:
    lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
    return "\n".join(lines[-num_lines:])


# ------------------------------------------------------------------------------ running
def run_stages(
    stages: Sequence[Stage],
    *,
    out: Path,
    checkpoints: Checkpoints,
    smoke: bool = False,
    archive: Path | None = None,
    time_limit_s: float | None = None,
    margin_s: float = 10.0,
    grace_s: float = 20.0,
    scratch: Path | None = None,
    overrides: Mapping[str, str] | None = None,
    extra: Sequence[str] = (),
    gpu: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run each stage's runs in turn and return what became of each (also ``stage-runs.json``).
    Under ``time_limit_s`` each run is cut ``margin_s`` before its end (time for the archive),
    and a run with less than its ``min_s`` left is skipped. Makes this process the subreaper of
    its runs' orphans: call it from a process of its own."""
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    out.mkdir(parents=True, exist_ok=True)
    become_subreaper()
    named = {name for arg in extra for name in placeholders(arg)} & set(SHAPES)  # --configs '$eagle3:3:1.5:auto'
    make_checkpoints(named.union(*(stage.checkpoints() for stage in stages)), checkpoints)
    records: list[dict[str, Any]] = []
    for stage in stages:
        stage_scratch = Path(tempfile.mkdtemp(prefix=f"bench-{stage.name}-", dir=scratch))
        try:
            for run in stage.runs:
                folder = out / run.label
                cmd = command(
                    stage,
                    run,
                    checkpoints=checkpoints,
                    smoke=smoke,
                    environ=os.environ if environ is None else environ,
                    values={"scratch": str(stage_scratch), "out": str(folder)},
                    overrides=overrides,
                    extra=extra,
                    gpu=gpu,
                )
                record: dict[str, Any] = {"stage": stage.name, "label": run.label, "argv": cmd.argv[1:]}
                record["settings"] = cmd.settings
                records.append(record)
                left = None if deadline is None else deadline - time.monotonic() - margin_s
                if left is not None and left < run.min_s:
                    record["status"] = "skipped"
                    print(f"=== {run.label}: skipped, {left:.0f} s left (it needs {run.min_s})", flush=True)
                    _save(records, out, archive)
                    continue
                folder.mkdir(parents=True, exist_ok=True)
                if run.warm_weights:
                    _warm(cmd.env["MODEL_NAME"])
                print(f"=== {run.label}: {time.strftime('%H:%M:%S')}", flush=True)
                log = out / f"{run.label}.log"
                try:
                    finished = run_process(cmd.argv, env=cmd.env, cwd=ROOT, log_path=log, limit_s=left, grace_s=grace_s)
                    record |= {"status": finished.status, "returncode": finished.returncode}
                    record |= {"seconds": round(finished.seconds, 1), "killed_after": finished.num_killed}
                    print(f"=== {run.label}: {finished.status} (exit {finished.returncode})", flush=True)
                    print(_tail(log), flush=True)
                finally:
                    record.setdefault("status", "stopped")
                    result = folder / run.program.result
                    if run.program.result and result.is_file():
                        shutil.copyfile(result, out / f"{run.label}.json")
                    _save(records, out, archive)
        finally:
            shutil.rmtree(stage_scratch, ignore_errors=True)
    return records


def _save(records: list[dict[str, Any]], out: Path, archive: Path | None) -> None:
    (out / "stage-runs.json").write_text(json.dumps(records, indent=1))
    if archive is not None:
        write_archive(out, archive)


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _setting(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not (key and sep):
        raise argparse.ArgumentTypeError(f"{text!r} is not NAME=VALUE")
    return key, value


def _plugin_missing() -> bool:
    """Whether the worker's vLLM plugin is not installed here: a checkout on PYTHONPATH without its
    package metadata (runpod_vllm_worker.egg-info, ignored by git) runs engines without it."""
    from importlib.metadata import entry_points

    return "runpod_worker" not in {plugin.name for plugin in entry_points(group="vllm.general_plugins")}


def _listing() -> str:
    lines = []
    for stage in STAGES.values():
        needs = ", ".join(sorted("$" + name for name in stage.checkpoints()))
        smoke = stage.no_smoke()
        lines.append(f"{stage.name}: {stage.about}")
        lines.append(
            f"    runs {', '.join(run.label for run in stage.runs)}; {stage.num_gpus} GPU(s); "
            f"checkpoints {needs or 'tiny'}; {'no smoke run: ' + smoke if smoke else 'has a smoke run'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = argv[argv.index("--") + 1 :] if "--" in argv else []
    argv = argv[: argv.index("--")] if "--" in argv else argv
    parser = argparse.ArgumentParser(
        prog="python -m worker bench --stage", description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--stage", action="append", required=True, help="stage names, comma-separated; list: show them")
    parser.add_argument("--smoke", action="store_true", help="tiny models at the bench's smoke sizes (a CPU will do)")
    parser.add_argument("--out", type=Path, default=Path("bench-out/stages"))
    parser.add_argument("--archive", type=Path, help="a tar.gz of --out, rewritten after every run")
    parser.add_argument("--time-limit", type=float, metavar="SECONDS", help="the whole invocation's time")
    parser.add_argument("--models", type=Path, default=Path("/tmp"), help="where the checkpoints' shapes are made")
    parser.add_argument("--scratch", type=Path, help="where each stage's $scratch folder goes (default: the temp dir)")
    parser.add_argument("--set", type=_setting, action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--gpu", help="the card's name for the roofline (default: nvidia-smi's, where known)")
    args = parser.parse_args(argv)
    names = [name for text in args.stage for name in text.split(",") if name]
    if names == ["list"]:
        print(_listing())
        return 0
    unknown = [name for name in names if name not in STAGES]
    if unknown:
        parser.error(f"unknown stage(s) {', '.join(unknown)}; --stage list names them")
    stages = [STAGES[name] for name in names]
    if args.smoke:
        for stage in stages:
            if reason := stage.no_smoke():
                parser.error(f"stage {stage.name} has no smoke run: {reason}")
    if _plugin_missing():
        print(
            "stage runner: WARNING: the worker's vLLM plugin is not installed here: engines run without it", flush=True
        )
    signal.signal(signal.SIGTERM, _exit_on_sigterm)  # the run in flight is stopped, the archive written
    records = run_stages(
        stages,
        out=args.out,
        checkpoints=Checkpoints.tiny() if args.smoke else Checkpoints.shapes(args.models),
        smoke=args.smoke,
        archive=args.archive,
        time_limit_s=args.time_limit,
        scratch=args.scratch,
        overrides=dict(args.set),
        extra=extra,
        gpu=args.gpu or (None if args.smoke else _this_gpu()),
    )
    return 0 if all(record["status"] == "ok" for record in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
