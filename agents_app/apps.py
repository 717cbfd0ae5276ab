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
        # Likewise the provider registry (providers, their models, routing rules, budgets).
        from .models import Budget, Provider, ProviderModel, RoutingRule
        from .providers.registry import registry_cache_clear

        for model in (Provider, ProviderModel, RoutingRule, Budget):
            post_save.connect(registry_cache_clear, sender=model, dispatch_uid=f"provider-registry-save-{model.__name__}")
            post_delete.connect(registry_cache_clear, sender=model,
                                dispatch_uid=f"provider-registry-delete-{model.__name__}")
