"""Token ids → text pieces for the token view, when something can tell.

boltrl never re-tokenizes, and the dashboard only *decodes* for display: each sampled id
becomes its own piece so it can be coloured by its logprob. Calls served by
``boltrl.testing.ScriptedBackend`` (known by their template hash) have UTF-8 bytes as ids;
otherwise a tokenizer named by ``--tokenizer`` (a Hugging Face name or path; needs
``transformers``) decodes them. Without either the view shows the ids themselves.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any

from boltrl.records import LLMCall

log = logging.getLogger(__name__)

Decoder = Callable[[Sequence[int]], list[str]]


def _bytes_pieces(ids: Sequence[int]) -> list[str]:
    out = []
    for i in ids:
        b = bytes([i]) if 0 <= i < 256 else b"?"
        out.append(b.decode("utf-8") if b.isascii() else f"\\x{i:02x}")
    return out


class TokenDecoder:
    """Decodes a call's response ids to pieces (None when nothing can). Thread-safe."""

    def __init__(self, tokenizer: str | None = None) -> None:
        self._name = tokenizer
        self._tokenizer: Any = None
        self._failed = False
        self._lock = threading.Lock()

    def _hf(self) -> Any:
        with self._lock:
            if self._tokenizer is None and not self._failed and self._name:
                try:
                    from transformers import AutoTokenizer

                    self._tokenizer = AutoTokenizer.from_pretrained(self._name)
                except Exception as e:  # missing package, unknown name: show ids instead
                    log.warning("dashboard: cannot load tokenizer %r: %s", self._name, e)
                    self._failed = True
            return self._tokenizer

    def pieces(self, call: LLMCall) -> tuple[list[str] | None, str]:
        """The pieces of ``call``'s response ids and what decoded them."""
        ids = call.response_token_ids
        if ids is None:
            return None, "none"
        from boltrl.testing import TEMPLATE_HASH

        if call.template_hash == TEMPLATE_HASH:
            return _bytes_pieces(ids), "scripted-bytes"
        tok = self._hf()
        if tok is None:
            return None, "none"
        toks = tok.convert_ids_to_tokens(list(ids))
        return [tok.convert_tokens_to_string([t]) for t in toks], f"tokenizer {self._name}"


def token_view(call: LLMCall, decoder: TokenDecoder) -> dict[str, Any]:
    """The response tokens of a call with their logprobs (and pieces when decodable)."""
    ids = call.response_token_ids or []
    logprobs = call.response_logprobs
    pieces, how = decoder.pieces(call)
    return {
        "call_id": call.id,
        "ids": ids,
        "logprobs": logprobs,
        "pieces": pieces,
        "decoded_by": how,
        "prompt_tokens": len(call.prompt_token_ids or []),
    }
