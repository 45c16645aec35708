"""Tool-call dialects: how a model family writes its calls, detected from its chat template.

    hermes       <tool_call>\\n{"name": "f", "arguments": {...}}\\n</tool_call>   (Qwen, Hermes)
                 parallel calls follow each other, separated by "\\n"
    llama3_json  {"name": "f", "parameters": {...}}                                 (Llama 3.x)
                 the whole reply is the call; parallel calls separated by "; "
    mistral      [TOOL_CALLS][{"name": "f", "arguments": {...}}, {...}]             (Mistral v3, tekken)
    generic      the hermes form, for templates that know no tools: chatloom writes the tools and the
                 call format into the system prompt, and the markers are ordinary text

A marker (`<tool_call>`, `[TOOL_CALLS]`) is one special token where the vocabulary has it, else text
spelled by several ordinary tokens; the grammar and the budget handle both (tools.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from grammar.errors import GrammarInputError


@dataclass(frozen=True)
class Dialect:
    name: str
    open: str  # text before the first call ("" for a bare JSON call)
    close: str  # text after each call ("" when nothing closes it)
    args_key: str  # "arguments" | "parameters"
    sep: str  # between parallel calls (after `close`, before the next `open`)
    list_form: bool = False  # all calls in one JSON list after `open` (sep is the list's separator)
    in_prompt: bool = False  # the tools and the format are written into the system prompt by chatloom
    call_id_length: int = 24  # random characters of a call id (Mistral's templates demand 9)

    @property
    def repeat_open(self) -> bool:
        """Whether every parallel call repeats the opening marker."""
        return not self.list_form and bool(self.open)


HERMES = Dialect("hermes", "<tool_call>\n", "\n</tool_call>", "arguments", "\n")
LLAMA3_JSON = Dialect("llama3_json", "", "", "parameters", "; ")
MISTRAL = Dialect("mistral", "[TOOL_CALLS]", "", "arguments", ", ", list_form=True, call_id_length=9)
GENERIC = Dialect("generic", "<tool_call>\n", "\n</tool_call>", "arguments", "\n", in_prompt=True)

DIALECTS = {d.name: d for d in (HERMES, LLAMA3_JSON, MISTRAL, GENERIC)}


def template_source(tokenizer) -> str | None:
    """The chat template text of an HF tokenizer (the tool-use one where a checkpoint has several)."""
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):
        return template.get("tool_use") or template.get("default")
    return template or None


def detect(template: str | None) -> Dialect:
    """The dialect a chat template writes calls in; generic when the template ignores tools."""
    if not template or "tools" not in template:
        return GENERIC
    if "[TOOL_CALLS]" in template:
        return MISTRAL
    if "<tool_call>" in template:
        return HERMES
    if "<|python_tag|>" in template or "ipython" in template or '"parameters"' in template:
        return LLAMA3_JSON
    return GENERIC


def resolve(name: str | None, template: str | None) -> Dialect:
    """An explicit dialect name (`--tool-call-format`) or the one the template implies ("auto"/None)."""
    if name in (None, "", "auto"):
        return detect(template)
    try:
        return DIALECTS[name]
    except KeyError:
        known = ", ".join(["auto", *DIALECTS])
        raise GrammarInputError(f"tool_call_format: unknown dialect {name!r}; known: {known}") from None


def dialect_for(tokenizer, name: str | None = None) -> Dialect:
    """The dialect of a served model: `name`, else the choice the server attached to its tokenizer
    (`tokenizer.tool_call_format`, from `--tool-call-format`), else its template's."""
    return resolve(name or getattr(tokenizer, "tool_call_format", None), template_source(tokenizer))
