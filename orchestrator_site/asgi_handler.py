"""Django's ASGI handler without the thread hop that ends every request.

Django ends each ASGI request with ``await sync_to_async(response.close)()``: the
``request_finished`` receivers (close the thread's old database connections, close caches, reset
the URLconf) run in the request's thread-sensitive thread, which asgiref starts for that one
call and joins when the request ends — for a request that never used that thread (every
streaming endpoint: their database work runs on the database pool, the middleware runs inline
on API paths) a thread start, two cross-thread hand-offs and a join, before the next request's
work. When no sync code of the request ran in such a thread, there is no connection of its to
close there, and the receivers run inline on the event loop (whose thread holds no database
connection: the ORM refuses to run there). A request that did use its thread (a sync DRF view,
the admin) is closed exactly as Django does.
"""
from __future__ import annotations

import asyncio

from asgiref.sync import SyncToAsync, sync_to_async
from django.core import signals
from django.core.exceptions import RequestAborted
from django.core.handlers.asgi import ASGIHandler, get_script_prefix
from django.urls import set_script_prefix


def _used_request_thread() -> bool:
    context = SyncToAsync.thread_sensitive_context.get(None)
    return context is None or context in SyncToAsync.context_to_thread_executor


async def _close(response) -> None:
    if _used_request_thread():
        await sync_to_async(response.close)()
    else:
        response.close()


class OrchestratorASGIHandler(ASGIHandler):
    async def handle(self, scope, receive, send):
        """Django 5.2's ``ASGIHandler.handle``; only the response's close differs (see above)."""
        try:
            body_file = await self.read_body(receive)
        except RequestAborted:
            return
        set_script_prefix(get_script_prefix(scope))
        await signals.request_started.asend(sender=self.__class__, scope=scope)
        request, error_response = self.create_request(scope, body_file)
        if request is None:
            body_file.close()
            await self.send_response(error_response, send)
            await _close(error_response)
            return

        async def process_request(request, send):
            response = await self.run_get_response(request)
            try:
                await self.send_response(response, send)
            except asyncio.CancelledError:
                pass  # the client disconnected during send_response
            return response

        tasks = [
            asyncio.create_task(self.listen_for_disconnect(receive)),
            asyncio.create_task(process_request(request, send)),
        ]
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for task in tasks:
            if task.done():
                try:
                    task.result()
                except RequestAborted:
                    pass
                except AssertionError:
                    body_file.close()
                    raise
            else:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
        try:
            response = tasks[1].result()
        except asyncio.CancelledError:
            await signals.request_finished.asend(sender=self.__class__)
        else:
            await _close(response)
        body_file.close()
