from django.urls import path

from .api import agent_chat, chat_stream, message_stream, tool_rules, views
from .api.assistant_ui import AssistantUiChatApi

urlpatterns = [
    path("v1/conversations", views.ConversationListCreateApi.as_view(), name="conversations"),
    path("v1/conversations/<str:conversation_id>", views.ConversationApi.as_view(), name="conversation"),
    path("v1/conversations/<str:conversation_id>/messages", views.ConversationMessagesApi.as_view(), name="conversation-messages"),
    path("v1/conversations/<str:conversation_id>/tool-rules", tool_rules.ConversationToolRulesApi.as_view(), name="conversation-tool-rules"),
    path("v1/conversations/<str:conversation_id>/tool-rules/<str:rule_id>", tool_rules.ConversationToolRuleApi.as_view(), name="conversation-tool-rule"),
    path("v1/agent/runs/<str:run_id>/timeline", views.RunTimelineApi.as_view(), name="run-timeline"),
    path("v1/agent/chat", agent_chat.AgentChatApi.as_view(), name="agent-chat"),
    path("v1/agent/runs/<str:run_id>/events", agent_chat.RunEventsApi.as_view(), name="run-events"),
    path("v1/agent/runs/<str:run_id>/cancel", agent_chat.RunCancelApi.as_view(), name="run-cancel"),
    # Seed 003 (its path has no /v1 prefix; the /v1 alias keeps the API surface uniform).
    path("conversations/<str:conversation_id>/messages/stream", message_stream.ConversationMessageStreamApi.as_view(), name="seed003-message-stream"),
    path("v1/conversations/<str:conversation_id>/messages/stream", message_stream.ConversationMessageStreamApi.as_view(), name="seed003-message-stream-v1"),
    path("api/v1/chat/stream", chat_stream.ChatStreamApi.as_view(), name="seed000-chat-stream"),
    path("chat", AssistantUiChatApi.as_view(), name="assistant-ui-chat"),
]

# --- providers, routing and usage (agents_app/providers, chat_app/usage.py) ---------------------
from agents_app.api_providers import ProviderDetailApi, ProviderListApi  # noqa: E402

from .api.usage import ProviderRecommendApi, UsageApi  # noqa: E402

urlpatterns += [
    path("v1/providers", ProviderListApi.as_view(), name="providers"),
    path("v1/providers/recommend", ProviderRecommendApi.as_view(), name="provider-recommend"),
    path("v1/providers/<str:name>", ProviderDetailApi.as_view(), name="provider-detail"),
    path("v1/usage", UsageApi.as_view(), name="usage"),
]
