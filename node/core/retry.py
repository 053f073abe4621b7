"""Retry timing for `default` nacks (docs/semantics.md "Retry policy (the timing of `default` nacks)").

The jitter must be the same on every node, in every run and every Python process, so it uses
BLAKE2b rather than Python's salted `hash()`:

    H(job_id, attempt) = int.from_bytes(blake2b(f"{job_id}:{attempt}".encode("utf-8"),
                                                digest_size=8).digest(), "big")
    delay = capped - H(job_id, attempt) % (capped // 4 + 1)

so the delay lies in [capped - capped // 4, capped]: up to 25 % subtracted.
"""
from __future__ import annotations

from hashlib import blake2b

_MAX_SHIFT = 62   # base << 62 is beyond any cap a config allows; keeps the number small


def jitter_hash(job_id: str, attempt: int) -> int:
    return int.from_bytes(blake2b(f"{job_id}:{attempt}".encode("utf-8"), digest_size=8).digest(), "big")


def policy_delay_ms(job_id: str, attempt: int, base_ms: int, backoff: str,
                    max_ms: int, horizon_ms: int) -> int:
    """Delay before the next attempt after a `default` nack of delivery `attempt`."""
    if base_ms <= 0:
        return 0
    if backoff == "exponential":
        grown = base_ms << min(max(attempt - 1, 0), _MAX_SHIFT)
    else:
        grown = base_ms
    capped = min(grown, max_ms, horizon_ms)
    return capped - jitter_hash(job_id, attempt) % (capped // 4 + 1)
