"""How the ingress reaches a model: the replicas of a model deployment, through
Serve's handle and its router, or a `ModelServer` living in the ingress replica
itself (`main_placement: ingress`), called directly: no Ray call per turn."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, Protocol

from deployments.replica.model_server import ModelServer
from deployments.turn import ReplyHead, ReplyTail

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest

    from cluster.store.replicas import ReplicaStatus
    from deployments.turn import TurnContext

Reply = ReplyHead | str | ReplyTail


class ReplyStream(Protocol):
    """A turn's reply as `ModelServer.chat` yields it; `cancel` abandons it."""

    def __aiter__(self) -> AsyncIterator[Reply]: ...

    async def __anext__(self) -> Reply: ...

    def cancel(self) -> None: ...


async def reply_head(stream: ReplyStream) -> ReplyHead:
    """The stream's first item, which `ModelServer.chat` makes its `ReplyHead`."""
    head = await stream.__anext__()
    if not isinstance(head, ReplyHead):
        raise TypeError(f"a reply began with {type(head).__name__}, not its head")
    return head


class ModelClient(Protocol):
    replica_loss_errors: tuple[type[BaseException], ...]
    """Errors meaning the replica died before answering (the turn may be sent again)."""

    def chat(
        self, request: ChatCompletionRequest, turn: TurnContext | None, program_id: str
    ) -> ReplyStream: ...

    async def status(self) -> ReplicaStatus: ...

    async def end_program(self, program_id: str) -> bool: ...

    async def add_predicted_calls(self, program_id: str, call_texts: list[str]) -> int: ...


class ReplicaClient:
    """The replicas of a model deployment; the deployment's router picks one per
    call, by the program id for the main model."""

    def __init__(self, handle: DeploymentHandle):
        from ray.exceptions import ActorUnavailableError, RayActorError

        self._handle = handle
        self.replica_loss_errors: tuple[type[BaseException], ...] = (
            RayActorError,
            ActorUnavailableError,
        )

    def chat(
        self, request: ChatCompletionRequest, turn: TurnContext | None, program_id: str
    ) -> ReplyStream:
        handle = self._handle.options(stream=True, session_id=program_id)
        stream: ReplyStream = handle.chat.remote(request, turn)
        return stream

    async def status(self) -> ReplicaStatus:
        status: ReplicaStatus = await self._handle.status.remote()
        return status

    async def end_program(self, program_id: str) -> bool:
        ended: bool = await self._handle.end_program.remote(program_id)
        return ended

    async def add_predicted_calls(self, program_id: str, call_texts: list[str]) -> int:
        # The session router sends it where the program's turn went.
        handle = self._handle.options(session_id=program_id)
        taken: int = await handle.add_predicted_calls.remote(program_id, call_texts)
        return taken


class _LocalStream:
    def __init__(self, replies: AsyncIterator[Reply]):
        self._replies = replies
        self._closing: asyncio.Task[None] | None = None

    def __aiter__(self) -> AsyncIterator[Reply]:
        return self

    async def __anext__(self) -> Reply:
        return await self._replies.__anext__()

    def cancel(self) -> None:
        # Closing the generator ends the engine request through vLLM's own cleanup.
        close: Any = getattr(self._replies, "aclose", None)
        if close is not None and self._closing is None:
            self._closing = asyncio.ensure_future(close())


class InProcessClient:
    """A `ModelServer` in this process."""

    replica_loss_errors: tuple[type[BaseException], ...] = ()

    def __init__(self, server: ModelServer):
        self._server = server

    def chat(
        self, request: ChatCompletionRequest, turn: TurnContext | None, program_id: str
    ) -> ReplyStream:
        return _LocalStream(self._server.chat(request, turn))

    async def status(self) -> ReplicaStatus:
        return self._server.status()

    async def end_program(self, program_id: str) -> bool:
        return await self._server.end_program(program_id)

    async def add_predicted_calls(self, program_id: str, call_texts: list[str]) -> int:
        return await self._server.add_predicted_calls(program_id, call_texts)

    async def check_health(self) -> None:
        await self._server.check_health()
