"""The browser pages (chat at ``/``, approvals at ``/approvals``): thin template views.

Everything else goes through the public API. Model output is rendered in the page, so every
page answers with a strict Content-Security-Policy: scripts only from this origin's static
files (no inline script, no ``eval``), no plug-ins, no framing, images only from here or
``data:``. Even a sanitizer bug cannot run a script or leak a tracking pixel.
"""
from __future__ import annotations

from typing import Any

from django.contrib.auth.mixins import LoginRequiredMixin
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.generic import TemplateView

from agents_app.selectors import agent_list

CONTENT_SECURITY_POLICY = "; ".join([
    "default-src 'self'",
    "script-src 'self'",
    "style-src 'self'",
    "img-src 'self' data:",
    "font-src 'self'",
    "connect-src 'self'",
    "object-src 'none'",
    "base-uri 'none'",
    "form-action 'self'",
    "frame-ancestors 'none'",
])


class _BrowserPage(LoginRequiredMixin, TemplateView):
    login_url = "/accounts/login/"

    def render_to_response(self, context: dict[str, Any], **kwargs: Any):
        response = super().render_to_response(context, **kwargs)
        response["Content-Security-Policy"] = CONTENT_SECURITY_POLICY
        response["X-Content-Type-Options"] = "nosniff"
        response["Referrer-Policy"] = "same-origin"
        return response


@method_decorator(ensure_csrf_cookie, name="dispatch")
class ChatPageView(_BrowserPage):
    template_name = "chat.html"

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "agents": agent_list(), "page": "chat"}


@method_decorator(ensure_csrf_cookie, name="dispatch")
class ApprovalsPageView(_BrowserPage):
    """Every pending tool call of the user, across conversations, with the same decision buttons."""

    template_name = "approvals.html"

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "page": "approvals"}
