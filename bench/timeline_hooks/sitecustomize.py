"""Timestamp hooks for ``bench/round_timeline.py`` (loaded through PYTHONPATH; inert without
``TIMELINE_FILE``).

Each hook appends ``(time.perf_counter(), phase)`` to a list in memory; SIGUSR2 writes the list
to ``TIMELINE_FILE`` as JSON. perf_counter is CLOCK_MONOTONIC on Linux, so the servers' marks
and the client's round start share one clock. The hooks wrap, after daphne's protocol module is
imported (so the twisted reactor is installed first, as daphne needs):

- ``request``: daphne's ``WebRequest.process`` (the whole request has arrived);
- ``response head`` / ``first body`` / ``first text``: daphne's ``WebRequest.handle_reply`` for
  the ASGI response start, the first non-empty body, the first body holding a text delta
  (``"tok "``, the fake upstream's delta text);
- ``provider request`` / ``provider response``: httpcore's HTTP/1.1 connection starting to send
  the request headers, and having read the response headers (both servers use the same SDK);
  ``provider body sent``: httpcore has written the request body (the upstream can answer; with
  the project's one-write transport the whole request leaves with the read that follows at once).

With ``TIMELINE_STEPS`` set, SIGUSR1 also starts recording every callback the event loop runs
(``round_timeline.py --steps``). SIGUSR2 writes ``{"marks": [...], "steps": [...]}``.
"""
import os

if os.environ.get("TIMELINE_FILE"):
    import importlib.abc
    import importlib.util
    import json
    import signal
    import sys
    import time

    _MARKS: list = []
    _STEPS: list = []
    _now = time.perf_counter

    def _mark(phase: str) -> None:
        _MARKS.append((_now(), phase))

    def _dump(*_) -> None:
        with open(os.environ["TIMELINE_FILE"], "w") as out:
            json.dump({"marks": _MARKS, "steps": _STEPS}, out)

    signal.signal(signal.SIGUSR2, _dump)

    if os.environ.get("TIMELINE_STEPS"):
        # Every callback the event loop runs, once SIGUSR1 turned recording on: its start time
        # and what it is (a task's step named by the innermost frames it resumes in, else the
        # callback's name). A step lasts until the next one starts (GC, other threads holding
        # the GIL and select() land in the step before them).
        import asyncio.events

        _recording = [False]

        def _record(*_) -> None:
            _recording[0] = True

        signal.signal(signal.SIGUSR1, _record)

        def _step_name(handle) -> str:
            callback = getattr(handle, "_callback", None)
            owner = getattr(callback, "__self__", None)
            if owner is not None and hasattr(owner, "get_coro"):
                frames, coro = [], owner.get_coro()
                while coro is not None:
                    frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None) or getattr(coro, "ag_frame", None)
                    if frame is not None:
                        frames.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
                    coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None) or getattr(coro, "ag_await", None)
                return "task[" + ">".join(frames[-4:]) + "]"
            return getattr(callback, "__qualname__", None) or repr(callback)[:80]

        _handle_run = asyncio.events.Handle._run

        def _traced_run(self):
            if _recording[0]:
                _STEPS.append((_now(), _step_name(self)))
            return _handle_run(self)

        asyncio.events.Handle._run = _traced_run

    def _patch() -> None:
        import daphne.http_protocol as protocol
        import httpcore2._async.http11 as http11

        process = protocol.WebRequest.process
        handle_reply = protocol.WebRequest.handle_reply

        def traced_process(self, *args, **kwargs):
            _mark("request")
            return process(self, *args, **kwargs)

        def traced_reply(self, message):
            body = message.get("body") or b""
            if message.get("type") == "http.response.start":
                _mark("response head")
            elif body and not getattr(self, "_timeline_body", False):
                self._timeline_body = True
                _mark("first body")
            if b"tok " in body and not getattr(self, "_timeline_text", False):
                self._timeline_text = True
                _mark("first text")
            return handle_reply(self, message)

        protocol.WebRequest.process = traced_process
        protocol.WebRequest.handle_reply = traced_reply
        send_headers = http11.AsyncHTTP11Connection._send_request_headers
        receive_headers = http11.AsyncHTTP11Connection._receive_response_headers

        async def traced_send(self, *args, **kwargs):
            _mark("provider request")
            return await send_headers(self, *args, **kwargs)

        async def traced_receive(self, *args, **kwargs):
            result = await receive_headers(self, *args, **kwargs)
            _mark("provider response")
            return result

        send_body = http11.AsyncHTTP11Connection._send_request_body

        async def traced_body(self, *args, **kwargs):
            result = await send_body(self, *args, **kwargs)
            _mark("provider body sent")
            return result

        http11.AsyncHTTP11Connection._send_request_body = traced_body
        http11.AsyncHTTP11Connection._send_request_headers = traced_send
        http11.AsyncHTTP11Connection._receive_response_headers = traced_receive

    class _AfterDaphneProtocol(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name != "daphne.http_protocol":
                return None
            sys.meta_path.remove(self)
            spec = importlib.util.find_spec(name)
            exec_module = spec.loader.exec_module

            def exec_then_patch(module):
                exec_module(module)
                _patch()

            spec.loader.exec_module = exec_then_patch
            return spec

    sys.meta_path.insert(0, _AfterDaphneProtocol())
