"""Every EngineConfig knob is reachable from `chatloom serve`: a flag and a CHATLOOM_ variable, both
through the one Settings object, checked by EngineConfig's own rules before anything loads."""

from __future__ import annotations

import dataclasses

import pytest
from pydantic import ValidationError

from app.cli import build_parser, settings_from_args
from app.settings import Settings
from engine.config import EngineConfig

KNOBS = [f.name for f in dataclasses.fields(EngineConfig) if f.name != "model"]


def _serve_flags() -> set[str]:
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # argparse keeps subparsers here
    return {opt for action in serve._actions for opt in action.option_strings}


def test_every_engine_knob_is_a_setting_and_a_serve_flag():
    flags = _serve_flags()
    for name in KNOBS:
        assert name in Settings.model_fields, f"EngineConfig.{name} has no Settings field"
        assert "--" + name.replace("_", "-") in flags, f"EngineConfig.{name} has no serve flag"


def test_defaults_are_the_engines():
    assert Settings().engine_config("/m") == EngineConfig(model="/m")


def test_flags_reach_the_engine_config():
    argv = ["serve", "--block-size", "64", "--no-enable-prefix-caching", "--cuda-graph-sizes", "1,2,8"]
    argv += ["--hf-overrides", '{"num_hidden_layers": 2}', "--async-scheduling", "--enforce-eager"]
    argv += ["--max-num-batched-tokens", "2048", "--gpu-memory-utilization", "0.5"]
    config = settings_from_args(build_parser().parse_args(argv)).engine_config("/m")
    assert config.block_size == 64 and config.enable_prefix_caching is False
    assert config.cuda_graph_sizes == [1, 2, 8] and config.hf_overrides == {"num_hidden_layers": 2}
    assert config.async_scheduling is True and config.enforce_eager is True
    assert config.max_num_batched_tokens == 2048 and config.gpu_memory_utilization == 0.5
    assert config.enable_chunked_prefill is True  # an unset flag keeps the default


def test_environment_reaches_the_engine_config(monkeypatch):
    monkeypatch.setenv("CHATLOOM_MAX_NUM_BATCHED_TOKENS", "1024")
    monkeypatch.setenv("CHATLOOM_ASYNC_SCHEDULING", "false")
    monkeypatch.setenv("CHATLOOM_CUDA_GRAPH_SIZES", "[4, 16]")
    monkeypatch.setenv("CHATLOOM_HF_OVERRIDES", '{"vocab_size": 512}')
    config = Settings().engine_config("/m")
    assert config.max_num_batched_tokens == 1024 and config.async_scheduling is False
    assert config.cuda_graph_sizes == [4, 16] and config.hf_overrides == {"vocab_size": 512}
    # a flag wins over the variable
    args = build_parser().parse_args(["serve", "--max-num-batched-tokens", "4096"])
    assert settings_from_args(args).engine_config("/m").max_num_batched_tokens == 4096


def test_a_bad_engine_value_names_its_field_before_loading():
    with pytest.raises(ValidationError, match="EngineConfig.block_size must be a power of two"):
        Settings(block_size=48)
    with pytest.raises(ValidationError, match="EngineConfig.gpu_memory_utilization"):
        Settings(gpu_memory_utilization=1.5)


def test_a_bad_hf_overrides_flag_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        build_parser().parse_args(["serve", "--hf-overrides", "[1, 2]"])
    assert info.value.code == 2 and "expected a JSON object" in capsys.readouterr().err


def test_build_engine_hands_the_whole_config_to_the_engine(monkeypatch):
    import engine
    from app.main import build_engine

    seen = []
    monkeypatch.setattr(engine, "AsyncEngine", lambda config: seen.append(config) or "engine", raising=False)
    settings = Settings(model="/models/x", block_size=8, launch_ahead=False, num_threads=1)
    assert build_engine(settings) == "engine"
    assert seen == [settings.engine_config("/models/x")] and seen[0].block_size == 8
