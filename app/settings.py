"""Settings: every server knob in one pydantic-settings object (env prefix CHATLOOM_, CLI flags override)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CHATLOOM_", env_file=None, extra="ignore")

    environment: Literal["development", "production"] = "development"

    # engine
    model: str | None = None  # checkpoint folder or .gguf file; None: the embedded default model
    served_model_name: str | None = None  # None: the folder's (or .gguf file's) name
    strict_model_names: bool = False  # True: an unknown `model` is a 404 (n8n sends gpt-4o-mini by default)
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    max_num_seqs: int = 256
    enforce_eager: bool = False
    seed: int = 0
    # tool-call dialect: auto (from the chat template), hermes, llama3_json, mistral or generic
    tool_call_format: Literal["auto", "hermes", "llama3_json", "mistral", "generic"] = "auto"
    # the rest of EngineConfig's knobs, same names (engine/config.py says what each does); None: the
    # engine's default. Every EngineConfig field but `model` is a field here (tests/app/test_engine_settings)
    block_size: int | None = None
    gpu_memory_utilization: float = 0.85
    cpu_kv_cache_bytes: int = 256 << 20
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool = True
    enable_chunked_prefill: bool = True
    async_scheduling: bool | None = None
    launch_ahead: bool = True
    device_mask_rows: int = 4096
    sampler_graphs: bool = True
    load_format: str = "auto"
    tokenizer: str | None = None
    hf_overrides: dict = Field(default_factory=dict)  # CHATLOOM_HF_OVERRIDES='{"num_hidden_layers": 2}'
    cuda_graph_sizes: Annotated[list[int] | None, NoDecode] = None  # CHATLOOM_CUDA_GRAPH_SIZES="1,2,4,8"
    prefill_graph_max_tokens: int = 512
    batch_graph_max_tokens: int = 8192
    num_threads: int | None = None
    quantization: Literal["none", "int8", "int4"] = "none"  # CPU weight-only quantization
    cpu_compile: bool | None = None  # CHATLOOM_CPU_COMPILE=0: a quantized model's CPU decode steps eager
    speculative_method: Literal["off", "ngram", "draft"] = "off"  # CHATLOOM_SPECULATIVE_METHOD=ngram
    num_speculative_tokens: int = 4
    draft_model: str | None = None

    # HTTP
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: SecretStr | None = None  # guards /v1/* (and the path aliases without /v1), /docs
    api_key_file: Path | None = None  # the key read from a file (flags show in `ps`; files don't)
    # Host header check against DNS rebinding: names (or "*.domain", or "*" for any) this server
    # answers to; None: localhost, 127.0.0.1, ::1 and the bind host
    allowed_hosts: Annotated[list[str] | None, NoDecode] = None
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)  # larger request bodies are a 413
    max_n: int = Field(default=16, ge=1)  # the largest `n` a request may ask for
    grammar_timeout_s: float = Field(default=30.0, gt=0)  # longest wait for a new tool/JSON grammar
    # logit bias toward spelling a tool argument as the conversation does (grammar/copying.py): this
    # on the rest of a word being copied, a twelfth of it at a word start; 0 turns it off
    copy_bias: float = Field(default=24.0, ge=0, le=100)
    # the reply's token cap when a request names none (n8n's nodes send none by default); never
    # above what the context has left. 0: no cap but the context
    default_max_tokens: int = Field(default=1024, ge=0)
    log_level: str = "info"
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # conversations (issue 5). data_dir: the folder of the default SQLite store (None: the per-user
    # data folder, app.paths); database_url: the store itself ("": chatloom.db in data_dir)
    data_dir: Path | None = None
    database_url: str = ""
    # longest wait on the store: connecting, one statement, a pooled connection, SQLite's lock
    database_timeout_s: float = Field(default=10.0, gt=0)
    # PostgreSQL connections this process keeps open (pool) and may open beyond them at peaks
    # (overflow): N replicas on one server hold up to N x (pool + overflow), which must stay under
    # its max_connections (100 by default) with room for everything else that connects
    database_pool_size: int = Field(default=5, ge=1)
    database_max_overflow: int = Field(default=10, ge=0)
    n8n_history_table: str = "n8n_chat_histories"
    assistants_file: Path | None = None

    # who may call /webhook/{assistant}/chat (an assistant's own webhook_auth wins): n8n's Chat
    # Trigger options, none | basic | header; each secret also from a file (*_file)
    webhook_auth: Literal["none", "basic", "header"] = "none"
    webhook_user: str | None = None
    webhook_password: SecretStr | None = None
    webhook_password_file: Path | None = None
    webhook_header_name: str = "Authorization"
    webhook_header_value: SecretStr | None = None
    webhook_header_value_file: Path | None = None
    allow_open_webhook: bool = False  # production answers an open webhook with 403 unless True
    # where assistants' webhook tools may connect: host names ("*.domain" too; empty: any), and
    # networks (CIDR) allowed although not public (loopback, private, link-local are refused)
    webhook_allowed_hosts: Annotated[list[str], NoDecode] = Field(default_factory=list)
    webhook_allowed_networks: Annotated[list[str], NoDecode] = Field(default_factory=list)

    @field_validator(
        "cors_origins", "allowed_hosts", "webhook_allowed_hosts", "webhook_allowed_networks", mode="before"
    )
    @classmethod
    def _split_origins(cls, value: object) -> object:
        # CHATLOOM_CORS_ORIGINS="http://a,http://b" or a JSON list (the other lists alike)
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @field_validator("cuda_graph_sizes", mode="before")
    @classmethod
    def _split_sizes(cls, value: object) -> object:
        # CHATLOOM_CUDA_GRAPH_SIZES="1,2,4,8" or a JSON list; "" is None (the engine's ladder)
        if isinstance(value, str):
            text = value.strip()
            if not text:
                return None
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _default_database(self) -> Settings:
        if not self.database_url.strip():
            from app.paths import sqlite_url, user_data_dir

            self.database_url = sqlite_url(self.data_dir or user_data_dir())
        return self

    @model_validator(mode="after")
    def _check_engine_config(self) -> Settings:
        self.engine_config("")  # EngineConfig's own checks, each naming its field, before anything loads
        return self

    def engine_config(self, model: str):
        """The EngineConfig these settings describe, for the checkpoint `model`."""
        from dataclasses import fields

        from engine.config import EngineConfig

        names = [f.name for f in fields(EngineConfig) if f.name != "model"]
        return EngineConfig(model=model, **{name: getattr(self, name) for name in names})

    @field_validator("webhook_allowed_networks")
    @classmethod
    def _networks(cls, value: list[str]) -> list[str]:
        import ipaddress

        for item in value:
            ipaddress.ip_network(item, strict=False)  # ValueError names the bad entry
        return value

    @model_validator(mode="after")
    def _secrets_from_files(self) -> Settings:
        for name in ("api_key", "webhook_password", "webhook_header_value"):
            path = getattr(self, f"{name}_file")
            if path is not None and getattr(self, name) is None:
                try:
                    text = Path(path).read_text().strip()
                except OSError as exc:
                    raise ValueError(f"{name}_file: cannot read {path}: {exc.strerror}") from exc
                if not text:
                    raise ValueError(f"{name}_file: {path} is empty")
                setattr(self, name, SecretStr(text))
        if self.webhook_auth == "basic" and not (self.webhook_user and self.webhook_password):
            raise ValueError("CHATLOOM_WEBHOOK_AUTH=basic needs CHATLOOM_WEBHOOK_USER and a password")
        if self.webhook_auth == "header" and not self.webhook_header_value:
            raise ValueError("CHATLOOM_WEBHOOK_AUTH=header needs CHATLOOM_WEBHOOK_HEADER_VALUE (or _FILE)")
        return self

    def host_allow_list(self) -> list[str]:
        """allowed_hosts, or its default: the loopback names and the bind host."""
        if self.allowed_hosts is not None:
            return self.allowed_hosts
        names = ["localhost", "127.0.0.1", "::1"]
        if self.host not in ("0.0.0.0", "::", "") and self.host not in names:
            names.append(self.host)
        return names

    @model_validator(mode="after")
    def _refuse_unsafe_production(self) -> Settings:
        if self.environment == "production":
            if self.api_key is None or not self.api_key.get_secret_value():
                raise ValueError("CHATLOOM_API_KEY must be set when CHATLOOM_ENVIRONMENT=production")
            if "*" in self.cors_origins:
                raise ValueError("CHATLOOM_CORS_ORIGINS may not be '*' when CHATLOOM_ENVIRONMENT=production")
        return self

    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model:
            path = Path(self.model)
            return (path.stem if path.suffix.lower() == ".gguf" else path.name) or self.model
        from models.gguf import EMBEDDED_NAME, embedded_gguf

        return EMBEDDED_NAME if embedded_gguf() is not None else "chatloom-tiny"
