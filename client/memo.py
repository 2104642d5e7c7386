"""Memoization: the same true value in the same campaign always gives the same report.

As RAPPOR's permanent randomized response (Erlingsson, Pihur and Korolova,
CCS 2014), the noise for a (campaign, true value) pair is drawn once and
reused, so a server that collects the same value again and again cannot
average the noise away. Here nothing is stored to achieve it: the noise is
*derived* from the user's 32-byte secret with HMAC-SHA256,

    key    = HMAC(secret, "ldp-collect/memo/v1" || campaign id || spec hash || input index)
    block  = HMAC(key, counter)           counter = 0, 1, 2, ... (8 bytes, big-endian)

and the blocks form the bit stream that the mechanism's exact sampler
(:meth:`shared.mechanisms.Mechanism.perturb_index`) reads through
``getrandbits``. HMAC-SHA256 is a pseudo-random function, so without the
secret the stream cannot be told from uniform bits and the report has the
mechanism's exact distribution; with the same inputs it is the same report.
The input index is the mechanism's encoding of the true value (the label's
position, or for locations the grid cell), so two raw coordinates in one cell
share their report. Fields are length-prefixed so that no two different
inputs give the same message.

The ledger needs to know whether a value was reported before without storing
the value: it keeps :func:`value_tag`, another HMAC under the secret with
its own label.

A report's id is derived the same way, from the campaign, the spec hash and the
reporting period (:func:`report_id`): the device's reports within one period
carry one id, which the server counts once, and ids of different periods look
unrelated to anyone without the secret. Whoever holds the whole state directory, secret included, can
test candidate values against those tags, so the directory is as sensitive as
the answers themselves and is kept readable by its owner only.
"""

from __future__ import annotations

import hmac
import uuid

SECRET_BYTES = 32
_MEMO_LABEL = b"ldp-collect/memo/v1"
_SEEN_LABEL = b"ldp-collect/seen/v1"
_REPORT_ID_LABEL = b"ldp-collect/report-id/v1"


def _fields(*parts: bytes) -> bytes:
    return b"".join(len(part).to_bytes(4, "big") + part for part in parts)


def _message(label: bytes, campaign_id: str, spec_hash: str, index: int) -> bytes:
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"the input index must be an integer >= 0, got {index!r}")
    return _fields(label, campaign_id.encode("utf-8"), spec_hash.encode("ascii"), b"%d" % index)


def _check_secret(secret: bytes) -> None:
    if not isinstance(secret, bytes) or len(secret) != SECRET_BYTES:
        raise ValueError(f"the user secret must be {SECRET_BYTES} bytes")


class HmacRandom:
    """A deterministic ``getrandbits`` source: HMAC-SHA256 in counter mode under ``key``.

    It offers only what :class:`shared.rng.RandomSource` asks for. ``getrandbits(k)``
    consumes ``ceil(k / 8)`` fresh bytes and keeps their top ``k`` bits, so the
    result is uniform on ``[0, 2**k)`` when the bytes are.
    """

    def __init__(self, key: bytes):
        if not isinstance(key, bytes) or len(key) < 16:
            raise ValueError("the key must be at least 16 bytes")
        self._key = key
        self._counter = 0
        self._buffer = b""

    def _take(self, n: int) -> bytes:
        while len(self._buffer) < n:
            block = hmac.digest(self._key, self._counter.to_bytes(8, "big"), "sha256")
            self._counter += 1
            self._buffer += block
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out

    def getrandbits(self, k: int) -> int:
        if k < 0:
            raise ValueError("number of bits must be non-negative")
        if k == 0:
            return 0
        n = (k + 7) // 8
        return int.from_bytes(self._take(n), "big") >> (8 * n - k)


def memo_rng(secret: bytes, campaign_id: str, spec_hash: str, index: int) -> HmacRandom:
    """The bit stream that perturbs input ``index`` in this campaign, for this user."""
    _check_secret(secret)
    key = hmac.digest(secret, _message(_MEMO_LABEL, campaign_id, spec_hash, index), "sha256")
    return HmacRandom(key)


def value_tag(secret: bytes, campaign_id: str, spec_hash: str, index: int) -> str:
    """A keyed fingerprint of (campaign, true value) for the ledger; not the value itself."""
    _check_secret(secret)
    return hmac.digest(secret, _message(_SEEN_LABEL, campaign_id, spec_hash, index), "sha256").hex()


def report_id(secret: bytes, campaign_id: str, spec_hash: str, period: str) -> str:
    """The id of this user's report in a campaign's period (a period key such as "2025-W03").

    A UUID (version 4 in form, its other 122 bits from HMAC-SHA256 under the secret):
    the same for every report of the period, unrelated across periods and campaigns.
    """
    _check_secret(secret)
    message = _fields(
        _REPORT_ID_LABEL,
        campaign_id.encode("utf-8"),
        spec_hash.encode("ascii"),
        period.encode("utf-8"),
    )
    return str(uuid.UUID(bytes=hmac.digest(secret, message, "sha256")[:16], version=4))
