"""Which tokens can complete a stop string: a per-tokenizer table the engine core asks once per
distinct set of stop strings.

vLLM detects stop strings in its frontend, on the text each engine step adds to a request
(``check_stop_strings`` looks for a stop string that *ends* in the step's new text). The engine
core, which does not see that text, must attach the request's spec-decode counts to the output of
the step that completes a stop string, or the request ends without exact counts. Attaching them on
every step is what cost up to 5% of a step at 256 streams; this table lets the core attach them
only on steps that *can* complete one. A step's new text comes from its tokens and from text the
incremental detokenizer held back at the previous step, so a step can complete stop string ``s``
only if one of these holds:

- one of its tokens, decoded alone, contains ``s``, or begins with a non-empty proper suffix of
  ``s`` and the token before it ends with the character before that suffix in ``s`` (where ``s``
  ends inside a token's text, either all of ``s`` lies in that token or the token's text begins
  with the end of ``s`` and the rest precedes it; a space there counts as always present, since
  decoders add spaces a token decoded alone loses);
- one of its tokens decodes alone to an incomplete character (U+FFFD) or is a byte-fallback
  piece (``<0x..>``): characters are assembled from such pieces across tokens, so no single
  piece tells;
- the text before this step ended inside a character (the previous step's, or the prompt's,
  last token that adds text was such a piece): the detokenizer held that text back (it emits
  nothing while the decoded text ends in U+FFFD) and this step releases it, and when the prompt
  was held, vLLM's decode stream releases the prompt's text with it.

Decoders also insert the plain space that a token decoded alone loses (SentencePiece's leading
``▁``, spaces between words or special tokens), so a stop string ending in a space can end on any
step, and U+FFFD stands for bytes assembled anywhere: requests with such stop strings keep a
snapshot on every step (:data:`EVERY`). ``tests/test_stop_triggers.py``
checks the rule against vLLM's own detokenizer on byte-level and SentencePiece-style tokenizers.
Written here because vLLM has no notion of it: it needs counts at a frontend-detected stop only
for this worker's exact per-request stats.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

__all__ = ["EVERY", "Every", "StopTriggers", "TriggerSet", "completing"]

_REPLACEMENT = "\ufffd"
# SentencePiece byte-fallback pieces, as tokenizers' ``ByteFallback`` decoder reads them.
_BYTE_PIECE = re.compile(r"<0x[0-9A-Fa-f]{2}>")
# Bound on the cache of trigger sets (one per distinct tuple of stop strings): a client sending
# a new stop string with every request must not grow the engine core's memory without end.
_MAX_CACHED = 128


class Every:
    """The trigger of a request that needs a snapshot on every step: every step is a trigger."""

    __slots__ = ()

    def isdisjoint(self, _token_ids: Iterable[int]) -> bool:
        return False

    def __repr__(self) -> str:
        return "EVERY"


EVERY: Final = Every()


@dataclasses.dataclass(frozen=True, slots=True, eq=False)
class TriggerSet:
    """The tokens that may complete one of a request's stop strings: ``check`` maps each to None
    when it may after any text (``always``) or to the characters one of which must come before it
    (``needs``: a token that begins with the end of ``"Observation:"``, say ``":"``, completes it
    only after an ``"n"``); ``after`` maps each to None or to the token ids that may come before
    it (those ending with one of those characters, and those whose last character is not known),
    so deciding a hit is set lookups only; ``ids`` its keys as a frozenset, so the engine core's
    per-step test is one C-level ``isdisjoint``; ``known`` the ids ``after`` speaks for (below it)."""

    ids: frozenset[int]
    check: dict[int, frozenset[str] | None]
    after: dict[int, frozenset[int] | None]
    known: int

    @property
    def always(self) -> frozenset[int]:
        return frozenset(token for token, need in self.check.items() if need is None)

    @property
    def needs(self) -> dict[int, frozenset[str]]:
        return {token: need for token, need in self.check.items() if need is not None}


class StopTriggers:
    """The tokens after which a request's stop strings can be complete, from the tokenizer's pieces.

    ``pieces[i]`` is token ``i`` decoded alone, special tokens included; ``vocab_size`` is the
    model's (token ids from ``len(pieces)`` up to it, which the tokenizer cannot decode, count as
    triggers). Building costs a sort of the vocabulary; a query a few bisections and one search
    through the joined pieces, cached per tuple of stop strings.
    """

    def __init__(
        self,
        pieces: Sequence[str],
        *,
        vocab_size: int = 0,
        byte_ids: Iterable[int] = (),
        silent_ids: Iterable[int] = (),
    ) -> None:
        # U+0000 cannot be in a stop string a client sends as JSON text without escaping, and the
        # search below also refuses stop strings holding it.
        self._joined = "\0".join(pieces)
        self._starts = list(_offsets(pieces))
        order = sorted(range(len(pieces)), key=pieces.__getitem__)
        self._sorted_pieces = [pieces[i] for i in order]
        self._sorted_ids = order
        # Tokens after which the detokenizer may hold text back: pieces of a character, byte
        # pieces (a byte-fallback decoder turns even an ASCII byte after a lone lead byte into
        # U+FFFD), and ids the tokenizer cannot decode.
        partial = {i for i, piece in enumerate(pieces) if _REPLACEMENT in piece}
        partial.update(byte_ids)
        partial.update(range(len(pieces), vocab_size))
        self.partial: frozenset[int] = frozenset(partial)
        # Tokens that add no text when special tokens are skipped: they neither hold nor release.
        self.silent: frozenset[int] = frozenset(silent_ids)
        # The character each token's text ends with, where it is sure ("" where it is not: empty,
        # partial or silent pieces, and ids past the pieces up to the model's vocabulary).
        last_char = [
            "" if not piece or i in self.partial or i in self.silent else piece[-1] for i, piece in enumerate(pieces)
        ] + [""] * max(0, vocab_size - len(pieces))
        self._known = len(last_char)
        # Token ids by that character: the ids that may come before a token that needs one of
        # some characters are those ending with one of them and those ending with "".
        self._ending_with: dict[str, list[int]] = {}
        for i, char in enumerate(last_char):
            self._ending_with.setdefault(char, []).append(i)
        self._cache: dict[tuple[str, ...], TriggerSet | Every] = {}
        self._after_cache: dict[frozenset[str], frozenset[int]] = {}

    @classmethod
    def from_tokenizer(cls, backend: Any, *, vocab_size: int = 0) -> StopTriggers:
        """From a ``tokenizers.Tokenizer`` (what vLLM's fast detokenizer decodes with)."""
        size = backend.get_vocab_size(with_added_tokens=True)
        single = [[i] for i in range(size)]
        pieces = backend.decode_batch(single, skip_special_tokens=False)
        skipped = backend.decode_batch(single, skip_special_tokens=True)
        byte_ids = [i for i in range(size) if _BYTE_PIECE.fullmatch(backend.id_to_token(i) or "")]
        silent_ids = [i for i, text in enumerate(skipped) if not text]
        return cls(pieces, vocab_size=vocab_size, byte_ids=byte_ids, silent_ids=silent_ids)

    def ends_inside_character(self, token_ids: Sequence[int]) -> bool | None:
        """Whether text decoded up to the last of ``token_ids`` may be held back (None: they all
        add no text, so the state before them stands)."""
        silent = self.silent
        for token in reversed(token_ids):
            if token not in silent:
                return token in self.partial
        return None

    def for_stops(self, stops: Sequence[str]) -> TriggerSet | Every:
        """The token ids whose presence in a step can complete one of ``stops`` (:data:`EVERY`
        when any step can); :func:`completing` then decides from the token before."""
        key = tuple(stops)
        found = self._cache.get(key)
        if found is None:
            found = self._build(key)
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
                self._after_cache.clear()
            self._cache[key] = found
        return found

    def _build(self, stops: tuple[str, ...]) -> TriggerSet | Every:
        always = set(self.partial)
        needs: dict[int, set[str]] = {}
        for stop in stops:
            if not stop or stop[-1] == " " or "\0" in stop or _REPLACEMENT in stop:
                return EVERY
            always.update(self._containing(stop))
            for q in range(1, len(stop)):
                before = stop[-q - 1]
                for token in self._starting_with(stop[-q:]):
                    if before == " ":  # a decoder may put that space in the token's own text
                        always.add(token)
                    else:
                        needs.setdefault(token, set()).add(before)
        check: dict[int, frozenset[str] | None] = dict.fromkeys(always)
        check.update((token, frozenset(chars)) for token, chars in needs.items() if token not in always)
        after = {token: None if need is None else self._ending_in(need) for token, need in check.items()}
        return TriggerSet(ids=frozenset(check), check=check, after=after, known=self._known)

    def _ending_in(self, chars: frozenset[str]) -> frozenset[int]:
        """The ids whose text ends with one of ``chars`` or whose last character is not known."""
        found = self._after_cache.get(chars)
        if found is None:
            ending = self._ending_with
            found = frozenset(ending.get("", ())).union(*(ending.get(char, ()) for char in chars))
            self._after_cache[chars] = found
        return found

    def _containing(self, text: str) -> Iterable[int]:
        joined, starts = self._joined, self._starts
        position = joined.find(text)
        while position != -1:
            token = bisect.bisect_right(starts, position) - 1
            yield token
            # Next search from the following piece: one hit per token is enough.
            position = joined.find(text, starts[token + 1]) if token + 1 < len(starts) else -1

    def _starting_with(self, prefix: str) -> list[int]:
        low = bisect.bisect_left(self._sorted_pieces, prefix)
        high = bisect.bisect_left(self._sorted_pieces, prefix + "\U0010ffff", low)
        return self._sorted_ids[low:high]


def _offsets(pieces: Sequence[str]) -> Iterable[int]:
    offset = 0
    for piece in pieces:
        yield offset
        offset += len(piece) + 1


def completing(
    hits: Iterable[Any],
    trigger_of: Mapping[str, TriggerSet | Every],
    requests: Mapping[str, Any],
    shared: TriggerSet | None = None,
) -> list[tuple[Any, Any, TriggerSet | Every]]:
    """Of a step's ``hits`` (vLLM's ``EngineCoreOutput`` of requests whose new tokens hit their
    trigger set), those whose step can complete a stop string, with the request (vLLM's
    ``Request``, from ``requests`` by id) and its trigger (``trigger_of``, or ``shared`` when every
    watched request has that one; EVERY: any step can). Skipped: outputs of requests not watched
    or gone, and those with vLLM's own metrics (the final one).

    Runs in the engine core on every step with hits (a quarter of the requests of hard-wrapped
    text under a blank-line stop, all false), so the whole step is one call, a hit's tokens are
    tested with one ``in`` each before anything else is looked up, the token before a trigger is
    tested with one more ``in`` (``TriggerSet.after``), and the token before the step is read only
    when the step's first token needs it (vLLM appends a step's tokens to the request before it
    builds the step's output: checked at both ends, and a mismatch or an id the table does not
    know assumes the step can)."""
    found = []
    for output in hits:
        trigger = shared or trigger_of.get(output.request_id)
        if trigger is None:
            continue
        if trigger is not EVERY:
            ids, after = trigger.ids, trigger.after  # type: ignore[union-attr]  # not EVERY (``is`` does not narrow)
            new = output.new_token_ids
            before = -1  # the token before the current one (-1: before the step, not read yet)
            for token in new:
                if token in ids:
                    may_follow = after[token]
                    if may_follow is None:
                        break
                    if before < 0:
                        request = requests.get(output.request_id)
                        if request is None:
                            break  # gone: dropped below
                        # The list, not vLLM's read-only view of it (whose indexing is a Python call).
                        history = request._output_token_ids
                        start = len(history) - len(new)
                        if start > 0 and history[start] == token and history[-1] == new[-1]:
                            before = history[start - 1]
                        elif start == 0 and request.prompt_token_ids:
                            before = request.prompt_token_ids[-1]
                        else:
                            break
                        if not 0 <= before < trigger.known:  # type: ignore[union-attr]
                            break
                    if before in may_follow:
                        break
                before = token
            else:
                continue  # no token of this step can complete one
        rid = output.request_id
        request = requests.get(rid)
        if request is None or output.spec_decode_metrics is not None or rid not in trigger_of:
            continue
        found.append((output, request, trigger))
    return found
