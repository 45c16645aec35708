"""The Files and Batches APIs (the openai SDK's client.files / client.batches): a caller uploads a
JSONL file of request lines, creates a batch over it, polls it, and downloads its output and error
files. Files and batches belong to the caller (app.principal): anyone else gets a 404."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, File, Form, Query, Request, UploadFile
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field

from app.batch import store
from app.batch.dispatch import ENDPOINTS
from app.deps import ApiKey, Caller
from app.errors import APIError
from app.memory.deps import DB
from app.memory.models import utcnow
from app.principal import Principal

router = APIRouter(dependencies=[ApiKey], tags=["batches"])

PURPOSES = ("batch",)  # what this server accepts for upload (it writes "batch_output" itself)


class BatchCreate(BaseModel):
    """openai.types.BatchCreateParams."""

    model_config = ConfigDict(extra="ignore")

    input_file_id: str = Field(min_length=1, max_length=64)
    endpoint: str
    completion_window: str
    metadata: dict[str, Annotated[str, Field(max_length=512)]] | None = Field(default=None, max_length=16)


def _wake(request: Request) -> None:
    worker = getattr(request.app.state, "batch_worker", None)
    if worker is not None:
        worker.wake.set()


def _not_found(kind: str, ident: str, param: str | None = None) -> APIError:
    return APIError(f"No {kind} found with id {ident!r}.", 404, param=param, code="not_found")


# ---- files ---------------------------------------------------------------------------------------


@router.post("/v1/files")
async def create_file(
    db: DB,
    caller: Caller,
    file: Annotated[UploadFile, File()],
    purpose: Annotated[str, Form()],
) -> dict[str, Any]:
    if purpose not in PURPOSES:
        raise APIError(
            f"Invalid value for 'purpose': this server accepts {', '.join(PURPOSES)}, got {purpose!r}.",
            param="purpose",
        )
    content = await file.read()
    if not content.strip():
        raise APIError("The file is empty.", param="file")
    try:
        content.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise APIError(f"The file must be UTF-8 JSONL text: {exc}.", param="file") from None
    filename = (file.filename or "upload.jsonl")[:255]
    async with db.session() as s:
        row = await store.add_file(s, caller.id, purpose, filename, content)
        return store.file_object(row)


@router.get("/v1/files")
async def list_files(
    db: DB, caller: Caller, purpose: Annotated[str | None, Query(max_length=32)] = None
) -> dict[str, Any]:
    async with db.session() as s:
        rows = await store.list_files(s, caller.reads, purpose)
        return {"object": "list", "data": [store.file_object(r) for r in rows], "has_more": False}


async def _file(db: Any, caller: Principal, file_id: str) -> Any:
    async with db.session() as s:
        row = await store.get_file(s, file_id)
    if row is None or not caller.can_read(row.owner):
        raise _not_found("file", file_id, "file_id")
    return row


@router.get("/v1/files/{file_id}")
async def retrieve_file(file_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    return store.file_object(await _file(db, caller, file_id))


@router.get("/v1/files/{file_id}/content")
async def file_content(file_id: str, db: DB, caller: Caller) -> Response:
    row = await _file(db, caller, file_id)
    return Response(row.content, media_type="application/jsonl")


# ---- batches -------------------------------------------------------------------------------------


@router.post("/v1/batches")
async def create_batch(body: BatchCreate, request: Request, db: DB, caller: Caller) -> dict[str, Any]:
    if body.endpoint not in ENDPOINTS:
        raise APIError(
            f"Invalid value for 'endpoint': one of {', '.join(ENDPOINTS)}, got {body.endpoint!r}.",
            param="endpoint",
        )
    if body.completion_window != "24h":
        raise APIError(
            "Invalid value for 'completion_window': only '24h' is supported, "
            f"got {body.completion_window!r}.",
            param="completion_window",
        )
    async with db.session() as s:
        source = await store.get_file(s, body.input_file_id)
        if source is None or not caller.can_read(source.owner):
            raise _not_found("file", body.input_file_id, "input_file_id")
        if source.purpose != "batch":
            raise APIError(
                f"The file {body.input_file_id!r} has purpose {source.purpose!r}; a batch needs 'batch'.",
                param="input_file_id",
            )
        row = await store.add_batch(s, caller.id, body.endpoint, body.input_file_id, body.metadata)
        out = store.batch_object(row)
    _wake(request)
    return out


@router.get("/v1/batches")
async def list_batches(
    db: DB,
    caller: Caller,
    after: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=100)] = 20,
) -> dict[str, Any]:
    async with db.session() as s:
        rows, more = await store.list_batches(s, caller.reads, after, limit)
        data = [store.batch_object(r) for r in rows]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": more,
    }


@router.get("/v1/batches/{batch_id}")
async def retrieve_batch(batch_id: str, db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        row = await store.get_batch(s, batch_id)
        if row is None or not caller.can_read(row.owner):
            raise _not_found("batch", batch_id, "batch_id")
        return store.batch_object(row)


CANCELLABLE: tuple[Literal["validating", "in_progress"], ...] = ("validating", "in_progress")


@router.post("/v1/batches/{batch_id}/cancel")
async def cancel_batch(batch_id: str, request: Request, db: DB, caller: Caller) -> dict[str, Any]:
    async with db.session() as s:
        row = await store.get_batch(s, batch_id)
        if row is None or not caller.can_read(row.owner):
            raise _not_found("batch", batch_id, "batch_id")
        if row.status in CANCELLABLE:
            row.status = "cancelling"
            row.cancelling_at = utcnow()
        elif row.status not in ("cancelling", "cancelled"):
            raise APIError(f"A batch that is {row.status} cannot be cancelled.", 409, param="batch_id")
        out = store.batch_object(row)
    _wake(request)
    return out
