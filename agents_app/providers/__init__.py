"""Providers: where a model runs (Anthropic, Anthropic-compatible APIs, Ollama), and how the
router chooses among them.

- :mod:`.registry`: the providers and their models as plain frozen data (database rows from
  ``PROVIDERS_FILE`` or the admin, plus the implicit providers the environment configures:
  ``ANTHROPIC_*`` and ``OLLAMA_URL``), and the :class:`ProviderTarget` an engine connects to.
- :mod:`.config`: the providers file and its idempotent import (``manage.py load_providers``).
- :mod:`.health`: active probes (cached) and passive health from real traffic (cooldowns).
- :mod:`.pricing`: USD per million tokens (the file, else ``genai-prices``), a run's cost.
- :mod:`.routing`: task classification, routing rules, budgets, the candidate list with its rationale.
"""
