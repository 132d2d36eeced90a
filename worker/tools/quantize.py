"""``python -m worker quantize``: a Hugging Face checkpoint to a 4-bit AWQ checkpoint vLLM serves.

The work runs in its own environment (``.venv-quant``, from ``requirements-quant.txt``), because
llm-compressor pins ``transformers``/``compressed-tensors`` versions that conflict with vLLM's.
AutoAWQ, the older tool, is archived upstream and pins a ``transformers`` and ``torch`` too old
to install beside torch 2.13; llm-compressor's ``AWQModifier`` is its maintained successor and
writes compressed-tensors, which vLLM loads with its AWQ-equivalent W4A16 kernels.

    python -m worker quantize --model tiny:target --out ./tiny-awq    # the embedded tiny model
    python -m worker quantize --model /path/to/hf-model --out ./model-awq --calibration texts.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from worker.config import TINY_PREFIX, load_settings

__all__ = ["checkpoint_bytes", "linear_bytes", "main", "tensor_bytes"]

ROOT = Path(__file__).resolve().parents[2]  # the repository
QUANT_ENV = ROOT / ".venv-quant"


def checkpoint_bytes(path: Path) -> int:
    """Bytes of the weight files of a checkpoint."""
    return sum(f.stat().st_size for f in Path(path).glob("*.safetensors"))


def tensor_bytes(path: Path) -> dict[str, int]:
    """Bytes of every tensor in a checkpoint's safetensors files, read from their headers."""
    sizes = {}
    for file in sorted(Path(path).glob("*.safetensors")):
        with open(file, "rb") as fh:
            header_len = int.from_bytes(fh.read(8), "little")
            header = json.loads(fh.read(header_len))
        for name, meta in header.items():
            if name != "__metadata__":
                start, end = meta["data_offsets"]
                sizes[name] = end - start
    return sizes


def linear_bytes(path: Path, *, as_bf16: bool = False) -> int:
    """Bytes of the transformer layers' linear projections (what 4-bit quantization shrinks);
    with ``as_bf16``, what they would take in bf16 (2 bytes per weight, for a float32 source)."""
    total = 0
    for name, size in tensor_bytes(path).items():
        if "_proj." in name:
            total += size // 2 if as_bf16 and name.endswith(".weight") else size
    return total


def ensure_env(python: str = sys.executable) -> Path:
    quant_python = QUANT_ENV / "bin" / "python"
    stamp = QUANT_ENV / ".installed"
    requirements = ROOT / "requirements-quant.txt"
    if stamp.exists() and stamp.read_text() == requirements.read_text():
        return quant_python
    if not quant_python.exists():
        subprocess.run([python, "-m", "venv", str(QUANT_ENV)], check=True)
    # --no-compile: pip would byte-compile every module of every package (torch's thousands among them),
    # most of the install's time; the job imports a small part of them, which Python compiles as it
    # imports them.
    subprocess.run(
        [str(quant_python), "-m", "pip", "install", "-q", "--no-compile", "-r", str(requirements)], check=True
    )
    stamp.write_text(requirements.read_text())
    return quant_python


def _resolve(model: str) -> Path:
    """The checkpoint directory ``model`` names; :class:`ValueError` saying why there is none."""
    if model.startswith(TINY_PREFIX):
        from worker.tiny_models import VARIANTS, ensure_tiny_model

        variant = model.removeprefix(TINY_PREFIX)
        if variant not in VARIANTS:  # checked before the tiny models are built (slow on a first run)
            raise ValueError(f"no embedded tiny model {model!r}; known: {', '.join(TINY_PREFIX + v for v in VARIANTS)}")
        return ensure_tiny_model(load_settings().worker_cache_dir, variant)
    path = Path(model)
    if not path.is_dir():
        raise ValueError(f"no such directory: {model} (give a local checkpoint directory, or tiny:target)")
    if not (path / "config.json").is_file():
        raise ValueError(f"{model} has no config.json: not a Hugging Face checkpoint directory")
    return path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker quantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="local checkpoint directory, or tiny:target")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calibration", type=Path, help="JSON list of calibration texts (default: the tiny corpus)")
    args = parser.parse_args(argv)
    if args.calibration is not None and not args.calibration.is_file():
        parser.error(f"argument --calibration: no such file: {args.calibration}")
    try:
        source = _resolve(args.model)
    except ValueError as exc:
        parser.error(f"argument --model: {exc}")
    try:
        quant_python = ensure_env()
    except subprocess.CalledProcessError as exc:  # pip's own message is above, on stderr
        print(
            f"error: could not build {QUANT_ENV.name} from requirements-quant.txt ({exc.returncode})", file=sys.stderr
        )
        return 1
    with tempfile.TemporaryDirectory(prefix="quantize-") as scratch:
        calibration = args.calibration
        if calibration is None:  # the tiny corpus, written for the job and gone with it
            from worker.tiny_models import calibration_texts

            calibration = Path(scratch) / "calibration.json"
            calibration.write_text(json.dumps(calibration_texts()))
        job = subprocess.run(
            [
                str(quant_python),
                str(ROOT / "worker" / "tools" / "quantize_job.py"),
                "--model",
                str(source),
                "--out",
                str(args.out),
                "--calibration",
                str(calibration),
            ],
            check=False,
        )
    if job.returncode != 0:  # its own traceback is above, on stderr
        print(f"error: the quantization job failed (exit status {job.returncode})", file=sys.stderr)
        return 1
    config = json.loads((source / "config.json").read_text())
    dtype = config.get("torch_dtype") or config.get("dtype")
    linear_before = linear_bytes(source, as_bf16=dtype in ("float32", "fp32"))
    linear_after = linear_bytes(args.out)
    report = {
        "source": str(source),
        "out": str(args.out),
        "checkpoint_bytes_before": checkpoint_bytes(source),
        "checkpoint_bytes_after": checkpoint_bytes(args.out),
        "linear_weight_bytes_before_bf16": linear_before,
        "linear_weight_bytes_after": linear_after,
        "linear_ratio": linear_after / linear_before if linear_before else None,
    }
    print(json.dumps(report, indent=1))
    return 0
