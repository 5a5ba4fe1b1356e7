"""The capture proxy's OpenAPI document: its handlers parse their bodies themselves (so the order of
checks stays the proxy's), so the request bodies are added to the document here, resolvable by client
generators and fuzzers."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from agents_adapter.proxy.anthropic_api import MessagesRequest
from agents_adapter.proxy.openai_models import (
    ChatCompletionRequest,
    CompletionRequest,
    DrainRequest,
    EndSessionRequest,
    RewardRequest,
    TokenGenerateRequest,
)
from agents_adapter.proxy.responses_api import ResponsesRequest

_BODIES: tuple[type[BaseModel], ...] = (
    ChatCompletionRequest, CompletionRequest, TokenGenerateRequest, ResponsesRequest, MessagesRequest,
    EndSessionRequest, RewardRequest, DrainRequest,
)


def openapi_with_bodies(app: FastAPI) -> Callable[[], dict[str, Any]]:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            document = get_openapi(title=app.title, version=app.version, routes=app.routes)
            document.setdefault("components", {}).setdefault("schemas", {}).update(_body_schemas())
            app.openapi_schema = document
        return app.openapi_schema

    return openapi


def body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """Documents a body that the handler parses itself (so the order of checks stays ours); the schema
    itself is in components.schemas (`_body_schemas`)."""
    schema = {"$ref": f"#/components/schemas/{model.__name__}"}
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def _body_schemas() -> dict[str, Any]:
    """The request bodies and every model they use, named as the `$ref`s of `body_doc` and of each other."""
    _, top = models_json_schema([(m, "validation") for m in _BODIES], ref_template="#/components/schemas/{model}")
    return dict(top.get("$defs", {}))
