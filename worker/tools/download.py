"""``python -m worker download``: fetch a model (and a draft) into fixed directories, for image baking.

Used by the Dockerfile at build time: the target lands in ``<dest>/target`` and the draft in
``<dest>/draft``, so that the image can point ``MODEL_NAME``/``SPECULATIVE_MODEL`` there. The
Hugging Face token comes from ``HF_TOKEN`` (a build secret there) and is never written to disk.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["main"]

PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken", "*.py"]


def fetch(repo_id: str, *, target: Path, revision: str | None) -> Path:
    from huggingface_hub import snapshot_download

    snapshot_download(repo_id, revision=revision, local_dir=target, allow_patterns=PATTERNS)
    return target


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker download", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, help="hub id of the target model")
    parser.add_argument("--revision")
    parser.add_argument("--draft", help="hub id of a draft model to bake beside the target")
    parser.add_argument("--dest", type=Path, default=Path("/models"))
    args = parser.parse_args(argv)
    wanted = [(args.model, "target", args.revision)] + ([(args.draft, "draft", None)] if args.draft else [])
    for repo_id, folder, revision in wanted:
        try:
            print(fetch(repo_id, target=args.dest / folder, revision=revision))
        except (OSError, ValueError) as exc:  # the hub's errors: no network, no such repo, a gated one, a bad id
            reason = next((line.strip() for line in str(exc).splitlines() if line.strip()), "")
            print(f"error: cannot download {repo_id}: {type(exc).__name__}: {reason}", file=sys.stderr)
            return 1
    return 0
