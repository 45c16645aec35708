"""`chatloom serve`'s app over a tiny random BLOOM (an ALiBi model, models.alibi) that brings no
chat template, as BLOOM's checkpoints do: the prompt is rendered with chatloom's ChatML fallback and the
openai SDK gets chat completions, plain and streamed."""

from __future__ import annotations

import openai
import pytest

from app.chat.template import FALLBACK_TEMPLATE
from app.main import create_app
from app.settings import Settings
from tests.alibi_models import build_alibi_checkpoint
from tests.app.conftest import run_server

pytestmark = pytest.mark.slow  # the server's start takes 30 s on two loaded cores

MSGS = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def bloom_dir(tmp_path_factory):
    return build_alibi_checkpoint(tmp_path_factory.mktemp("bloom-serve"), "bloom")


@pytest.fixture(scope="module")
def bloom_server(bloom_dir, tmp_path_factory):
    settings = Settings(
        model=str(bloom_dir),
        served_model_name="tiny-bloom",
        device="cpu",
        dtype="float32",
        max_model_len=1024,
        num_kv_blocks=256,
        database_url=f"sqlite:///{tmp_path_factory.mktemp('db-bloom') / 'chatloom.db'}",
    )
    yield from run_server(create_app(settings))


@pytest.fixture(scope="module")
def client(bloom_server):
    with openai.OpenAI(
        base_url=bloom_server.base, api_key="none", _strict_response_validation=True, max_retries=0
    ) as sdk:
        yield sdk


def test_bloom_chat_completion_with_the_fallback_template(client, bloom_dir):
    from transformers import AutoTokenizer

    assert not (bloom_dir / "chat_template.jinja").exists()
    assert [m.id for m in client.models.list().data] == ["tiny-bloom"]
    resp = client.chat.completions.create(model="tiny-bloom", messages=MSGS, max_tokens=8, temperature=0)
    choice = resp.choices[0]
    assert choice.finish_reason in ("stop", "length") and isinstance(choice.message.content, str)
    assert 1 <= resp.usage.completion_tokens <= 8
    tok = AutoTokenizer.from_pretrained(bloom_dir)
    text = tok.apply_chat_template(MSGS, chat_template=FALLBACK_TEMPLATE, add_generation_prompt=True,
                                   tokenize=False)  # fmt: skip
    assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")
    assert resp.usage.prompt_tokens == len(tok.encode(text, add_special_tokens=False))
    again = client.chat.completions.create(model="tiny-bloom", messages=MSGS, max_tokens=8, temperature=0)
    assert again.choices[0].message.content == choice.message.content  # greedy: the same tokens


def test_bloom_chat_streaming(client):
    usage = {"include_usage": True}
    stream = client.chat.completions.create(
        model="tiny-bloom", messages=MSGS, max_tokens=6, stream=True, stream_options=usage
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices == [] and 1 <= chunks[-1].usage.completion_tokens <= 6
