from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from agents_app.api import AgentListApi, HealthApi
from chat_app.ui import ApprovalsPageView, ChatPageView

urlpatterns = [
    path("health", HealthApi.as_view(), name="health"),
    path("api/v1/health", HealthApi.as_view(), name="api-health"),
    path("api/v1/agents", AgentListApi.as_view(), name="agents"),
    path("api/schema", SpectacularAPIView.as_view(), name="schema"),
    path("docs", SpectacularSwaggerView.as_view(url_name="schema"), name="docs"),
    path("redoc", SpectacularRedocView.as_view(url_name="schema"), name="redoc"),
    path("admin/", admin.site.urls),
    path("accounts/", include("django.contrib.auth.urls")),
    path("", ChatPageView.as_view(), name="chat-page"),
    path("approvals", ApprovalsPageView.as_view(), name="approvals-page"),
    path("", include("chat_app.urls")),
    path("", include("tools_app.urls")),
]

handler404 = "orchestrator_site.views.not_found"
handler500 = "orchestrator_site.views.server_error"
