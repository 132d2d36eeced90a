"""The real-text acceptance set: small, embedded and versioned prompts of the kinds speculation
serves, for ``python -m worker bench --real-text`` (:mod:`.real_text`).

Five kinds, two prompts each: summarize or extract from a given text, rewrite code, answer from a
document, free chat, JSON. The texts are written here, short enough for the embedded models' 1,024
tokens of context with the answer. An answer that copies from its prompt (an edit, an extraction)
is what n-gram drafting can accept; free chat has little to copy. Change a prompt and bump
:data:`REAL_TEXT_VERSION`: the figures of docs/benchmarks.md name the version they were measured on.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KINDS", "REAL_TEXT_VERSION", "TASKS", "RealTextTask"]

REAL_TEXT_VERSION = "v1"
KINDS = ("extract", "code", "document", "chat", "json")


@dataclass(frozen=True, slots=True)
class RealTextTask:
    """One prompt: ``name`` (unique), its ``kind`` (:data:`KINDS`), the user's message, and the most
    tokens its answer may take."""

    name: str
    kind: str
    prompt: str
    max_tokens: int = 96


TASKS = (
    RealTextTask(
        "fix-spelling",
        "extract",
        "Correct the spelling in this text. Write out the whole text with the mistakes fixed:\n\n"
        "Our new office opens on Monday. Pleese bring your badge, becuase the door will be locked, "
        "and remember that parking is on the secnd floor of the garage.",
    ),
    RealTextTask(
        "meeting-details",
        "extract",
        "From this email, extract the date, the time and the room of the meeting.\n\n"
        "Hi team, the quarterly review moves to Thursday 14 March at 10:30 in room B-204. "
        "Please bring your sales figures. Thanks, Dana",
    ),
    RealTextTask(
        "rename-variable",
        "code",
        "Rename the variable x to total in this Python function and write out the whole function:\n\n"
        "def add_prices(prices):\n    x = 0\n    for price in prices:\n        x = x + price\n    return x",
    ),
    RealTextTask(
        "add-docstring",
        "code",
        "Add a docstring to this Python function and write out the whole function:\n\n"
        "def is_even(number):\n    return number % 2 == 0",
    ),
    RealTextTask(
        "eiffel-tower",
        "document",
        "Document:\nThe Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was designed by the "
        "company of Gustave Eiffel and built from 1887 to 1889 for the World's Fair. The tower is 330 metres "
        "tall and was the tallest man-made structure in the world until 1930.\n\n"
        "Question: When was the Eiffel Tower built, and how tall is it?",
    ),
    RealTextTask(
        "library-hours",
        "document",
        "Document:\nThe library is open from 9 am to 6 pm on weekdays and from 10 am to 4 pm on Saturdays. "
        "It is closed on Sundays. Members can borrow up to five books for three weeks.\n\n"
        "Question: How many books can a member borrow, and for how long?",
    ),
    RealTextTask("story", "chat", "Tell me a story."),
    RealTextTask("study-tips", "chat", "What are some tips for staying focused while studying?"),
    RealTextTask(
        "contact-json",
        "json",
        "Write this contact as JSON with the keys name, email and phone:\n\n"
        "Name: Maria Lopez\nEmail: maria.lopez@example.com\nPhone: 555-0142",
    ),
    RealTextTask(
        "shopping-json",
        "json",
        "Convert this shopping list to a JSON array of objects with the keys item and quantity:\n\n"
        "3 apples\n2 loaves of bread\n1 bottle of milk",
    ),
)
