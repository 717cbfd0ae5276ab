"""The browser chat page: a thin template view; everything else goes through the public API."""
from django.contrib.auth.mixins import LoginRequiredMixin
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from django.views.generic import TemplateView

from agents_app.selectors import agent_list


@method_decorator(ensure_csrf_cookie, name="dispatch")
class ChatPageView(LoginRequiredMixin, TemplateView):
    template_name = "chat.html"
    login_url = "/accounts/login/"

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), "agents": agent_list()}
