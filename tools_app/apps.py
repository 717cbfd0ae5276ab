from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    default_auto_field = 'django.db.models.BigAutoField'
    name = 'tools_app'
    verbose_name = 'Tools'

    def ready(self) -> None:
        """A changed MCP server or agent link counts from the next run in this process."""
        from django.db.models.signals import post_delete, post_save

        from .mcp_policy import mcp_links_cache_clear
        from .models import AgentMcpServer, McpServer

        for model in (McpServer, AgentMcpServer):
            post_save.connect(mcp_links_cache_clear, sender=model, dispatch_uid=f"mcp-links-save-{model.__name__}")
            post_delete.connect(mcp_links_cache_clear, sender=model, dispatch_uid=f"mcp-links-delete-{model.__name__}")
