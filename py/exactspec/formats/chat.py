"""Chat prompts: a model's Jinja chat template rendered as transformers renders it, then encoded
so that message text can never become a special token.

Rendering (render_template): `jinja2`'s ImmutableSandboxedEnvironment with transformers'
settings (trim_blocks, lstrip_blocks, the loopcontrols extension; `raise_exception`,
`strftime_now`, `tojson` as transformers defines it: json.dumps, ensure_ascii=False; `dict`,
`namespace`), called with messages, tools, documents, add_generation_prompt and the named special
tokens of tokenizer_config.json (bos_token, eos_token, ...). The output equals transformers'
apply_chat_template(tokenize=False). Without jinja2 (a Pyodide that did not get the wheel) only
the project's own template (SUPPORTED_TEMPLATE) renders, by the equivalent Python below.

Special-token policy (encode_chat_prompt, used by the CLI and the browser): the rendered text is
encoded as one string, as transformers does (add_special_tokens=False), except that a special
token whose characters come from message content is not taken (Tokenizer.encode's
untrusted_spans). Where each message's text lies in the rendering is found by rendering a second
time with the content wrapped in two private-use marker characters that occur nowhere in the
input (inside the content's leading/trailing whitespace, so a template's `| trim` keeps them);
removing the markers must give the real rendering exactly, else the template transforms message
text in a way that cannot be attributed and the request is refused (E_BAD_ARGUMENT). For message
text without special-token strings the ids therefore equal transformers'
apply_chat_template(tokenize=True); a user who types "<|im_end|>" gets ordinary tokens.
"""
from __future__ import annotations

import json
from datetime import datetime

from ..core.errors import E_BAD_ARGUMENT, E_MODEL_LOAD, ExactSpecError

SUPPORTED_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}<|end|>\n"
                      "{% endfor %}{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
ROLES = ("system", "user", "assistant", "tool")
NAMED_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
_compiled: dict = {}
NO_TEMPLATE = ("the model has none (chat_template.jinja, tokenizer_config.json's chat_template, or a GGUF's "
               "tokenizer.chat_template)")


# ---------------------------------------------------------------------------------------------
# Rendering
# ---------------------------------------------------------------------------------------------


def _environment():
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, dict=dict,
                       namespace=jinja2.utils.Namespace)
    return env


def _jinja_available() -> bool:
    try:
        import jinja2  # noqa: F401
    except ImportError:
        return False
    return True


def _compile(template: str):
    if not isinstance(template, str) or not template:
        raise ExactSpecError(E_MODEL_LOAD, f"chat template: {NO_TEMPLATE}")
    compiled = _compiled.get(template)
    if compiled is None:
        import jinja2
        try:
            compiled = _environment().from_string(template)
        except jinja2.TemplateError as e:
            raise ExactSpecError(E_MODEL_LOAD, f"chat template: does not compile: {e}") from None
        if len(_compiled) > 16:
            _compiled.clear()
        _compiled[template] = compiled
    return compiled


def check_template(template: str) -> None:
    """E_MODEL_LOAD unless the template can be rendered here."""
    if _jinja_available():
        _compile(template)
    elif template != SUPPORTED_TEMPLATE:
        raise ExactSpecError(E_MODEL_LOAD, "chat templates other than the project's need jinja2, which is not installed")


def _render_supported(messages, tokens: dict, add_generation_prompt: bool) -> str:
    """SUPPORTED_TEMPLATE in plain Python (identical output; used only without jinja2)."""
    out = [str(tokens.get("bos_token", ""))]
    for m in messages:
        out += [f"<|{m['role']}|>\n", m["content"], "<|end|>\n"]
    if add_generation_prompt:
        out.append("<|assistant|>\n")
    return "".join(out)


def render_template(template: str, messages, tokens: dict | None = None, add_generation_prompt: bool = True,
                    tools=None, documents=None, **kwargs) -> str:
    """transformers' apply_chat_template(tokenize=False) for these messages. tokens: the named
    special tokens as strings (see special_token_strings)."""
    messages = _checked_messages(messages)
    variables = {**(tokens or {}), **kwargs}
    if not _jinja_available():
        check_template(template)
        return _render_supported(messages, variables, add_generation_prompt)
    import jinja2
    try:
        return _compile(template).render(messages=messages, tools=tools, documents=documents,
                                         add_generation_prompt=add_generation_prompt, **variables)
    except jinja2.TemplateError as e:      # raise_exception() in the template, or a bad template
        raise ExactSpecError(E_BAD_ARGUMENT, f"chat template refused the messages: {e}") from None


def render_chat(messages, bos_token: str, add_generation_prompt: bool = True) -> str:
    """The project's own template."""
    return render_template(SUPPORTED_TEMPLATE, messages, {"bos_token": bos_token}, add_generation_prompt)


def special_token_strings(tokenizer_config: dict) -> dict:
    """The named special tokens of tokenizer_config.json as strings (an AddedToken object
    contributes its content), as transformers passes them to the template."""
    out = {}
    for key in NAMED_TOKENS:
        value = tokenizer_config.get(key)
        if isinstance(value, dict):
            value = value.get("content")
        if isinstance(value, str):
            out[key] = value
    return out


def template_of(tokenizer_config: dict) -> str:
    """chat_template as a string, or the "default" one of a list of named templates."""
    template = tokenizer_config.get("chat_template")
    if isinstance(template, list):
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    if not isinstance(template, str):
        raise ExactSpecError(E_MODEL_LOAD, f"chat template: {NO_TEMPLATE}")
    return template


def _checked_messages(messages) -> list[dict]:
    if not isinstance(messages, list) or not messages:
        raise ExactSpecError(E_BAD_ARGUMENT, "chat messages must be a non-empty list")
    out = []
    for m in messages:
        if (not isinstance(m, dict) or set(m) != {"role", "content"} or m["role"] not in ROLES
                or not isinstance(m["content"], str)):
            raise ExactSpecError(E_BAD_ARGUMENT, f"chat messages need exactly a role in {ROLES} and string content")
        out.append({"role": m["role"], "content": m["content"]})
    return out


# ---------------------------------------------------------------------------------------------
# Where message text lies in the rendering
# ---------------------------------------------------------------------------------------------


def _free_markers(texts) -> tuple[str, str]:
    """Two private-use characters (plane 15) that occur in none of texts."""
    used = set("".join(texts))
    free = (chr(c) for c in range(0xF0000, 0xFFFFE) if chr(c) not in used)
    return next(free), next(free)


def _wrap(content: str, open_mark: str, close_mark: str) -> str:
    core = content.strip()
    if not core:
        return content
    lead = content[:len(content) - len(content.lstrip())]
    return lead + open_mark + core + close_mark + content[len(lead) + len(core):]


def _untrusted_spans(marked: str, open_mark: str, close_mark: str) -> tuple[str, list[tuple[int, int]]]:
    """The rendering without markers, and the character ranges that were between them."""
    out, spans, start = [], [], None
    pos = 0
    for ch in marked:
        if ch == open_mark:
            if start is not None:
                return "", []
            start = pos
        elif ch == close_mark:
            if start is None:
                return "", []
            spans.append((start, pos))
            start = None
        else:
            out.append(ch)
            pos += 1
    return ("".join(out), spans) if start is None else ("", [])


def render_with_spans(template: str, messages, tokens: dict, add_generation_prompt: bool = True):
    """(rendered text, untrusted ranges of it holding message text)."""
    messages = _checked_messages(messages)
    rendered = render_template(template, messages, tokens, add_generation_prompt)
    open_mark, close_mark = _free_markers([template, rendered] + [m["content"] for m in messages]
                                          + list(tokens.values()))
    marked_messages = [{"role": m["role"], "content": _wrap(m["content"], open_mark, close_mark)} for m in messages]
    marked = render_template(template, marked_messages, tokens, add_generation_prompt)
    unmarked, spans = _untrusted_spans(marked, open_mark, close_mark)
    if unmarked != rendered:
        raise ExactSpecError(E_BAD_ARGUMENT, "the chat template transforms message text (slices or tests it), so "
                             "message text cannot be told from template text; refused")
    return rendered, spans


def encode_chat_prompt(tokenizer, tokenizer_config: dict, messages, add_generation_prompt: bool = True) -> list[int]:
    """Prompt ids for `messages` under the special-token policy above."""
    rendered, spans = render_with_spans(template_of(tokenizer_config), messages,
                                        special_token_strings(tokenizer_config), add_generation_prompt)
    return tokenizer.encode(rendered, add_special_tokens=False, untrusted_spans=spans)
