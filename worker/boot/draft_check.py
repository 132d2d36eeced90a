"""Boot-time check that a draft model can draft for a target (vLLM does not check this).

A draft proposes token ids that the target verifies, so both must map ids to the same
strings: the same vocabulary and the same special tokens. A different model family is
allowed (a warning): it only lowers acceptance.
"""

from __future__ import annotations

import logging
from typing import Any

from worker.errors import IncompatibleDraft

__all__ = ["check_draft_compatible"]

log = logging.getLogger(__name__)


def _load(name: str, *, revision: str | None, trust_remote_code: bool) -> tuple[Any, Any]:
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)
    tokenizer = AutoTokenizer.from_pretrained(name, revision=revision, trust_remote_code=trust_remote_code)
    return config, tokenizer


def _special_tokens(tokenizer: Any) -> dict[str, Any]:
    named = {key: getattr(tokenizer, key, None) for key in ("bos_token", "eos_token", "unk_token", "pad_token")}
    named["all_special_tokens"] = sorted(tokenizer.all_special_tokens)
    return named


def check_draft_compatible(
    *,
    target: str,
    draft: str,
    target_label: str | None = None,
    draft_label: str | None = None,
    target_revision: str | None = None,
    draft_revision: str | None = None,
    trust_remote_code: bool = False,
) -> list[str]:
    """Raise :class:`IncompatibleDraft` naming both models, or return warnings."""
    target_label = target_label or target
    draft_label = draft_label or draft
    try:
        target_config, target_tok = _load(target, revision=target_revision, trust_remote_code=trust_remote_code)
        draft_config, draft_tok = _load(draft, revision=draft_revision, trust_remote_code=trust_remote_code)
    except (OSError, ValueError) as exc:
        raise IncompatibleDraft(f"cannot compare draft {draft_label!r} with target {target_label!r}: {exc}") from None

    problems = []
    target_vocab, draft_vocab = target_tok.get_vocab(), draft_tok.get_vocab()
    if target_vocab != draft_vocab:
        differing = sum(1 for tok, idx in draft_vocab.items() if target_vocab.get(tok) != idx)
        problems.append(
            f"tokenizer vocabularies differ ({len(target_vocab)} vs {len(draft_vocab)} tokens, "
            f"{differing} draft tokens map to other ids)"
        )
    target_special, draft_special = _special_tokens(target_tok), _special_tokens(draft_tok)
    if target_special != draft_special:
        keys = [k for k in target_special if target_special[k] != draft_special[k]]
        problems.append(f"special tokens differ ({', '.join(keys)})")
    target_size = getattr(target_config, "vocab_size", None)
    draft_size = getattr(draft_config, "vocab_size", None)
    if target_size != draft_size:
        problems.append(f"embedding sizes differ (vocab_size {target_size} vs {draft_size})")
    if problems:
        raise IncompatibleDraft(
            f"draft model {draft_label!r} cannot draft for target {target_label!r}: " + "; ".join(problems)
        )

    warnings = []
    target_type = getattr(target_config, "model_type", None)
    draft_type = getattr(draft_config, "model_type", None)
    if target_type != draft_type:
        warnings.append(
            f"draft {draft_label!r} ({draft_type}) is of another model family than target "
            f"{target_label!r} ({target_type}); acceptance may be low"
        )
    for warning in warnings:
        log.warning(warning)
    return warnings
