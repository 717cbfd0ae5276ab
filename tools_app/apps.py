from django.apps import AppConfig


class ToolsAppConfig(AppConfig):
    default_auto_field = 'django.db.models.BigAutoField'
    name = 'tools_app'
    verbose_name = 'Tools'
