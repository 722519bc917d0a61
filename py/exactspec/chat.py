"""The project's chat template, rendered in plain Python (no Jinja in Pyodide).

Declared template (tokenizer_config.json "chat_template"), which this must reproduce exactly:
  {{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n{% endfor %}
  {% if add_generation_prompt %}<|assistant|>\n{% endif %}
A model whose tokenizer_config declares a different template is refused (E_MODEL_LOAD) rather
than rendered wrongly.
"""
from __future__ import annotations

from .errors import E_BAD_ARGUMENT, E_MODEL_LOAD, ExactSpecError

SUPPORTED_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                      "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
ROLES = ("system", "user", "assistant")


def check_template(template: str) -> None:
    if template != SUPPORTED_TEMPLATE:
        raise ExactSpecError(E_MODEL_LOAD, "tokenizer_config.json chat_template is not the supported template")


def render_chat(messages, bos_token: str, add_generation_prompt: bool = True) -> str:
    parts = [bos_token]
    for m in messages:
        if not isinstance(m, dict) or m.get("role") not in ROLES or not isinstance(m.get("content"), str):
            raise ExactSpecError(E_BAD_ARGUMENT, f"chat messages need role in {ROLES} and string content")
        parts.append(f"<|{m['role']}|>\n{m['content']}<|end|>\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)
