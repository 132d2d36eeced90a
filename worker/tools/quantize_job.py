"""AWQ 4-bit quantization with llm-compressor; runs inside .venv-quant, not the serving env.

    .venv-quant/bin/python worker/tools/quantize_job.py --model SRC --out DST --calibration FILE.json

Writes a compressed-tensors W4A16 checkpoint (4-bit weights, group size 128, asymmetric: AWQ's
scheme) that vLLM serves with ``QUANTIZATION`` unset (read from the checkpoint). Standard library
and llm-compressor only: this file must not import the worker package.
"""

import argparse
import json
import shutil
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--calibration", required=True, help="JSON list of calibration texts")
    parser.add_argument("--group-size", type=int, default=128)
    parser.add_argument("--max-seq-length", type=int, default=256)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        # llm-compressor pins its cached activations for fast host-to-GPU copies; without an
        # accelerator pinning is impossible and pointless, so it becomes a no-op.
        torch.Tensor.pin_memory = lambda self, *args, **kwargs: self  # type: ignore[method-assign]
    from datasets import Dataset
    from llmcompressor import oneshot
    from llmcompressor.modifiers.awq import AWQModifier
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    texts = json.loads(Path(args.calibration).read_text())
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype="auto")
    dataset = Dataset.from_dict({"text": texts}).map(
        lambda row: tokenizer(row["text"], truncation=True, max_length=args.max_seq_length, add_special_tokens=False),
        remove_columns=["text"],
    )
    recipe = [AWQModifier(ignore=["lm_head"], scheme="W4A16_ASYM", targets=["Linear"])]
    oneshot(
        model=model,
        dataset=dataset,
        recipe=recipe,
        max_seq_length=args.max_seq_length,
        num_calibration_samples=len(texts),
    )
    # The source's generation config is copied as it is, after the save: transformers refuses to
    # save one that sets a temperature with do_sample false (how a greedy default is written, and
    # what vLLM reads as the model's default sampling parameters), so the save gets the model's plain one.
    model.generation_config = GenerationConfig.from_model_config(model.config)
    model.save_pretrained(args.out, save_compressed=True)
    tokenizer.save_pretrained(args.out)
    source_generation_config = Path(args.model) / "generation_config.json"
    if source_generation_config.is_file():
        shutil.copyfile(source_generation_config, Path(args.out) / "generation_config.json")
    print(json.dumps({"out": args.out}))


if __name__ == "__main__":
    main()
