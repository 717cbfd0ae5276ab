from django.apps import AppConfig


class AgentsAppConfig(AppConfig):
    default_auto_field = 'django.db.models.BigAutoField'
    name = 'agents_app'
    verbose_name = 'Agents'

    def ready(self) -> None:
        """An edited agent is used by the very next run in this process: drop the cached specs."""
        from django.db.models.signals import post_delete, post_save

        from .models import Agent
        from .selectors import agent_cache_clear

        post_save.connect(agent_cache_clear, sender=Agent, dispatch_uid="agent-cache-save")
        post_delete.connect(agent_cache_clear, sender=Agent, dispatch_uid="agent-cache-delete")
