"""The GPU smoke of a vLLM release: the serverless job and the pod, through their real entry points.

    python3 scripts/gpu_smoke.py OUTDIR [STEP ...]     # steps: ngram-auto draft-auto pod (default: all)

Each step boots the worker on the Llama-3-8B shape with dummy weights (``MODEL_NAME``, default
/tmp/llama8b; the draft ``DRAFT_MODEL``, default /tmp/llama8b-1b: ``python -m worker bench
--make-llama8b``) and sends real requests:

- ``ngram-auto``, ``draft-auto``: RunPod's local API (``handler.py --rp_serve_api``) with n-gram, or
  a 1B-shaped draft model, under ``SPECULATION_CONTROL=auto``: a streamed job, then a job whose stop
  string is a word of the first job's text (vLLM ends it, not the engine core: the worker's exact
  stats must still come back), then a job at temperature 0.8. Where the RunPod SDK is not
  importable (the GPU host's vLLM carry holds none), the same jobs go through ``handler.handler``
  in a process of their own, as ``handler.py --test_input`` runs them;
- ``pod``: ``python -m worker serve`` with n-gram: a chat completion, a streamed one, a named tool
  call and ``/plan`` (a target directory without a chat template gets a plain one).

Every answer is written to OUTDIR/STEP.json and each check printed as ``ok``/``FAIL`` on one line;
the exit status is the number of failed checks. The servers' logs go to OUTDIR/STEP.log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

TARGET = os.environ.get("MODEL_NAME", "/tmp/llama8b")
DRAFT = os.environ.get("DRAFT_MODEL", "/tmp/llama8b-1b")
BASE = {"MODEL_NAME": TARGET, "LOAD_FORMAT": os.environ.get("LOAD_FORMAT", "dummy"), "HF_HUB_OFFLINE": "1"}
STEPS: dict[str, dict[str, str]] = {
    "ngram-auto": {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4", "SPECULATION_CONTROL": "auto"},
    "draft-auto": {"SPECULATIVE_MODEL": DRAFT, "NUM_SPECULATIVE_TOKENS": "3", "SPECULATION_CONTROL": "auto"},
    "pod": {"SPECULATIVE_METHOD": "ngram", "NUM_SPECULATIVE_TOKENS": "4", "API_KEY": "secret"},
}
FAILED: list[str] = []
# The bench's Llama shapes (`--make-llama8b`) have a word-level tokenizer and no chat template, which
# vLLM's chat route refuses (400); the pod step gives such a target this one.
PLAIN_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)


def has_chat_template(model: str) -> bool:
    """Whether a local model directory names a chat template (a Hub name: assumed to)."""
    directory = Path(model)
    if not directory.is_dir():
        return True
    if (directory / "chat_template.jinja").exists():
        return True
    config = directory / "tokenizer_config.json"
    return config.exists() and bool(json.loads(config.read_text()).get("chat_template"))


def spells_json(model: str) -> bool:
    """Whether the target's tokenizer can write a tool call's JSON. The bench's Llama shapes have a
    word-level vocabulary (``w0`` ... ``wN``) with no ``{`` or ``"``: a named tool call's grammar
    rejects every token there and vLLM ends the request with a 500 (0.32 on the CPU, the 1B shape),
    which says nothing of the pod. (On 0.34 a real model's named call failed too, where vLLM could not
    import lm-format-enforcer: main() says so up front.)"""
    tokenizer = Path(model) / "tokenizer.json"
    if not tokenizer.exists():
        return True
    model_type: object = json.loads(tokenizer.read_text()).get("model", {}).get("type")
    return model_type != "WordLevel"


def check(name: str, ok: bool, detail: object = "") -> None:
    print(f"{'ok  ' if ok else 'FAIL'} {name} {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def post(url: str, body: dict[str, Any], *, timeout: float = 600, stream: bool = False) -> Any:
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": "Bearer secret"},
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read().decode()
    except urllib.error.HTTPError as error:  # the server's own words, not only its status
        raise RuntimeError(f"HTTP {error.code} from {url}: {error.read().decode(errors='replace')[:300]}") from None
    if stream:
        return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    return json.loads(raw)


def get(url: str) -> tuple[int, Any]:
    request = urllib.request.Request(url, headers={"Authorization": "Bearer secret"})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            body = response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, None
    try:
        return response.status, json.loads(body or "null")
    except json.JSONDecodeError:  # a page, not an answer (the SDK's /docs)
        return response.status, body


def wait_until(predicate: Any, *, deadline_s: float) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if predicate():
                return True
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    return False


def final_item(output: list[dict[str, Any]]) -> dict[str, Any]:
    return next((item for item in reversed(output) if "spec_decode" in item or "error" in item), output[-1])


def serverless(step: str, out: Path) -> dict[str, Any]:
    if importlib.util.find_spec("runpod") is None:
        return serverless_in_process(step, out)
    port = 8001
    url = f"http://127.0.0.1:{port}/runsync"
    with start([sys.executable, "handler.py", "--rp_serve_api", "--rp_api_port", str(port)], step, out) as proc:
        if not wait_until(lambda: get(f"http://127.0.0.1:{port}/docs")[0] == 200, deadline_s=60):
            check(f"{step}: local API up", False)
            return {}
        record = jobs(step, lambda job: post(url, {"input": job}))
        record["exit"] = proc.poll()
    return record


def serverless_in_process(step: str, out: Path) -> dict[str, Any]:
    """Where the RunPod SDK is not importable (the GPU host's vLLM carry holds no SDK): the same jobs
    through ``handler.handler`` in a process of the step's own, the path ``handler.py --test_input``
    takes; what the SDK adds (its HTTP layer, the job queue) is the CPU tests' to check."""
    print(f"{step}: the RunPod SDK is not importable here: jobs through handler.handler in-process", flush=True)
    result = out / f"{step}.checks.json"
    with start([sys.executable, __file__, "--in-process", step, str(result)], step, out) as proc:
        proc.wait(timeout=900)
    if not result.exists():
        check(f"{step}: in-process jobs", False, f"exit {proc.returncode}, no result (its log: {step}.log)")
        return {}
    outcome = json.loads(result.read_text())
    for name, ok, detail in outcome["checks"]:
        check(name, ok, detail)
    return dict(outcome["record"])


def in_process(step: str, result: Path) -> int:
    """The child of :func:`serverless_in_process`: one engine, the step's jobs, the checks to ``result``."""
    import asyncio

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    import handler
    from worker.config import local_run_environment

    os.environ.update(local_run_environment(is_verbose=True))
    loop = asyncio.new_event_loop()

    def send(job: dict[str, Any]) -> dict[str, Any]:
        async def collect() -> list[Any]:
            return [item async for item in handler.handler({"id": "smoke", "input": job})]

        return {"output": loop.run_until_complete(collect())}

    checks: list[tuple[str, bool, str]] = []
    record = jobs(step, send, check_=lambda name, ok, detail: checks.append((name, ok, str(detail))))
    result.write_text(json.dumps({"checks": checks, "record": record}, indent=1))
    handler._worker.holder.shutdown()
    return 0


def jobs(
    step: str, send: Callable[[dict[str, Any]], Any], *, check_: Callable[[str, bool, Any], None] = check
) -> dict[str, Any]:
    """A streamed job with its exact stats, a stop string taken from its text, and a sampled job."""
    record: dict[str, Any] = {}
    started = time.monotonic()
    job = {"prompt": "Once upon a time", "sampling_params": {"max_tokens": 128, "temperature": 0}}
    first = send(job)
    record["boot_and_first_job_s"] = round(time.monotonic() - started, 1)
    record["first"] = first
    items = first.get("output", [])
    last = final_item(items)
    text = "".join(item.get("text", "") for item in items if isinstance(item, dict))
    stats = last.get("spec_decode") or {}
    check_(f"{step}: streamed job", bool(text) and "error" not in last, f"{len(items)} items")
    check_(
        f"{step}: exact stats",
        bool(stats) and stats.get("num_draft_tokens", 0) > 0,
        json.dumps(stats)[:300],
    )
    check_(f"{step}: served", "served" in last, json.dumps(last.get("served"))[:400])
    words = text.split()
    stop = words[len(words) // 2] if len(words) > 4 else None
    if stop:
        stopped = send({**job, "sampling_params": {"max_tokens": 128, "temperature": 0, "stop": [stop]}})
        record["stop"] = stopped
        last = final_item(stopped.get("output", []))
        stats = last.get("spec_decode") or {}
        check_(
            f"{step}: stop string {stop!r}",
            last.get("finish_reason") == "stop" and bool(stats),
            json.dumps({"finish_reason": last.get("finish_reason"), "spec_decode": stats})[:300],
        )
    sampled = send({**job, "sampling_params": {"max_tokens": 64, "temperature": 0.8}})
    record["sampled"] = sampled
    last = final_item(sampled.get("output", []))
    check_(f"{step}: temperature 0.8", "error" not in last, json.dumps(last.get("spec_decode"))[:200])
    return record


def pod(step: str, out: Path) -> dict[str, Any]:
    port = 8000
    base = f"http://127.0.0.1:{port}"
    record: dict[str, Any] = {}
    extra = {} if has_chat_template(TARGET) else {"CHAT_TEMPLATE": PLAIN_CHAT_TEMPLATE}
    with start([sys.executable, "-m", "worker", "serve", "--port", str(port)], step, out, env=extra):
        started = time.monotonic()
        if not wait_until(lambda: get(f"{base}/health")[0] == 200, deadline_s=400):
            check(f"{step}: healthy", False)
            return record
        record["boot_s"] = round(time.monotonic() - started, 1)
        model = get(f"{base}/v1/models")[1]["data"][0]["id"]
        messages = [{"role": "user", "content": "Tell me a story."}]
        chat = post(f"{base}/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": 40})
        record["chat"] = chat
        check(f"{step}: chat", bool(chat["choices"][0]["message"]["content"]), chat.get("metrics"))
        chunks = post(
            f"{base}/v1/chat/completions",
            {"model": model, "messages": messages, "max_tokens": 40, "stream": True},
            stream=True,
        )
        record["stream"] = chunks
        check(f"{step}: streaming", len(chunks) > 2, f"{len(chunks)} chunks")
        if not spells_json(TARGET):
            reason = "the target's word-level tokenizer cannot write JSON; set MODEL_NAME to a real model"
            print(f"skip {step}: tool call ({reason})", flush=True)
        else:
            tool = {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
                    # vLLM 0.34 holds a call's arguments to its schema only for a strict tool (OpenAI's
                    # semantics; its --tool-strict-level): without it a named call's envelope is forced
                    # and its arguments may be any JSON (SmolLM2 gave '"gaben"').
                    "strict": True,
                },
            }
            body = {
                "model": model,
                "messages": [{"role": "user", "content": "Weather in Paris?"}],
                "tools": [tool],
                "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
                "max_tokens": 60,
            }
            try:
                called = post(f"{base}/v1/chat/completions", body)
            except RuntimeError as error:  # the server's answer: a failed check, and /plan still runs
                record["tool"] = str(error)
                check(f"{step}: tool call", False, error)
            else:
                record["tool"] = called
                calls = called["choices"][0]["message"].get("tool_calls") or []
                check(f"{step}: tool call", bool(calls) and calls[0]["function"]["name"] == "get_weather", calls[:1])
                check(f"{step}: the call's arguments follow the schema", bool(calls) and _has_city(calls[0]), calls[:1])
        status, plan = get(f"{base}/plan")
        record["plan"] = plan
        check(f"{step}: /plan", status == 200 and bool(plan), json.dumps(plan)[:400])
    return record


def _has_city(call: dict[str, Any]) -> bool:
    """Whether a tool call's arguments are the schema's object: {"city": a string}."""
    try:
        arguments = json.loads(call["function"]["arguments"])
    except (KeyError, TypeError, ValueError):
        return False
    return isinstance(arguments, dict) and isinstance(arguments.get("city"), str)


class start:
    """A server process in its own session, its log in OUTDIR/STEP.log, ended with SIGTERM."""

    def __init__(self, argv: list[str], step: str, out: Path, *, env: dict[str, str] | None = None) -> None:
        self.argv, self.step, self.out, self.env = argv, step, out, env or {}

    def __enter__(self) -> subprocess.Popen[bytes]:
        env = {**os.environ, **BASE, **STEPS[self.step], **self.env}
        self.log = (self.out / f"{self.step}.log").open("wb")
        self.proc = subprocess.Popen(
            self.argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True
        )
        return self.proc

    def __exit__(self, *exc: object) -> None:
        # A group whose processes have all exited (an in-process step that ended) has none left to signal.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


def main() -> int:
    if sys.argv[1] == "--in-process":
        return in_process(sys.argv[2], Path(sys.argv[3]))
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    # vLLM 0.34 imports lm-format-enforcer to validate every structured-output request (a tool call
    # among them): vLLM pins it and its image has it, the GPU carry does not.
    if importlib.util.find_spec("lmformatenforcer") is None:
        print(
            "note: no lm-format-enforcer here (vLLM's pin): on vLLM 0.34 the pod's tool call fails with "
            "ModuleNotFoundError; carry lm-format-enforcer and interegular (scripts/unpack_wheels.py)",
            flush=True,
        )
    for step in sys.argv[2:] or list(STEPS):
        print(f"=== {step}: {time.strftime('%T')}", flush=True)
        try:
            record = pod(step, out) if step == "pod" else serverless(step, out)
        except Exception as error:  # a smoke reports every step, whatever one of them raised
            check(f"{step}: ran", False, f"{type(error).__name__}: {error}")
            record = {"error": f"{type(error).__name__}: {error}"}
        (out / f"{step}.json").write_text(json.dumps(record, indent=1))
    print(f"=== {len(FAILED)} failed: {FAILED}")
    return len(FAILED)


if __name__ == "__main__":
    sys.exit(main())
