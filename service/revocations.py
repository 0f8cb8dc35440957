# Revoked API keys, pushed: revocation commits in Postgres, then the key hashes go into a Redis
# set and onto a channel, and every API process refuses them at once (api/revoked_keys.py),
# before it looks at its key cache. Without the push (Redis away when the key was revoked) the
# cache bounds it: FLEETLM_API_KEY_CACHE_S while Postgres answers, FLEETLM_API_KEY_STALE_S while
# it does not (docs/operations.md#revoking-a-key).
from __future__ import annotations

import redis

REVOKED_KEYS_SET = "fleetlm:revoked_keys"  # key hashes (metering.keys.hash_key), kept
REVOKED_CHANNEL = "fleetlm:revoked_keys:new"  # each newly revoked hash, published


def push_revoked(client: redis.Redis, key_hashes: list[str]) -> None:
    """Into the set (read by API processes that start or reconnect) and onto the channel (read
    by those listening now), in that order, so no API process misses one."""
    if not key_hashes:
        return
    pipe = client.pipeline(transaction=False)
    pipe.sadd(REVOKED_KEYS_SET, *key_hashes)
    for digest in key_hashes:
        pipe.publish(REVOKED_CHANNEL, digest)
    pipe.execute()
