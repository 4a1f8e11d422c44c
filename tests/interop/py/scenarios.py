"""The interop scenarios, written once for both Python SDK peers.

Each peer (`legacy_client.py` for mcp 1.30.0, `modern_client.py` for mcp 2.3.0) wraps its
SDK in a small adapter with one method, `session(...)`, an async context manager that
yields a connection with `info()`, `list_tools()` and `call(name, arguments)`. The
scenarios below only drive that adapter and record what happened (every handler call,
every result or error); the orchestrator (`tests/interop/run.py`) holds the expectations
and checks them, together with the notes store, the same way for every client.

Protocol with the orchestrator (stdout, one JSON object per line):
  {"event": "checkpoint", "name": ...}  then wait for one line on stdin (the
                                        orchestrator snapshots the store meanwhile)
  {"event": "done", "obs": {...}}       the observations, last line
  {"event": "error", "error": "..."}    the driver itself broke
Standard library only: this file is imported by both venvs.
"""

from __future__ import annotations

import asyncio
import json
import sys
import traceback
from typing import Any, Awaitable, Callable

# How long one side of the interleaving scenario waits for the other.
BARRIER_SECONDS = 20.0

# The protocol version each opened session negotiated (peers append to it); reported as
# obs["protocol_versions"] so the orchestrator can tell a modern client that silently fell
# back to the legacy handshake.
SEEN_VERSIONS: list[str] = []


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def checkpoint(name: str) -> None:
    emit({"event": "checkpoint", "name": name})
    line = await asyncio.to_thread(sys.stdin.readline)
    if not line:
        raise RuntimeError("the orchestrator went away during a checkpoint")


def answer_for(spec: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]:
    """An ElicitResult (as a dict) for an answer spec and the form that was received.

    spec: {"action": "accept", "pick": i, "confirm": bool} picks the i-th offered note_id;
    {"action": "decline"} / {"action": "cancel"} answer without content.
    """
    if spec["action"] != "accept":
        return {"action": spec["action"]}
    schema = params.get("requestedSchema") or {}
    ids = ((schema.get("properties") or {}).get("note_id") or {}).get("enum") or []
    pick = spec.get("pick", 0)
    if pick >= len(ids):
        raise RuntimeError(f"answer spec picks #{pick} but the form offered {ids!r}")
    return {"action": "accept", "content": {"note_id": ids[pick], "confirm": spec.get("confirm", True)}}


class HostRefusal(Exception):
    """Raised by a scenario's handler: the peer answers that live request with a
    JSON-RPC error (code, message) instead of a result."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


class Recorder:
    """Generic host handlers that record every call and answer from a plan."""

    def __init__(self, answers=(), samples=(), roots_answers=()):
        self.answers = list(answers)
        self.samples = list(samples)
        self.roots_answers = list(roots_answers)
        self.elicitations: list[dict[str, Any]] = []
        self.samplings: list[dict[str, Any]] = []
        self.roots_calls = 0

    async def elicit(self, params: dict[str, Any]) -> dict[str, Any]:
        self.elicitations.append(params)
        if not self.answers:
            return {"action": "cancel"}
        return answer_for(self.answers.pop(0), params)

    async def sample(self, params: dict[str, Any]) -> str:
        self.samplings.append(params)
        if not self.samples:
            return "(no more planned sampling replies)"
        return self.samples.pop(0)

    async def roots(self) -> list[str]:
        self.roots_calls += 1
        if not self.roots_answers:
            return []
        return self.roots_answers.pop(0)

    def handlers(self) -> dict[str, Callable[..., Awaitable[Any]]]:
        return {"elicit": self.elicit, "sample": self.sample, "roots": self.roots}

    def obs(self) -> dict[str, Any]:
        return {
            "elicitations": self.elicitations,
            "samplings": self.samplings,
            "roots_calls": self.roots_calls,
        }


async def s_discover(peer, cfg):
    rec = Recorder()
    async with peer.session(cfg, **rec.handlers()) as c:
        info = await c.info()
        tools = await c.list_tools()
    return {"info": info, "tools": tools, **rec.obs()}


async def s_delete_accept(peer, cfg):
    rec = Recorder(answers=cfg["answers"])
    async with peer.session(cfg, **rec.handlers()) as c:
        call = await c.call("notes_delete", {"workspaceUri": cfg["workspace"], "title": cfg["title"]})
    return {"call": call, **rec.obs()}


async def s_delete_decline_cancel(peer, cfg):
    rec = Recorder(answers=cfg["answers"])
    calls = []
    args = {"workspaceUri": cfg["workspace"], "title": cfg["title"]}
    async with peer.session(cfg, **rec.handlers()) as c:
        calls.append(await c.call("notes_delete", args))
        await checkpoint("after_decline")
        calls.append(await c.call("notes_delete", args))
        await checkpoint("after_cancel")
        calls.append(await c.call("notes_delete", args))
    return {"calls": calls, **rec.obs()}


async def s_summarize(peer, cfg):
    rec = Recorder(samples=cfg["samples"])
    async with peer.session(cfg, **rec.handlers()) as c:
        await c.list_tools()  # some SDKs validate structuredContent against outputSchema
        call = await c.call("summarize_repo", {"directory": cfg["repo"], "audience": "developer"})
        after = await c.call("notes_list", {"workspaceUri": cfg["workspace"]})
    return {"call": call, "after": after, **rec.obs()}


async def s_roots(peer, cfg):
    rec = Recorder(roots_answers=cfg["roots_answers"])
    calls = []
    async with peer.session(cfg, **rec.handlers()) as c:
        for _ in cfg["roots_answers"]:
            calls.append(await c.call("notes_list", {}))
    return {"calls": calls, **rec.obs()}


async def s_no_elicitation(peer, cfg):
    rec = Recorder(answers=[{"action": "accept", "pick": 0, "confirm": True}])
    handlers = rec.handlers()
    handlers["elicit"] = None  # declare no elicitation capability
    async with peer.session(cfg, **handlers) as c:
        call = await c.call("notes_delete", {"workspaceUri": cfg["workspace"], "title": cfg["title"]})
        after = await c.call("notes_list", {"workspaceUri": cfg["workspace"]})
    return {"call": call, "after": after, **rec.obs()}


async def s_interleave(peer, cfg):
    """Two sessions, each in the middle of an elicitation round at the same time; B's
    whole request completes while A's round is still open, then A answers."""
    got_form = {"A": asyncio.Event(), "B": asyncio.Event()}
    b_done = asyncio.Event()
    out: dict[str, Any] = {}

    async def party(name: str, title: str, spec: dict[str, Any]):
        rec = Recorder()

        async def elicit(params):
            rec.elicitations.append(params)
            got_form[name].set()
            await asyncio.wait_for(
                asyncio.gather(got_form["A"].wait(), got_form["B"].wait()), BARRIER_SECONDS
            )
            if name == "A":
                await asyncio.wait_for(b_done.wait(), BARRIER_SECONDS)
            return answer_for(spec, params)

        handlers = rec.handlers()
        handlers["elicit"] = elicit
        try:
            async with peer.session(cfg, **handlers) as c:
                call = await c.call("notes_delete", {"workspaceUri": cfg["workspace"], "title": title})
                if name == "B":
                    b_done.set()
        finally:
            # Never leave the other party waiting for the full barrier on a failure.
            if name == "B":
                b_done.set()
            got_form[name].set()
        out[name] = {"call": call, **rec.obs()}

    await asyncio.gather(
        party("A", cfg["parties"]["A"]["title"], cfg["parties"]["A"]["answer"]),
        party("B", cfg["parties"]["B"]["title"], cfg["parties"]["B"]["answer"]),
    )
    return out


async def s_sibling_failure(peer, cfg):
    """One round asks for three inputs at once (the conformance fixture's
    test_input_required_result_multiple_inputs: elicitation, sampling, roots). The
    host refuses the sampling request at once and answers the other two after a
    pause, so at least one answer reaches the gateway after it gave up on the round
    (a late reply, which must be accepted and dropped). The session stays open until
    those answers were posted."""
    rec = Recorder()
    answered = {"elicitation": asyncio.Event(), "roots": asyncio.Event()}

    async def elicit(params):
        rec.elicitations.append(params)
        await asyncio.sleep(cfg["answer_delay"])
        answered["elicitation"].set()
        return {"action": "accept", "content": {"name": "Ada"}}

    async def sample(params):
        rec.samplings.append(params)
        raise HostRefusal(cfg["refusal"]["code"], cfg["refusal"]["message"])

    async def roots():
        rec.roots_calls += 1
        await asyncio.sleep(cfg["answer_delay"])
        answered["roots"].set()
        return []

    async with peer.session(cfg, elicit=elicit, sample=sample, roots=roots) as c:
        call = await c.call(cfg["tool"], {})
        # The answers still owed are posted after their handlers return.
        for e in answered.values():
            await asyncio.wait_for(e.wait(), BARRIER_SECONDS)
        await asyncio.sleep(1.5)
        after = await c.call(cfg["tool_after"], {})
    return {"call": call, "after": after, **rec.obs()}


TERMINAL = ("completed", "failed", "cancelled")


async def poll_until(c, task_id: str, statuses: tuple[str, ...], polls: list) -> None:
    """tasks/get until the task is in one of `statuses` or terminal (bounded)."""
    for _ in range(200):
        got = await c.get_task(task_id)
        polls.append(got)
        status = (got.get("result") or {}).get("status")
        if status in statuses or status in TERMINAL or "error" in got:
            return
        interval = (got.get("result") or {}).get("pollInterval") or 100
        await asyncio.sleep(min(interval, 500) / 1000)


async def s_tasks(peer, cfg):
    """summarize_repo as a 2025-11-25 task: poll to input_required, tasks/result (its two
    sampling rounds arrive on it), then a second task cancelled while input_required."""
    rec = Recorder(samples=cfg["samples"])
    args = {"directory": cfg["repo"], "audience": "developer"}
    polls: list = []
    async with peer.session(cfg, tasks=True, **rec.handlers()) as c:
        info = await c.info()
        created = await c.call_as_task("summarize_repo", args)
        task = created["result"]["task"]["taskId"]
        await poll_until(c, task, ("input_required",), polls)
        result = await c.task_result(task)
        done = await c.get_task(task)
        listed = await c.list_tasks()
        await checkpoint("after_result")
        created2 = await c.call_as_task("summarize_repo", args)
        task2 = created2["result"]["task"]["taskId"]
        polls2: list = []
        await poll_until(c, task2, ("input_required",), polls2)
        cancelled = await c.cancel_task(task2)
        after_cancel = await c.get_task(task2)
        cancel_again = await c.cancel_task(task2)
        listed2 = await c.list_tasks()
    return {"info": info, "created": created, "polls": polls, "result": result, "done": done,
            "listed": listed, "created2": created2, "polls2": polls2, "cancelled": cancelled,
            "after_cancel": after_cancel, "cancel_again": cancel_again, "listed2": listed2,
            **rec.obs()}


SCENARIOS = {
    "tasks": s_tasks,
    "sibling_failure": s_sibling_failure,
    "discover": s_discover,
    "delete_accept": s_delete_accept,
    "delete_decline_cancel": s_delete_decline_cancel,
    "summarize": s_summarize,
    "summarize_bad_pick": s_summarize,
    "roots": s_roots,
    "no_elicitation": s_no_elicitation,
    "interleave": s_interleave,
}


def main(peer) -> None:
    cfg = json.loads(sys.argv[1])
    try:
        obs = asyncio.run(SCENARIOS[cfg["scenario"]](peer, cfg))
    except BaseException:  # report anything, including ExceptionGroups from anyio
        emit({"event": "error", "error": traceback.format_exc()})
        sys.exit(1)
    obs["protocol_versions"] = SEEN_VERSIONS
    emit({"event": "done", "obs": obs})
