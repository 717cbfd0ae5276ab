"""Prices (USD per million tokens) and a run's cost.

A model's price comes from the providers file / admin when given there, else from
``genai-prices`` (pydantic's maintained price database, bundled snapshot: no network), looked up
by the provider's name (``anthropic``, ``deepseek``, ``moonshotai``, ``zai`` …) or its base URL,
then by the model name alone. Ollama and mock runs cost nothing. An unknown price is ``None``:
the run records its tokens with cost 0 and ``pricing.source = "unknown"``.

The price is resolved when the run ends and stored on the run with its cost, so a later price
change never rewrites history.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from decimal import Decimal
from functools import lru_cache
from typing import Any

from .registry import ModelInfo, ProviderInfo

logger = logging.getLogger("orchestrator.providers")
_MILLION = Decimal(1_000_000)
_ZERO = Decimal(0)


@dataclass(frozen=True)
class Price:
    input: Decimal
    output: Decimal
    cache_read: Decimal | None = None
    cache_write: Decimal | None = None
    source: str = "file"

    @property
    def blended(self) -> Decimal:
        """One number to rank models by cost (input + output per million)."""
        return self.input + self.output

    def to_dict(self) -> dict[str, Any]:
        return {"input": str(self.input), "output": str(self.output),
                "cacheRead": None if self.cache_read is None else str(self.cache_read),
                "cacheWrite": None if self.cache_write is None else str(self.cache_write), "source": self.source}


FREE = Price(_ZERO, _ZERO, _ZERO, _ZERO, source="local")


def model_price(provider: ProviderInfo, model: ModelInfo) -> Price | None:
    if provider.kind in ("ollama", "mock"):
        return FREE
    if model.input_price is not None and model.output_price is not None:
        return Price(model.input_price, model.output_price, model.cache_read_price, model.cache_write_price,
                     source="file")
    known = _genai_price(provider.name, provider.display_url(), model.name)
    if known is None:
        return None
    return Price(model.input_price if model.input_price is not None else known.input,
                 model.output_price if model.output_price is not None else known.output,
                 model.cache_read_price if model.cache_read_price is not None else known.cache_read,
                 model.cache_write_price if model.cache_write_price is not None else known.cache_write,
                 source="genai-prices")


@lru_cache(maxsize=512)
def _genai_price(provider_name: str, base_url: str, model_name: str) -> Price | None:
    try:
        from genai_prices import Usage, calc_price
    except ImportError:  # pragma: no cover - a declared dependency
        return None
    # Priced at 100K tokens (below long-context price tiers, e.g. Sonnet's above 200K) x 10.
    attempts = ({"provider_id": provider_name}, {"provider_api_url": base_url}, {})
    for kwargs in attempts:
        if not any(kwargs.values()) and kwargs:
            continue
        try:
            def per_million(**tokens: int) -> Decimal:
                return Decimal(str(calc_price(Usage(**tokens), model_name, **kwargs).total_price)) * 10

            input_price = per_million(input_tokens=100_000)
            output_price = per_million(output_tokens=100_000)
            try:
                # genai-prices counts cached tokens inside input_tokens.
                cache_read = per_million(input_tokens=100_000, cache_read_tokens=100_000)
                cache_write = per_million(input_tokens=100_000, cache_write_tokens=100_000)
            except Exception:  # noqa: BLE001 - a model without cache prices
                cache_read = cache_write = None
            return Price(input_price, output_price, cache_read, cache_write, source="genai-prices")
        except LookupError:
            continue
        except Exception:  # noqa: BLE001 - a price database quirk must never fail a run
            logger.debug("genai-prices lookup failed for %s/%s", provider_name, model_name, exc_info=True)
            continue
    return None


def usage_tokens(usage: dict[str, Any]) -> dict[str, int]:
    """Token counts from a run's usage (Anthropic's names; Ollama reports input/output only)."""
    def n(key: str) -> int:
        value = usage.get(key)
        return int(value) if isinstance(value, int) and value > 0 else 0

    return {"input_tokens": n("input_tokens"), "output_tokens": n("output_tokens"),
            "cache_read_tokens": n("cache_read_input_tokens"), "cache_write_tokens": n("cache_creation_input_tokens")}


def cost_of(tokens: dict[str, int], price: Price | None) -> Decimal:
    """USD for these tokens. ``input_tokens`` excludes cached tokens (as Anthropic reports them);
    cache reads/writes without their own price are charged at the input price."""
    if price is None:
        return _ZERO
    total = (Decimal(tokens["input_tokens"]) * price.input + Decimal(tokens["output_tokens"]) * price.output
             + Decimal(tokens["cache_read_tokens"]) * (price.cache_read if price.cache_read is not None else price.input)
             + Decimal(tokens["cache_write_tokens"]) * (price.cache_write if price.cache_write is not None else price.input))
    return (total / _MILLION).quantize(Decimal("0.000001"))
