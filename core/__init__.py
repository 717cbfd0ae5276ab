"""The leaf core: canonical run events, the error hierarchy and its code vocabulary, the doorbell.

Nothing here imports a Django model or another app, so every layer may import it:
core ← agents_app ← tools_app ← chat_app (runs, transports) ← orchestrator_site (wiring).
"""
