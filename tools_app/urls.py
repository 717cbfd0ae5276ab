from django.urls import path

from . import api

urlpatterns = [
    path("v1/tool-confirmations", api.ToolConfirmationListApi.as_view(), name="tool-confirmations"),
    path("v1/tool-confirmations/<str:confirmation_id>/approve", api.ToolConfirmationApproveApi.as_view(),
         name="tool-confirmation-approve"),
    path("v1/tool-confirmations/<str:confirmation_id>/deny", api.ToolConfirmationDenyApi.as_view(),
         name="tool-confirmation-deny"),
]
