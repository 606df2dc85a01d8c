"""A fault-injecting OpenAI-compatible server for the tests, on loopback only.

Each request names its item ("item-123" inside the conversation). The answer for an item is
fixed (its score depends only on the item), and the fault an attempt meets depends only on
(item, attempt number, fault plan), so a run through faults must end with the same scores as a
clean run. The server counts requests and successful answers per item. A request that names no
item (the pre-flight check's probes) counts as item -1: its attempts go on counting across
checks against one server, so that successive checks meet different faults.

Run standalone (the resume test does): python tests/fault_server.py PORT_FILE [PLAN_JSON]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import math
import re
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

FAULTS = ("429", "500", "slow", "drop", "malformed", "no-logprobs", "no-labels")
ITEM = re.compile(r"item-(\d+)")


def item_score(item: int) -> float:
    """The clean P(high) for an item: a fixed pseudo-random number in (0.02, 0.98)."""
    digest = hashlib.sha256(f"score-{item}".encode()).digest()
    return 0.02 + 0.96 * int.from_bytes(digest[:4], "big") / 2**32


def _uniform(*parts: object) -> float:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "big") / 2**32


@dataclass
class FaultPlan:
    """Per attempt, the chance of each fault; `first` scripts the faults of every item's first
    attempts (None: none), before the rates apply; `broken` items answer without label tokens
    on every attempt (they must end as failures); `logprobs=False` is a server without them:
    every answer it gives lacks them; `slow_seconds` should exceed the client's read timeout;
    `delay` is added to every answer. `recover_on` names items whose chat answers lie outside
    the label set (`outside`: "no-labels" or "no-logprobs") except on the request of one recovery
    rung ("wider-top-k", "choice-spellings", "named-labels"; "never": on none), see `rung_of`."""

    rates: dict[str, float] = field(default_factory=dict)
    first: tuple[str | None, ...] = ()
    broken: frozenset[int] = frozenset()
    logprobs: bool = True
    slow_seconds: float = 1.5
    retry_after: float = 0.01
    delay: float = 0.0
    recover_on: dict[int, str] = field(default_factory=dict)
    outside: str = "no-labels"

    def fault(self, item: int, attempt: int) -> str | None:
        if item in self.broken:
            return "no-labels"
        if attempt <= len(self.first):
            return self.first[attempt - 1]
        u = _uniform("fault", item, attempt)
        edge = 0.0
        for name in FAULTS:
            edge += self.rates.get(name, 0.0)
            if u < edge:
                return name
        return None

    @classmethod
    def from_json(cls, text: str) -> FaultPlan:
        data = json.loads(text)
        return cls(
            rates=data.get("rates", {}),
            first=tuple(data.get("first", [])),
            broken=frozenset(data.get("broken", [])),
            logprobs=data.get("logprobs", True),
            slow_seconds=data.get("slow_seconds", 1.5),
            retry_after=data.get("retry_after", 0.01),
            delay=data.get("delay", 0.0),
            recover_on={int(k): v for k, v in data.get("recover_on", {}).items()},
            outside=data.get("outside", "no-labels"),
        )


def rung_of(body: dict[str, Any]) -> str:
    """Which request of the recovery ladder (experts._recovery) a chat body is, by what each
    rung changes: "top-k" for the item's own request."""
    if "structured_outputs" in body:
        return "choice-spellings"
    if "Answer with exactly one word" in str(body.get("messages")):
        return "named-labels"
    return "wider-top-k" if body.get("top_logprobs", 0) >= 20 else "top-k"


@dataclass
class Counts:
    requests: Counter[int] = field(default_factory=Counter)
    successes: Counter[int] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    models: int = 0
    bodies: dict[int, list[dict[str, Any]]] = field(default_factory=dict)  # chat bodies per item


class FaultServer:
    def __init__(
        self,
        plan: FaultPlan | None = None,
        *,
        model: str = "fault-model",
        score: Callable[[int], float] = item_score,
    ) -> None:
        self.plan = plan or FaultPlan()
        self.model = model
        self.score = score  # an item's clean P(high): another function is another expert
        self.counts = Counts()
        self.closing = asyncio.Event()  # set when the server stops: slow faults answer at once
        self.app = web.Application()
        self.app.router.add_post("/v1/chat/completions", self.chat)
        self.app.router.add_post("/v1/completions", self.completions)
        self.app.router.add_get("/v1/models", self.models)
        self.app.router.add_get("/stats", self.stats)

    def _item(self, text: str) -> int:
        match = ITEM.search(text)
        return int(match.group(1)) if match else -1

    async def _fault(self, request: web.Request, item: int) -> web.StreamResponse | None:
        self.counts.requests[item] += 1
        if self.plan.delay:
            await asyncio.sleep(self.plan.delay)
        fault = self.plan.fault(item, self.counts.requests[item])
        if fault is None:
            return None
        self.counts.faults[fault] += 1
        if fault == "429":
            return web.json_response(
                {"error": "rate limited"}, status=429, headers={"Retry-After": str(self.plan.retry_after)}
            )
        if fault == "500":
            return web.json_response({"error": "internal"}, status=500)
        if fault == "slow":
            # Cut short when the server stops, so that stopping never waits out a slow fault
            # (its client timed out long before).
            with suppress(TimeoutError):
                await asyncio.wait_for(self.closing.wait(), self.plan.slow_seconds)
            return web.json_response({"error": "too late"}, status=500)
        if fault == "drop":
            assert request.transport is not None
            request.transport.close()
            raise asyncio.CancelledError  # nothing is sent: the client sees a dropped connection
        if fault == "malformed":
            return web.Response(text='{"choices": [', content_type="application/json")
        return None  # no-logprobs and no-labels shape the 200 answer below

    async def chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = " ".join(m["content"] for m in body["messages"])
        item = self._item(text)
        response = await self._fault(request, item)
        if response is not None:
            return response
        fault = self.plan.fault(item, self.counts.requests[item])
        self.counts.bodies.setdefault(item, []).append(body)
        if item in self.plan.recover_on:
            fault = None if rung_of(body) == self.plan.recover_on[item] else self.plan.outside
        p = self.score(item)
        if fault == "no-logprobs" or not self.plan.logprobs:
            return web.json_response({"choices": [{"message": {"content": "high"}}]})
        if fault == "no-labels":
            top = [{"token": "maybe", "logprob": -0.1}, {"token": "perhaps", "logprob": -2.5}]
        else:
            # Label mass 0.9 split over case and space variants, the rest on other tokens.
            top = [
                {"token": " high", "logprob": math.log(0.6 * 0.9 * p)},
                {"token": "High", "logprob": math.log(0.4 * 0.9 * p)},
                {"token": " low", "logprob": math.log(0.7 * 0.9 * (1 - p))},
                {"token": "LOW", "logprob": math.log(0.3 * 0.9 * (1 - p))},
                {"token": " maybe", "logprob": math.log(0.1)},
            ][: body.get("top_logprobs", 20)]
        self.counts.successes[item] += 1
        return web.json_response(
            {
                "id": f"chat-{item}",
                "model": self.model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"content": "high"},
                        "logprobs": {"content": [{"token": "high", "top_logprobs": top}]},
                    }
                ],
                "usage": {"prompt_tokens": len(text) // 4, "completion_tokens": 1},
            }
        )

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        prompts = body["prompt"] if isinstance(body["prompt"], list) else [body["prompt"]]
        item = self._item(prompts[0])
        response = await self._fault(request, item)
        if response is not None:
            return response
        p = self.score(item)
        fault = self.plan.fault(item, self.counts.requests[item])
        if not self.plan.logprobs:
            fault = "no-logprobs"
        # The answers' log-likelihoods: softmax over the two gives p.
        answer_ll = [math.log(p), math.log(1 - p)]
        choices = []
        for index, prompt in enumerate(prompts):
            start = prompt.rindex("This interaction is")
            answer = 0 if "high-stakes" in prompt[start:] else 1
            words = re.findall(r"\S+\s*", prompt[start:])
            # The first echoed token covers the whole prompt, then one token per answer word,
            # then the one generated token (which scoring must ignore).
            offsets = [0] + [start + sum(len(w) for w in words[:k]) for k in range(len(words))]
            logprobs = [None] + [answer_ll[answer] / len(words)] * len(words)
            choice: dict[str, Any] = {"index": index, "text": prompt + " x"}
            if fault not in ("no-logprobs", "no-labels"):
                choice["logprobs"] = {
                    "tokens": ["<prompt>", *words, " x"],
                    "text_offset": [*offsets, len(prompt)],
                    "token_logprobs": [*logprobs, -0.5],
                }
            choices.append(choice)
        if fault in ("no-logprobs", "no-labels"):
            return web.json_response({"choices": choices})
        self.counts.successes[item] += 1
        return web.json_response(
            {"choices": choices, "usage": {"prompt_tokens": 100, "completion_tokens": 1}}
        )

    async def models(self, request: web.Request) -> web.StreamResponse:
        self.counts.models += 1
        return web.json_response({"data": [{"id": self.model, "object": "model"}]})

    async def stats(self, request: web.Request) -> web.StreamResponse:
        return web.json_response(
            {
                "requests": {str(k): v for k, v in self.counts.requests.items()},
                "successes": {str(k): v for k, v in self.counts.successes.items()},
                "faults": dict(self.counts.faults),
            }
        )


class RunningServer:
    """A FaultServer on 127.0.0.1 in a thread of its own (so that a synchronous test can drive
    a client in another event loop). Use as a context manager."""

    def __init__(self, plan: FaultPlan | None = None, *, port: int = 0, **kwargs: Any) -> None:
        self.server = FaultServer(plan, **kwargs)
        self.port = port  # 0: any free port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._runner: web.AppRunner | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._runner = web.AppRunner(self.server.app, handle_signals=False, access_log=None)
        self._loop.run_until_complete(self._runner.setup())
        site = web.TCPSite(self._runner, "127.0.0.1", self.port, backlog=1024)
        self._loop.run_until_complete(site.start())
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        self._loop.run_forever()

    def __enter__(self) -> RunningServer:
        self._thread.start()
        self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._runner is not None
        self._loop.call_soon_threadsafe(self.server.closing.set)
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@contextmanager
def server_process(folder: Path, plan: dict[str, Any]) -> Iterator[str]:
    """This file run as a server in a process of its own (not in the test's threads, so a test
    may kill clients beside it): yields its base URL, stops it at the end."""
    port_file = folder / "port"
    server = subprocess.Popen([sys.executable, __file__, str(port_file), json.dumps(plan)])
    try:
        deadline = time.monotonic() + 20
        while not (port_file.exists() and port_file.read_text().strip()):
            assert time.monotonic() < deadline, "the fault server did not start"
            assert server.poll() is None
            time.sleep(0.02)
        yield f"http://127.0.0.1:{int(port_file.read_text())}/v1"
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def main() -> None:
    """Serve until killed; write the port to PORT_FILE once listening."""
    port_file = Path(sys.argv[1])
    plan = FaultPlan.from_json(sys.argv[2]) if len(sys.argv) > 2 else FaultPlan()
    with RunningServer(plan) as running:
        port_file.write_text(str(running.port))
        threading.Event().wait()


if __name__ == "__main__":
    main()
