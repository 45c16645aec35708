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
    model: str | None = None  # checkpoint folder; None: the embedded default model
    served_model_name: str | None = None  # None: the checkpoint folder's name
    strict_model_names: bool = False  # True: an unknown `model` is a 404 (n8n sends gpt-4o-mini by default)
    device: str = "auto"
    dtype: str = "auto"
    max_model_len: int | None = None
    num_kv_blocks: int | None = None
    max_num_seqs: int = 256
    enforce_eager: bool = False
    seed: int = 0

    # HTTP
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: SecretStr | None = None  # guards /v1/* (and the path aliases without /v1)
    max_body_bytes: int = Field(default=16 * 1024 * 1024, gt=0)  # larger request bodies are a 413
    max_n: int = Field(default=16, ge=1)  # the largest `n` a request may ask for
    grammar_timeout_s: float = Field(default=30.0, gt=0)  # longest wait for a new tool/JSON grammar
    log_level: str = "info"
    cors_origins: Annotated[list[str], NoDecode] = Field(default_factory=list)

    # conversations (issue 5)
    database_url: str = "sqlite:///./data/chatloom.db"
    n8n_history_table: str = "n8n_chat_histories"
    assistants_file: Path | None = None

    @field_validator("cors_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        # CHATLOOM_CORS_ORIGINS="http://a,http://b" or a JSON list
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                import json

                return json.loads(text)
            return [part.strip() for part in text.split(",") if part.strip()]
        return value

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
            return Path(self.model).name or self.model
        return "chatloom-tiny"
