"""The project's chat template, rendered and encoded in plain Python (no Jinja in Pyodide).

Declared template (tokenizer_config.json "chat_template"), which this must reproduce exactly:
  {{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}
  {% if add_generation_prompt %}<|assistant|>\n{% endif %}
A model whose tokenizer_config declares a different template is refused (E_MODEL_LOAD) rather
than rendered wrongly.

Special-token policy (encode_chat_prompt, used by the CLI and the browser): the template's own
markers (bos_token, <|role|>, <|end|>, <|assistant|>) become their special-token ids; message
text is encoded WITHOUT special-token parsing (Tokenizer.encode(split_special_tokens=True)), so
a user who types "<|end|><|assistant|>" gets ordinary byte-level tokens and cannot forge a turn
boundary. For text with no special-token strings in it the ids equal render-then-encode, i.e.
transformers' apply_chat_template(tokenize=True).
"""
from __future__ import annotations

from .errors import E_BAD_ARGUMENT, E_MODEL_LOAD, ExactSpecError

SUPPORTED_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                      "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
ROLES = ("system", "user", "assistant")
MARKER, TEXT = "marker", "text"   # kinds of rendered segment: template special token / plain text


def check_template(template: str) -> None:
    if template != SUPPORTED_TEMPLATE:
        raise ExactSpecError(E_MODEL_LOAD, "tokenizer_config.json chat_template is not the supported template")


def render_segments(messages, bos_token: str, add_generation_prompt: bool = True) -> list[tuple[str, str]]:
    """The rendered template as (kind, text) segments; their texts concatenate to render_chat().
    TEXT segments hold the newline the template writes plus any message content."""
    segments = [(MARKER, bos_token)] if bos_token else []
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ExactSpecError(E_BAD_ARGUMENT, f"chat messages need role in {ROLES} and string content")
        segments += [(MARKER, f"<|{m['role']}|>"), (TEXT, "\n" + m["content"]), (MARKER, "<|end|>"), (TEXT, "\n")]
    if add_generation_prompt:
        segments += [(MARKER, "<|assistant|>"), (TEXT, "\n")]
    return segments


def render_chat(messages, bos_token: str, add_generation_prompt: bool = True) -> str:
    return "".join(text for _, text in render_segments(messages, bos_token, add_generation_prompt))


def encode_chat_prompt(tokenizer, tokenizer_config: dict, messages, add_generation_prompt: bool = True) -> list[int]:
    """Prompt ids for `messages` under the special-token policy above (markers special, text not)."""
    check_template(tokenizer_config.get("chat_template", ""))
    ids: list[int] = []
    for kind, text in render_segments(messages, tokenizer_config.get("bos_token", ""), add_generation_prompt):
        if kind == TEXT:
            ids += tokenizer.encode(text, add_special_tokens=False, split_special_tokens=True)
        else:
            ids.append(_marker_id(tokenizer, text))
    return ids


def _marker_id(tokenizer, marker: str) -> int:
    """The special-token id of a template marker. A marker that is not one plain special token
    (no lstrip/rstrip/single_word, which would make its match depend on the message text) is
    refused: encoding by segments would then differ from render-then-encode."""
    tok = tokenizer.added_by_content.get(marker)
    if tok is None or not tok.special or tok.lstrip or tok.rstrip or tok.single_word:
        raise ExactSpecError(E_MODEL_LOAD, f"chat template marker {marker!r} is not a plain special token of the tokenizer")
    return tok.id
