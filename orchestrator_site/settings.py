"""Django settings for the Agent Orchestrator.

Every environment variable the service reads is read here, once, and listed in the README's
configuration table with its default. The embedded defaults (SQLite, in-memory channel layer,
offline ``mock`` engine) run everything on a machine with nothing but Python.
"""
from __future__ import annotations

import os
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

BASE_DIR = Path(__file__).resolve().parent.parent


def env(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    return float(raw) if raw not in (None, "") else default


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    return int(raw) if raw not in (None, "") else default


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


DEBUG = env_bool("DEBUG", False)
# A fixed development key is fine for the embedded defaults; production must set its own.
SECRET_KEY = env("DJANGO_SECRET_KEY", "dev-insecure-change-me-0123456789abcdefghijklmnopqrstuvwxyz")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]", "testserver"])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "corsheaders",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "channels",
    "agents_app",
    "chat_app",
    "tools_app",
]

# Django's own middleware, adapted to run inline (no thread hop per hook) on API paths: see
# orchestrator_site/middleware.py.
MIDDLEWARE = [
    "corsheaders.middleware.CorsMiddleware",
    "orchestrator_site.middleware.SecurityMiddleware",
    "orchestrator_site.middleware.SessionMiddleware",
    "orchestrator_site.middleware.CommonMiddleware",
    "orchestrator_site.middleware.CsrfViewMiddleware",
    "orchestrator_site.middleware.AuthenticationMiddleware",
    "orchestrator_site.middleware.MessageMiddleware",
    "orchestrator_site.middleware.XFrameOptionsMiddleware",
    "orchestrator_site.middleware.JsonErrorMiddleware",
]
# No GZip middleware on purpose: it would buffer server-sent events.

ROOT_URLCONF = "orchestrator_site.urls"
ASGI_APPLICATION = "orchestrator_site.asgi.application"
WSGI_APPLICATION = "orchestrator_site.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}")
# Persistent connections are not for async code: an idle open stream must not hold one.
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Django's backend, with this process's writers queued on a lock instead of SQLite's
    # sleeping busy handler (see orchestrator_site/db_backends/sqlite3/base.py).
    DATABASES["default"]["ENGINE"] = "orchestrator_site.db_backends.sqlite3"
    # Concurrent runs are the normal case: WAL and a busy timeout avoid "database is locked".
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "timeout": 20,
            "transaction_mode": "IMMEDIATE",
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
elif DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql"):
    # A commit waits for its WAL to reach the disk by default (a production database keeps what it
    # acknowledged). "off" trades that for latency, like SQLite's synchronous=NORMAL: a crash of
    # the database server may then lose the last fraction of a second of commits (never corrupt).
    DB_SYNCHRONOUS_COMMIT = env("DB_SYNCHRONOUS_COMMIT", "on").strip().lower()
    if DB_SYNCHRONOUS_COMMIT not in {"on", "off", "local", "remote_write", "remote_apply"}:
        raise ImproperlyConfigured(
            f"DB_SYNCHRONOUS_COMMIT={DB_SYNCHRONOUS_COMMIT!r}: use on, off, local, remote_write or remote_apply.")
    options = DATABASES["default"].setdefault("OPTIONS", {})
    options["options"] = f"{options.get('options', '')} -c synchronous_commit={DB_SYNCHRONOUS_COMMIT}".strip()
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
# Threads that do the database work of runs and streaming requests; each keeps its connection:
# the process's connection pool. Streams never hold one.
DB_THREADS = env_int("DB_THREADS", 8)

# --- Channels -------------------------------------------------------------------------------
REDIS_URL = env("REDIS_URL")
REDIS_MAX_CONNECTIONS = env_int("REDIS_MAX_CONNECTIONS", 2000)
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            # redis-py 8 reads with a 5 s socket timeout by default, the same as channels-redis's
            # blocking 5 s BZPOPMIN: the receive then races its own timeout (reads fail, and a
            # message popped at the edge is lost). A longer socket timeout removes the race.
            # redis-py's pool refuses a command beyond max_connections (100 by default) instead
            # of waiting: a burst of run starts (a group_add each) then lost rings.
            "CONFIG": {"hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5,
                                  "max_connections": REDIS_MAX_CONNECTIONS}],
                       "capacity": 1000, "expiry": 60},
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}

# --- Auth, passwords, i18n, static ----------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True
STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

# Requests larger than this are refused with 413 (JSON body).
DATA_UPLOAD_MAX_MEMORY_SIZE = env_int("MAX_REQUEST_BYTES", 1_048_576)

# --- CORS: all origins by default (seed 000, local front-end development) --------------------
CORS_ALLOWED_ORIGINS = env_list("CORS_ALLOWED_ORIGINS", [])
CORS_ALLOW_ALL_ORIGINS = not CORS_ALLOWED_ORIGINS
CORS_ALLOW_CREDENTIALS = True
CORS_EXPOSE_HEADERS = ["x-vercel-ai-ui-message-stream", "x-run-id", "x-conversation-id"]
CSRF_TRUSTED_ORIGINS = [o for o in CORS_ALLOWED_ORIGINS if o.startswith("http")]

# Seconds a token's user / an agent's spec may be reused without a query. Changes made in this
# process (deleting a token, saving a user or an agent) take effect at once; other processes see
# them within this many seconds. 0 turns the caches off.
AUTH_TOKEN_CACHE_SECONDS = env_float("AUTH_TOKEN_CACHE_SECONDS", 10.0)
AGENT_CACHE_SECONDS = env_float("AGENT_CACHE_SECONDS", 5.0)

# --- REST framework and OpenAPI -------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "orchestrator_site.auth.BearerOrTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    # DRF's defaults, with its JSON parser's per-request set-up taken out (orchestrator_site/parsers.py).
    "DEFAULT_PARSER_CLASSES": [
        "orchestrator_site.parsers.JSONBodyParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "EXCEPTION_HANDLER": "orchestrator_site.errors.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "AI Agent Orchestrator",
    "VERSION": "2.0.0",
    "DESCRIPTION": "Runs AI agents through interchangeable engines; REST, SSE, WebSocket and ACP.",
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Providers and engines ------------------------------------------------------------------
ANTHROPIC_API_KEY = env("ANTHROPIC_AUTH_TOKEN") or env("ANTHROPIC_API_KEY")
# The seed's custom gateway sends the token as a bearer token; the official API takes x-api-key.
ANTHROPIC_AUTH_IS_BEARER = bool(env("ANTHROPIC_AUTH_TOKEN"))
ANTHROPIC_BASE_URL = env("ANTHROPIC_BASE_URL") or None
ANTHROPIC_MODEL = env("ANTHROPIC_MODEL", "claude-sonnet-4-5")
ANTHROPIC_MAX_TOKENS = env_int("ANTHROPIC_MAX_TOKENS", 4096)
# Overall deadline for one Messages API request (the whole streamed answer), in seconds.
ANTHROPIC_TIMEOUT = env_float("ANTHROPIC_TIMEOUT", 120.0)
# Passed to the SDK, which retries 408/409/429/5xx/529 itself; nothing else retries.
ANTHROPIC_MAX_RETRIES = env_int("ANTHROPIC_MAX_RETRIES", 2)
# Connections the shared Anthropic client may open at once (one per concurrently streaming run).
ANTHROPIC_MAX_CONNECTIONS = env_int("ANTHROPIC_MAX_CONNECTIONS", 2000)
# Clients (connection pools) those connections are spread over, the least busy first (see lease_client).
ANTHROPIC_POOL_SHARDS = env_int("ANTHROPIC_POOL_SHARDS", 8)
OLLAMA_URL = env("OLLAMA_URL", "http://localhost:11434")
OLLAMA_MODEL = env("OLLAMA_MODEL", "gpt-oss-20b")
OLLAMA_TIMEOUT = env_float("OLLAMA_TIMEOUT", 60.0)
# Whether an Ollama answers (GET /api/tags) is cached this long; without one, runs use mock.
OLLAMA_HEALTH_TTL = env_float("OLLAMA_HEALTH_TTL", 5.0)
OLLAMA_PROBE_TIMEOUT = env_float("OLLAMA_PROBE_TIMEOUT", 2.0)
DEFAULT_AGENT_ROLE = env("DEFAULT_AGENT_ROLE", "orchestrator")

# --- Provider registry, health, failover (agents_app/providers) ------------------------------
# The providers file `load_providers` (and `serve`) imports; absent: only the env's providers.
PROVIDERS_FILE = Path(env("PROVIDERS_FILE", str(BASE_DIR / "providers.yaml")))
# A provider's active health check (models list / Ollama tags) is cached this long, in seconds.
PROVIDER_HEALTH_TTL = env_float("PROVIDER_HEALTH_TTL", 30.0)
PROVIDER_PROBE_TIMEOUT = env_float("PROVIDER_PROBE_TIMEOUT", 3.0)
# Passive health: cooldown after an unreachable provider or this many failures in a row.
PROVIDER_COOLDOWN_SECONDS = env_float("PROVIDER_COOLDOWN_SECONDS", 30.0)
PROVIDER_FAILURE_THRESHOLD = env_int("PROVIDER_FAILURE_THRESHOLD", 3)
# The longest cooldown a Retry-After may impose.
PROVIDER_COOLDOWN_MAX = env_float("PROVIDER_COOLDOWN_MAX", 600.0)
# Candidates a run may try (the chosen one plus failovers).
PROVIDER_MAX_ATTEMPTS = env_int("PROVIDER_MAX_ATTEMPTS", 3)
# How long the router's decision for the same request shape is reused (agents_app/router.py:
# never with budgets, spend limits or routing rules in play; provider health changes forget it).
ROUTE_MEMO_SECONDS = env_float("ROUTE_MEMO_SECONDS", 1.0)

# --- Runs, streams, confirmations -----------------------------------------------------------
WORKSPACES_ROOT = Path(env("WORKSPACES_ROOT", str(BASE_DIR / "workspaces"))).resolve()
SSE_PING_INTERVAL = env_float("SSE_PING_INTERVAL", 15.0)
# Token-authenticated requests to the streaming views skip Django's middleware path when it has
# nothing to do for them (orchestrator_site/stream_lane.py); 0 sends every request through it.
STREAM_LANE = env_bool("STREAM_LANE", True)
# A run's readers run ahead of other ready work on the event loop (core/scheduling.py).
LOOP_OUTPUT_FIRST = env_bool("LOOP_OUTPUT_FIRST", True)
RUN_TIMEOUT = env_float("RUN_TIMEOUT", 600.0)
CONFIRMATION_TIMEOUT = env_float("CONFIRMATION_TIMEOUT", 300.0)
# How often a waiting run re-reads its confirmation row in case a doorbell was lost.
CONFIRMATION_RECHECK_INTERVAL = env_float("CONFIRMATION_RECHECK_INTERVAL", 1.0)
# A live run's lease: renewed by its process every third of this; a run whose lease ran out is
# reaped (failed, its pending confirmations expired), e.g. after its server was restarted.
RUN_LEASE_SECONDS = env_float("RUN_LEASE_SECONDS", 30.0)
# A new run's start rows (its conversation, the run, the user message, agent.start) are handed to
# the group-commit writer this long after the run starts — or at once when something needs them
# (an event batch, the run's end, a read of the run in this process) — so the writer thread does
# not compete for the GIL with the run's provider request and the reading of its first response.
# Another process sees the run up to this much later (a re-attach or cancel there waits for it:
# services.run_read). 0: right after the run task's first step. 50 ms measured better than 20 at
# ten streams at once (the write then comes after their first deltas, not among them).
RUN_RECORD_DELAY = env_float("RUN_RECORD_DELAY", 0.05)
# ... and while other runs of this process are still waiting for their model's first output (a
# burst of starts), later still, up to this many seconds after the run started: the burst's rows
# are then written after its first outputs, not among them.
RUN_RECORD_MAX_DELAY = env_float("RUN_RECORD_MAX_DELAY", 0.25)
# The cyclic garbage collector's thresholds in `manage.py serve` (generation 0, 1, 2; "default":
# CPython's 700,10,10). Each stream leaves few cycles but allocates many short-lived containers;
# at CPython's defaults the collector ran ~1,500 young and a dozen full collections (40-100 ms
# each) per 1,200 benchmark streams. 5000,20,100 halved its time and removed the full pauses
# (bench/RESULTS.md); memory still in cycles is reclaimed, only in larger, rarer sweeps.
GC_THRESHOLDS = env("GC_THRESHOLDS", "5000,20,100")
# A stream that starts a run (the HTTP dialects) sends its response head and opening frames with
# the run's first output (the model's first event), or after this many seconds if the model is
# slower: the provider request goes out first and the head, the opening frames and the first
# text leave in one write, as a bare relay has it. 0: the head and opening frames go at once.
STREAM_OPENING_HOLD = env_float("STREAM_OPENING_HOLD", 0.25)
# Recorded events are written in batches: at most this long after they were streamed.
RUN_EVENT_FLUSH_INTERVAL = env_float("RUN_EVENT_FLUSH_INTERVAL", 0.25)

# --- Tools ----------------------------------------------------------------------------------
TOOL_TIMEOUT = env_float("TOOL_TIMEOUT", 30.0)
TOOL_OUTPUT_LIMIT = env_int("TOOL_OUTPUT_LIMIT", 50_000)
WEB_FETCH_TIMEOUT = env_float("WEB_FETCH_TIMEOUT", 10.0)
WEB_FETCH_MAX_BYTES = env_int("WEB_FETCH_MAX_BYTES", 1_000_000)
WEB_FETCH_ALLOW_PRIVATE = env_bool("WEB_FETCH_ALLOW_PRIVATE", False)
MCP_FILESYSTEM_URL = env("MCP_FILESYSTEM_URL", "http://localhost:8001")
MCP_TRADER_URL = env("MCP_TRADER_URL", "http://localhost:8002")
MCP_BRIDGE_TIMEOUT = env_float("MCP_BRIDGE_TIMEOUT", 30.0)
# Agent/request MCP servers (tools_app/mcp_client.py): time to start or reach one and list its tools.
MCP_CONNECT_TIMEOUT = env_float("MCP_CONNECT_TIMEOUT", 30.0)
TOOL_ENV_ALLOWLIST = env_list("TOOL_ENV_ALLOWLIST", ["PATH", "LANG", "LC_ALL", "TZ"])

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "loggers": {
        "orchestrator": {"handlers": ["console"], "level": env("LOG_LEVEL", "INFO")},
        "django.request": {"handlers": ["console"], "level": "ERROR"},
        # httpx logs every provider request at INFO ("HTTP Request: POST …"): a line per model call
        # that the run's own record already holds (~1.5% of the event loop's time under fifty
        # concurrent streams). Its warnings and errors still show.
        "httpx2": {"level": "WARNING"},
    },
}
