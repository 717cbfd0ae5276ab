from django.urls import path

from .api import views

urlpatterns = [
    path("v1/conversations", views.ConversationListCreateApi.as_view(), name="conversations"),
    path("v1/conversations/<str:conversation_id>/messages", views.ConversationMessagesApi.as_view(), name="conversation-messages"),
    path("v1/agent/runs/<str:run_id>/timeline", views.RunTimelineApi.as_view(), name="run-timeline"),
]
