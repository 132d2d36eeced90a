"""What the tiny models learn: the embedded corpus (short lines, chat pairs, a little JSON and
hermes tool calls, so that structured output from them closes), their special tokens and chat
template."""

from __future__ import annotations

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "calibration_texts", "corpus"]

SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)

CORPUS_LINES = [
    "The worker streams tokens from the engine to the user as soon as they are ready.",
    "A GPU reads every weight once for each decode step, so memory bandwidth sets the pace.",
    "Quantized weights are smaller, so each step reads fewer bytes and runs faster.",
    "Speculative decoding lets a small draft model guess the next tokens.",
    "The target model checks the guesses in one step and keeps the ones it agrees with.",
    "When the draft is good, many tokens are accepted and the user waits less.",
    "When the draft is poor, few tokens are accepted and the work is wasted.",
    "Continuous batching lets many requests share one engine at the same time.",
    "The paged cache stores keys and values in blocks, like pages of memory.",
    "Prefix caching reuses the work done for a prompt that was seen before.",
    "Serverless workers wake up when jobs arrive and sleep when the queue is empty.",
    "A pod runs all day and serves steady traffic at a fixed price per hour.",
    "The cheapest token is the one computed on a busy GPU with small weights.",
    "Every request ends with a result or a clear error, and nothing is lost.",
    "The quick brown fox jumps over the lazy dog near the river bank.",
    "Once upon a time, a small model learned to write short and simple sentences.",
    "It read the same story many times, and then it could tell the story again.",
    "The sun rose over the hills, and the birds began to sing in the trees.",
    "She opened the door, looked at the sky, and walked down to the sea.",
    "He counted one, two, three, four, five, six, seven, eight, nine, ten.",
]
CHAT_PAIRS = [
    ("What is speculative decoding?", CORPUS_LINES[3] + " " + CORPUS_LINES[4]),
    ("Why is decode slow?", CORPUS_LINES[1]),
    ("Tell me a story.", CORPUS_LINES[15] + " " + CORPUS_LINES[16]),
    ("Count to ten.", CORPUS_LINES[19]),
    # A little JSON, so that structured output from the tiny model is short and closes. Written
    # as vLLM 0.32's xgrammar backend writes compact JSON: no whitespace but one space after each
    # comma (xgrammar 0.2.8 forces it), so that the model's likeliest separator is an allowed one.
    ("Reply in JSON.", '{"answer":"yes", "ok":true}'),
    ("Answer in JSON: is the draft good?", '{"answer":"no", "ok":false}'),
    ("Give me JSON.", '{"answer":"done", "ok":true}'),
    # Tool calls in the hermes format (the worker's default parser), so that a forced tool call
    # of the tiny model closes; the arguments in the same style as the JSON above.
    *(
        (
            question,
            f'<tool_call>\n{{"name": "get_weather", "arguments": {{"city":"{city}", "days":{days}}}}}\n</tool_call>',
        )
        for question, city, days in (
            ("What is the weather in Paris?", "Paris", 1),
            ("Weather in Oslo for 3 days?", "Oslo", 3),
            ("Will it rain in Rome this week?", "Rome", 7),
        )
    ),
]


def corpus() -> list[str]:
    texts = list(CORPUS_LINES)
    # Paragraphs of consecutive lines teach the model to continue from one line into the next.
    for start in range(0, len(CORPUS_LINES), 3):
        texts.append(" ".join(CORPUS_LINES[start : start + 4]))
    for question, answer in CHAT_PAIRS:
        texts.append(f"<|user|>\n{question}<|end|>\n<|assistant|>\n{answer}<|end|>\n")
    return texts


def calibration_texts() -> list[str]:
    """Texts of the training corpus, for quantization calibration."""
    return corpus()
