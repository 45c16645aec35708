"""GGUF checkpoints: a .gguf file converts once into a cached HF folder that the engine serves with
HF transformers' greedy tokens (transformers reading the same file), in float and quantized types;
the cache is reused and two concurrent resolutions build one intact folder. Then the real embedded
default, SmolLM2-135M-Instruct (Q4_1), against transformers on 16 chat prompts x 32 tokens."""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine import LLM, SamplingParams
from models import gguf as gguf_mod
from models.tiny import TINY_SHAPE

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]  # ids 0, 1, 2 (the trainer puts them first)
EOS_ID = 2
TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] "
    "+ '<|im_end|>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
# the tiny test shape, with an output.weight tensor (the real SmolLM2 covers tied embeddings)
SHAPE = {**TINY_SHAPE, "max_position_embeddings": 512, "rms_norm_eps": 1e-5, "tie_word_embeddings": False}
MAX_NEW = 24
TIE = 1e-4


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "cache"
    monkeypatch.setattr(gguf_mod, "cache_root", lambda: root)
    return root


@pytest.fixture(scope="module")
def module_cache(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gguf_mod, "cache_root", lambda: root)
        yield root


# ---- a tiny Llama written as GGUF the way llama.cpp's converter writes it -------------------------
def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    text = [
        "The capital of France is Paris. What is the weather in Paris today?",
        "Hello world, hello chat! A small model answers in English.",
        "\n  Indented lines, tabs\tand 123 numbers.",
    ] * 20
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=320,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text, trainer)
    vocab = tok.get_vocab()
    tokens = sorted(vocab, key=vocab.get)
    assert tokens[: len(SPECIAL)] == SPECIAL and len(tokens) == max(vocab.values()) + 1
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    return tokens, merges


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's q/k row order: within each head, the two rotary halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(path: Path, model, tokens: list[str], merges: list[str], qtype) -> Path:
    import gguf

    cfg = model.config
    heads, kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("tiny llama")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_vocab_size(cfg.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([3 if t in SPECIAL else 1 for t in tokens])  # 3: control
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(0)
    w.add_add_bos_token(False)
    w.add_chat_template(TEMPLATE)

    names = {"self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up"}
    names.update({"mlp.down_proj": "ffn_down", "self_attn.v_proj": "attn_v"})
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}

    def put(name: str, array: np.ndarray) -> None:
        if array.ndim == 1 or qtype == gguf.GGMLQuantizationType.F32:  # llama.cpp keeps norms in F32
            w.add_tensor(name, np.ascontiguousarray(array, dtype=np.float32))
        else:
            w.add_tensor(name, gguf.quants.quantize(np.ascontiguousarray(array), qtype), raw_dtype=qtype)

    put("token_embd.weight", sd["model.embed_tokens.weight"])
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        put(f"blk.{i}.attn_norm.weight", sd[p + "input_layernorm.weight"])
        put(f"blk.{i}.ffn_norm.weight", sd[p + "post_attention_layernorm.weight"])
        put(f"blk.{i}.attn_q.weight", llama_cpp_permute(sd[p + "self_attn.q_proj.weight"], heads))
        put(f"blk.{i}.attn_k.weight", llama_cpp_permute(sd[p + "self_attn.k_proj.weight"], kv_heads))
        for hf, ours in names.items():
            put(f"blk.{i}.{ours}.weight", sd[p + hf + ".weight"])
    put("output_norm.weight", sd["model.norm.weight"])
    put("output.weight", sd["lm_head.weight"])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens, merges = train_tokenizer()
    config = LlamaConfig(**SHAPE, vocab_size=len(tokens), bos_token_id=1, eos_token_id=EOS_ID, pad_token_id=0)
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).float().eval()
    with torch.no_grad():  # RMSNorm weights away from 1, so a mix-up of norms would show
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.2 * torch.randn_like(p))
    return model, tokens, merges


@pytest.fixture(scope="module", params=["F32", "Q8_0", "Q4_0"])
def tiny_gguf(request, tiny_llama, tmp_path_factory, module_cache) -> tuple[str, Path]:
    import gguf

    model, tokens, merges = tiny_llama
    folder = tmp_path_factory.mktemp(f"gguf-{request.param}")
    qtype = getattr(gguf.GGMLQuantizationType, request.param)
    return request.param, write_gguf(folder / f"tiny-{request.param}.gguf", model, tokens, merges, qtype)


def prompts(seed: int, vocab: int, n: int = 12) -> list[list[int]]:
    rng = random.Random(seed)
    lengths = [1, 2, 15, 16, 17, 40] + [rng.randint(1, 120) for _ in range(n - 6)]
    return [[rng.randint(3, vocab - 1) for _ in range(length)] for length in lengths]


def hf_greedy(model, prompt: list[int], max_new: int, scores: bool = True):
    """transformers' greedy continuation (and its per-step logits), past EOS like ours with ignore_eos:
    its generation config loses the EOS (min_new_tokens would instead forbid EOS, changing the path)."""
    model.generation_config.eos_token_id = None
    threads = torch.get_num_threads()
    # one thread: a batch of one barely gains from two, and loses many times over when the cores are
    # shared with other processes (OpenMP threads spinning against each other)
    torch.set_num_threads(1)
    try:
        out = _generate(model, prompt, max_new, scores)
    finally:
        torch.set_num_threads(threads)
    tokens = out.sequences[0, len(prompt) :].tolist()
    assert len(tokens) == max_new
    return tokens, torch.stack([s[0] for s in out.scores]) if scores else None


def _generate(model, prompt: list[int], max_new: int, scores: bool):
    with torch.no_grad():
        return model.generate(
            torch.tensor([prompt]),
            attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_new,
            do_sample=False,
            output_scores=scores,
            return_dict_in_generate=True,
            pad_token_id=0,
        )


def assert_same_greedy(hf_model, batch: list[list[int]], outputs) -> None:
    """Equal token for token; a divergence is accepted only at a near-tie of HF's two best logits."""
    for prompt, out in zip(batch, outputs, strict=True):
        want, scores = hf_greedy(hf_model, prompt, MAX_NEW)
        for step, (a, b) in enumerate(zip(out.token_ids, want, strict=True)):
            if a != b:
                top2 = scores[step].topk(2).values
                gap = float(top2[0] - top2[1])
                assert gap < TIE, f"diverged at step {step} (prompt length {len(prompt)}), HF gap {gap:.2e}"
                break


GREEDY = SamplingParams(temperature=0.0, max_tokens=MAX_NEW, ignore_eos=True)


def test_tiny_gguf_greedy_equals_transformers(tiny_gguf, tiny_llama):
    """Our engine on the .gguf path equals transformers loading the same file (its own dequantizer
    and q/k un-permutation); for F32 also the original model the file was written from."""
    from transformers import AutoModelForCausalLM

    qtype, path = tiny_gguf
    llm = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=512)
    folder = Path(llm.config.model)
    assert folder.parent == gguf_mod.cache_root() and (folder / gguf_mod.MARKER).is_file()
    vocab = len(tiny_llama[1])
    batch = prompts(seed=1, vocab=vocab)
    outs = llm.generate(batch, GREEDY)
    assert all(len(o.token_ids) == MAX_NEW for o in outs)
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    assert_same_greedy(hf.eval(), batch, outs)
    if qtype == "F32":
        assert_same_greedy(tiny_llama[0], batch, outs)
        # the stored weights are the original ones, q/k rows back in HF order
        from safetensors.torch import load_file

        stored = load_file(str(folder / "model.safetensors"))
        for name, want in tiny_llama[0].state_dict().items():
            assert torch.equal(stored[name], want), name


def test_converted_folder_carries_tokenizer_template_and_eos(tiny_gguf, tiny_llama):
    from transformers import AutoConfig, AutoTokenizer

    _, path = tiny_gguf
    folder = Path(gguf_mod.resolve_checkpoint(str(path), progress=False))
    config = AutoConfig.from_pretrained(folder)
    assert config.architectures == ["LlamaForCausalLM"] and config.vocab_size == len(tiny_llama[1])
    assert json.loads((folder / "generation_config.json").read_text())["eos_token_id"] == [EOS_ID]
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == SHAPE["max_position_embeddings"]
    question = [{"role": "user", "content": "What is the capital of France?"}]
    text = tok.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    ids = tok.encode(text, add_special_tokens=False)
    assert ids[0] == 1 and EOS_ID in ids and tok.decode(ids) == text  # special tokens stay whole


def test_second_resolve_reuses_the_cache(cache, tiny_llama, tmp_path, monkeypatch):
    import gguf

    model, tokens, merges = tiny_llama
    path = write_gguf(tmp_path / "m.gguf", model, tokens, merges, gguf.GGMLQuantizationType.Q8_0)
    first = gguf_mod.resolve_checkpoint(str(path), progress=False)

    def refuse(*args, **kwargs):
        raise AssertionError("converted again")

    monkeypatch.setattr(gguf_mod, "convert", refuse)
    t0 = time.perf_counter()
    assert gguf_mod.resolve_checkpoint(str(path), progress=False) == first
    assert time.perf_counter() - t0 < 0.5
    # a changed file (new mtime) is a new identity: the stale conversion is not served
    path.touch()
    stat = path.stat()
    import os

    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    with pytest.raises(AssertionError, match="converted again"):
        gguf_mod.resolve_checkpoint(str(path), progress=False)
    assert not list(cache.glob(".*building*")), "a failed build leaves nothing behind"


def test_concurrent_resolutions_build_one_intact_folder(cache, tiny_llama, tmp_path, monkeypatch):
    import gguf

    model, tokens, merges = tiny_llama
    path = write_gguf(tmp_path / "c.gguf", model, tokens, merges, gguf.GGMLQuantizationType.Q4_0)
    real_convert, calls = gguf_mod.convert, []

    def slow_convert(src, folder, progress=True):
        calls.append(folder)
        time.sleep(0.5)  # the other thread arrives while this build is in progress
        return real_convert(src, folder, progress=progress)

    monkeypatch.setattr(gguf_mod, "convert", slow_convert)
    results: list[str] = []
    errors: list[BaseException] = []

    def resolve() -> None:
        try:
            results.append(gguf_mod.resolve_checkpoint(str(path), progress=False))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=resolve) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert len(calls) == 1 and len(set(results)) == 1 and len(results) == 2
    folder = Path(results[0])
    assert sorted(p.name for p in cache.iterdir() if p.is_dir()) == [folder.name]
    llm = LLM(str(path), device="cpu", dtype="float32", num_kv_blocks=64)
    assert llm.config.model == str(folder)
    assert len(llm.generate([[5, 6, 7]], GREEDY)[0].token_ids) == MAX_NEW


def test_missing_gguf_names_the_file(cache):
    with pytest.raises(FileNotFoundError, match="nowhere.gguf"):
        LLM("/nonexistent/nowhere.gguf", device="cpu")


def test_folders_pass_through_unchanged(tmp_path):
    assert gguf_mod.resolve_checkpoint(str(tmp_path)) == str(tmp_path)


# ---- the real embedded default: SmolLM2-135M-Instruct (Q4_1) --------------------------------------
QUESTIONS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "List three primary colors.",
    "What is 12 times 7?",
    "Translate 'good morning' into Spanish.",
    "Give me a tip for sleeping better.",
    "What does a CPU do?",
    "Name a mammal that can fly.",
    "Summarize the plot of Romeo and Juliet in one sentence.",
    "Why is the sky blue?",
    "Suggest a name for a pet goldfish.",
    "What is the boiling point of water in Celsius?",
    "How many days are in a leap year?",
    "Write a Python function that adds two numbers.",
    "What is photosynthesis?",
    "Tell me a short joke.",
]
REAL_NEW = 32


@pytest.fixture(scope="module")
def smollm2(module_cache):
    path = gguf_mod.embedded_gguf()
    if path is None:
        pytest.skip(f"the embedded default model is not installed ({gguf_mod.INSTALL_HINT})")
    threads = torch.get_num_threads()
    # one thread, as for transformers below: where other processes share the cores, two OpenMP threads
    # spinning against them cost several times the wall time of one
    llm = LLM(str(path), device="cpu", dtype="float32", num_threads=1)
    yield path, llm
    torch.set_num_threads(threads)  # the engine set it process-wide


def chat_prompts(tokenizer) -> list[list[int]]:
    out = []
    for q in QUESTIONS:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        out.append(list(ids))
    return out


def test_smollm2_greedy_equals_transformers(smollm2):
    """16 chat prompts x 32 greedy tokens: ours (one batch) equal transformers' (the same GGUF file
    loaded by from_pretrained(gguf_file=...), float32, one prompt at a time), with no tolerance."""
    from transformers import AutoModelForCausalLM

    path, llm = smollm2
    batch = chat_prompts(llm.tokenizer)
    outs = llm.generate(batch, SamplingParams(temperature=0.0, max_tokens=REAL_NEW, ignore_eos=True))
    hf = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    hf.eval()
    for prompt, out, question in zip(batch, outs, QUESTIONS, strict=True):
        want, _ = hf_greedy(hf, prompt, REAL_NEW, scores=False)
        assert out.token_ids == want, f"{question!r}: ours {out.token_ids} HF {want}"


def test_smollm2_knows_the_capital_of_france(smollm2):
    _, llm = smollm2
    ids = chat_prompts(llm.tokenizer)[:1]
    out = llm.generate(ids, SamplingParams(temperature=0.0, max_tokens=32))[0]
    assert "Paris" in out.text, out.text
    assert out.finish_reason == "stop"  # <|im_end|> (the file's EOS) ends the turn
