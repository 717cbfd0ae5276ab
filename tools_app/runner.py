"""The tool runner an engine is handed: offers allowed tools, asks a person when needed, runs.

Every call goes through :meth:`ToolRunner.call`, which asks the approval policy
(``tools_app/policy.py``: allow, ask or deny), emits the ``tool.state`` transitions
(``pending`` → [``awaiting_input`` →] ``running`` → ``succeeded``/``failed``, or ``denied``),
and never raises for a tool's own failure: the model gets the error text back. It implements
the engines' ``ToolPort``; it writes no chat rows (the run service records what it sees).
"""
from __future__ import annotations

import asyncio
import logging
from datetime import timedelta
from fnmatch import fnmatchcase
from typing import TYPE_CHECKING, Any, Awaitable, Callable

from asgiref.sync import sync_to_async
from django.conf import settings
from django.utils import timezone

from core.events import ContextPatch, RunEventBase, ToolCallState, ToolStatus

from .policy import Effect
from .policy_check import tool_call_policy, tool_needs_person
from .registry import Tool, ToolContext, ToolError, ToolResult, all_tools
from .workspace import ensure_workspace

if TYPE_CHECKING:
    from agents_app.models import Agent
    from core.doorbell import RunDoorbell

logger = logging.getLogger("orchestrator.tools")

Emit = Callable[[RunEventBase], Awaitable[None]]
# The timeline keeps the whole output in tool.state; the context patch carries a preview.
_PATCH_OUTPUT_CHARS = 2000


class ToolRunner:
    def __init__(
        self,
        *,
        run_id: str,
        conversation_id: str,
        agent: "AgentSpec",
        emit: Emit,
        doorbell: "RunDoorbell | None" = None,
        extra_tools: dict[str, Tool] | None = None,
        config: dict[str, Any] | None = None,
        tool_allowlist: list[str] | None = None,
    ):
        self.run_id = str(run_id)
        self.conversation_id = str(conversation_id)
        self.agent = agent
        self.emit = emit
        self.doorbell = doorbell
        self.extra_tools = dict(extra_tools or {})
        self.config = dict(config or {})
        # A run option (e.g. ACP's --allowed-tools): names or globs; None offers every agent tool.
        self.tool_allowlist = None if tool_allowlist is None else tuple(tool_allowlist)
        registry = all_tools()
        self._builtin = {name: registry[name]() for name in (agent.allowed_tools or []) if name in registry}

    def for_agent(self, agent: "AgentSpec") -> "ToolRunner":
        """A runner for another agent of the same run (delegation): its own tools and approvals."""
        return ToolRunner(run_id=self.run_id, conversation_id=self.conversation_id, agent=agent, emit=self.emit,
                          doorbell=self.doorbell, extra_tools=self.extra_tools, config=self.config,
                          tool_allowlist=self.tool_allowlist)

    # --- what the model is offered -----------------------------------------------------------
    def names(self) -> list[str]:
        return sorted(name for name in {*self._builtin, *self.extra_tools} if self._allowed(name))

    def get(self, name: str) -> Tool | None:
        return (self._builtin.get(name) or self.extra_tools.get(name)) if self._allowed(name) else None

    def _allowed(self, name: str) -> bool:
        return self.tool_allowlist is None or any(fnmatchcase(name, pattern) for pattern in self.tool_allowlist)

    def specs(self) -> list[dict[str, Any]]:
        return [self.get(name).spec() for name in self.names()]  # type: ignore[union-attr]

    def requires_approval(self, name: str) -> bool:
        """Compat for engines that cannot pause for a person (claude_agent_sdk): True unless the
        approval policy lets every call of ``name`` run without one (deny and ask both count)."""
        return tool_needs_person(agent=self.agent, conversation_id=self.conversation_id, tool_name=name,
                                 tool=self.get(name))

    # --- one call ------------------------------------------------------------------------------
    async def call(self, *, tool_call_id: str, name: str, input: dict[str, Any]) -> ToolResult:
        state = dict(tool_call_id=tool_call_id, name=name, input=input if isinstance(input, dict) else {"value": input})
        await self.emit(ToolCallState(status=ToolStatus.PENDING, **state))
        if not self._allowed(name):
            allowed = ", ".join(self.tool_allowlist or ()) or "none"
            result = ToolResult(f"Tool {name!r} is not among this run's allowed tools ({allowed}); it was not run.",
                                is_error=True)
            await self._finish(state, ToolStatus.DENIED, result, error=f"not in the allowed tools ({allowed})")
            return result
        tool = self.get(name)
        if tool is None:
            allowed = ", ".join(self.names()) or "none"
            result = ToolResult(f"Tool {name!r} is not available to this agent (available: {allowed}).", is_error=True)
            await self._finish(state, ToolStatus.FAILED, result)
            return result
        if not isinstance(input, dict):
            result = ToolResult(f"Tool {name!r} input must be a JSON object.", is_error=True)
            await self._finish(state, ToolStatus.FAILED, result)
            return result

        policy = await tool_call_policy(agent=self.agent, conversation_id=self.conversation_id, tool_name=name,
                                        tool_input=input, tool=tool, workspace=ensure_workspace(self.agent.workspace_path))
        state["policy"] = policy.to_dict()  # every state from here on says why the call ran, waited or not
        if policy.effect == Effect.DENY:
            result = ToolResult(f"Refused by policy rule {policy.rule!r}; the tool was not run.", is_error=True)
            await self._finish(state, ToolStatus.DENIED, result, error=f"refused by policy rule {policy.rule!r}")
            return result

        confirmation_id: str | None = None
        if policy.effect == Effect.ASK:
            confirmation = await _confirmation_create(run_id=self.run_id, tool_call_id=tool_call_id, tool=name, input=input)
            confirmation_id = str(confirmation.id)
            try:
                # Inside the try: subscribers see awaiting_input before its commit, and a cancel
                # that comes while it is being recorded must expire the confirmation too.
                await self.emit(ToolCallState(status=ToolStatus.AWAITING_INPUT, confirmation_id=confirmation_id, **state))
                decision = await self._await_decision(confirmation_id)
            except asyncio.CancelledError:
                # The run was cancelled: nobody can approve this call any more.
                await _confirmation_expire(confirmation_id=confirmation_id)
                raise
            if decision != "approved":
                if decision == "denied":
                    result = ToolResult("The user denied this tool call; it was not run.", is_error=True)
                    await self._finish(state, ToolStatus.DENIED, result, confirmation_id=confirmation_id)
                else:
                    result = ToolResult("Nobody approved this tool call in time; it was not run.", is_error=True)
                    await self._finish(state, ToolStatus.FAILED, result, confirmation_id=confirmation_id,
                                       error="confirmation expired")
                return result

        await self.emit(ToolCallState(status=ToolStatus.RUNNING, confirmation_id=confirmation_id, **state))
        context = ToolContext(
            workspace=ensure_workspace(self.agent.workspace_path),
            agent_role=self.agent.role,
            run_id=self.run_id,
            tool_call_id=tool_call_id,
            config=self.config,
        )
        try:
            result = await tool.run(input=input, context=context)
        except ToolError as exc:
            result = ToolResult(str(exc), is_error=True)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - a broken tool must not end the run
            logger.exception("tool %s crashed in run %s", name, self.run_id)
            result = ToolResult(f"Tool {name} failed unexpectedly: {type(exc).__name__}: {exc}", is_error=True)
        status = ToolStatus.FAILED if result.is_error else ToolStatus.SUCCEEDED
        await self._finish(state, status, result, confirmation_id=confirmation_id)
        return result

    async def _finish(self, state: dict[str, Any], status: str, result: ToolResult, *,
                      confirmation_id: str | None = None, error: str | None = None) -> None:
        if status == ToolStatus.SUCCEEDED:
            event = ToolCallState(status=status, output=result.output, confirmation_id=confirmation_id, **state)
        else:
            event = ToolCallState(status=status, error=error or result.output, confirmation_id=confirmation_id, **state)
        await self.emit(event)
        # What the model will see next: the tool's result joins the conversation context.
        await self.emit(ContextPatch(kind="tool_result", data={
            "toolCallId": state["tool_call_id"], "name": state["name"], "status": status,
            "isError": result.is_error, "output": result.output[:_PATCH_OUTPUT_CHARS],
        }))
        if confirmation_id:
            await _confirmation_set_output(confirmation_id=confirmation_id, output=result.output)

    async def _await_decision(self, confirmation_id: str) -> str:
        """Wait for approve/deny: rung by the doorbell, re-checked on a timer, expired at the deadline."""
        from .models import ToolConfirmation

        loop = asyncio.get_running_loop()
        deadline = loop.time() + float(settings.CONFIRMATION_TIMEOUT)
        recheck = float(settings.CONFIRMATION_RECHECK_INTERVAL)
        key = f"confirmation:{confirmation_id}"
        while True:
            status = await ToolConfirmation.objects.filter(id=confirmation_id).values_list("status", flat=True).afirst()
            if status != ToolConfirmation.Status.PENDING:
                return status or "expired"
            remaining = deadline - loop.time()
            if remaining <= 0:
                expired = await ToolConfirmation.objects.filter(
                    id=confirmation_id, status=ToolConfirmation.Status.PENDING
                ).aupdate(status=ToolConfirmation.Status.EXPIRED, decided_at=timezone.now())
                if expired:
                    return "expired"
                continue  # decided at the last moment: read the decision
            if self.doorbell is not None:
                await self.doorbell.wait(key, min(recheck, remaining))
            else:
                await asyncio.sleep(min(recheck, remaining))


@sync_to_async
def _confirmation_create(*, run_id: str, tool_call_id: str, tool: str, input: dict[str, Any]):
    from .models import ToolConfirmation

    return ToolConfirmation.objects.create(
        run_id=run_id,
        tool_call_id=tool_call_id,
        tool=tool,
        input=input,
        expires_at=timezone.now() + timedelta(seconds=float(settings.CONFIRMATION_TIMEOUT)),
    )


@sync_to_async
def _confirmation_expire(*, confirmation_id: str) -> None:
    from .models import ToolConfirmation

    ToolConfirmation.objects.filter(id=confirmation_id, status=ToolConfirmation.Status.PENDING).update(
        status=ToolConfirmation.Status.EXPIRED, decided_at=timezone.now(), reason="run cancelled"
    )


@sync_to_async
def _confirmation_set_output(*, confirmation_id: str, output: str) -> None:
    from .models import ToolConfirmation

    ToolConfirmation.objects.filter(id=confirmation_id).update(output=output[:100_000])
